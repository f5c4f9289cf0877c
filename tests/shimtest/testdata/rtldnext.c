/* rtldnext: prints what nexta's dlsym(RTLD_NEXT, "whoami") finds: "next NAME". */
#include <stdio.h>

const char *next_whoami(void);

int main(void)
{
    printf("next %s\n", next_whoami());
    return 0;
}
