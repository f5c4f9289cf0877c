/*
 * sizearg.h: a size on a test program's command line, a decimal number of
 * bytes with an optional K, M or G (powers of 1024) after it: 512, 4K, 2M.
 */
#ifndef SHIMTEST_SIZEARG_H
#define SHIMTEST_SIZEARG_H

#include <stddef.h>
#include <stdlib.h>

static size_t size_arg(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K': v <<= 10; break;
    case 'M': v <<= 20; break;
    case 'G': v <<= 30; break;
    }
    return (size_t)v;
}

#endif
