/*
 * forker MODE [ARGS...]: uses CUDA (so that the shim's core is running),
 * forks, and in the child either calls cudaMalloc and cudaFreeAsync of the
 * parent's block (MODE "call"; the parent itself never calls cudaFreeAsync) or execs
 * ARGS (MODE "exec"). A watchdog kills a child that hangs; the parent
 * prints how the child ended.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    void *p = NULL;
    printf("parent %d\n", cudaMalloc(&p, 1 << 20));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0) {
        alarm(20); /* a hang becomes SIGALRM */
        if (!strcmp(argv[1], "exec")) {
            execv(argv[2], argv + 2);
            _exit(127);
        }
        void *q = NULL;
        cudaError_t rc = cudaMalloc(&q, 1 << 20);
        printf("child %d %d\n", rc, cudaFreeAsync(p, 0));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        printf("child killed by signal %d\n", WTERMSIG(status));
    else
        printf("child exit %d\n", WEXITSTATUS(status));
    printf("parent after fork %d\n", cudaFree(p));
    return 0;
}
