/*
 * gate.h: holding a stream back. wait_gate, launched on a stream as a host
 * function, blocks that stream until open_gate writes a byte to the pipe
 * make_gate made: work queued behind it runs only then.
 */
#ifndef SHIMTEST_GATE_H
#define SHIMTEST_GATE_H

#include <stdlib.h>
#include <unistd.h>

static int gate[2];

static int make_gate(void)
{
    return pipe(gate);
}

static void wait_gate(void *arg)
{
    (void)arg;
    char c;
    if (read(gate[0], &c, 1) != 1)
        abort();
}

static int open_gate(void)
{
    return write(gate[1], "x", 1) == 1 ? 0 : -1;
}

#endif
