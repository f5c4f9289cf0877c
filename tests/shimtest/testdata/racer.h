/*
 * racer.h: another thread started from inside a call this thread is held
 * in. race starts fn on a thread of its own and waits half a second at most
 * for it to post done: a thread the shim rightly makes wait for the held
 * call still waits when race returns, and the held call goes on.
 */
#ifndef SHIMTEST_RACER_H
#define SHIMTEST_RACER_H

#include <pthread.h>
#include <semaphore.h>
#include <time.h>

/* Whether the thread started (then *thread is to be joined). */
static int race(pthread_t *thread, void *(*fn)(void *), sem_t *done)
{
    struct timespec until;
    if (pthread_create(thread, NULL, fn, NULL) != 0)
        return 0;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 500 * 1000 * 1000;
    if (until.tv_nsec >= 1000 * 1000 * 1000) {
        until.tv_sec++;
        until.tv_nsec -= 1000 * 1000 * 1000;
    }
    if (sem_timedwait(done, &until) == 0)
        sem_post(done); /* for the caller's own wait, if it has one */
    return 1;
}

#endif
