/*
 * A program whose main thread had an alternate signal stack when it first
 * called CUDA and removes it before exiting, as Python's faulthandler does
 * at interpreter shutdown. While it exits, another thread keeps sending the
 * main thread SIGURG, the signal Go's runtime preempts with, so that the
 * shim's work at exit runs under signals.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <spillway/cuda_runtime.h>

#define ALT_STACK_BYTES (64 * 1024)

static char alt_stack[ALT_STACK_BYTES];
static pthread_t main_thread;

static void *send_signals(void *arg)
{
    (void)arg;
    const struct timespec pause = {0, 20 * 1000};
    for (;;) {
        pthread_kill(main_thread, SIGURG);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

int main(void)
{
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof alt_stack;
    if (sigaltstack(&ss, NULL) != 0) {
        perror("sigaltstack");
        return 2;
    }

    void *p = NULL;
    printf("malloc %d\n", (int)cudaMalloc(&p, 1 << 20));
    printf("free %d\n", (int)cudaFree(p));
    fflush(stdout);

    ss.ss_flags = SS_DISABLE;
    if (sigaltstack(&ss, NULL) != 0) {
        perror("sigaltstack");
        return 2;
    }
    main_thread = pthread_self();
    pthread_t sender;
    if (pthread_create(&sender, NULL, send_signals, NULL) != 0) {
        perror("pthread_create");
        return 2;
    }
    return 0;
}
