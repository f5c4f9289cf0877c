/*
 * sigcount: counts the SIGINTs it receives. Prints "ready", then, half a
 * second after the first SIGINT (time for a second one sent after it to
 * arrive), "SIGINT xN".
 */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t count;

static void on_int(int sig)
{
    (void)sig;
    count++;
}

int main(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, NULL);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 600 && count == 0; i++)
        usleep(100 * 1000);
    usleep(500 * 1000);
    printf("SIGINT x%d\n", (int)count);
    return 0;
}
