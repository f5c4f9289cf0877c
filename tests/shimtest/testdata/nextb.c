/* nextb: the whoami that follows nexta's in the search order. */
const char *whoami(void)
{
    return "nextb";
}
