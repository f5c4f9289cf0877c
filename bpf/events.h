/* Records the probe programs hand to user space, and the constants both sides
 * agree on. Included by spillway.bpf.c and, in a test, by a host C compiler so
 * that the layout the kernel writes can be checked against the Go decoder. */
#ifndef SPILLWAY_BPF_EVENTS_H
#define SPILLWAY_BPF_EVENTS_H

#include <linux/types.h>

/* event.type */
enum event_type {
	EVENT_API = 1,       /* an outermost CUDA API call returned */
	EVENT_PROBE = 2,     /* the shim fired one of its probe points */
	EVENT_FAULT = 3,     /* a CPU page fault in a traced process */
	EVENT_EXIT = 4,      /* a traced process exited */
	EVENT_UVM_FAULT = 5, /* nvidia-uvm serviced a GPU or CPU fault */
	EVENT_UVM_MIGRATION = 6, /* nvidia-uvm migrated pages */
};

/* event.func for EVENT_PROBE; also the attach cookie of the probe-point links. */
enum probe_point {
	PROBE_ALLOC = 1,
	PROBE_FREE = 2,
	PROBE_SYNC = 3,
	PROBE_SPILL = 4,
	PROBE_PROMOTE = 5,
	PROBE_REFUSE = 6,
};

/* event.flags */
#define EVENT_FLAG_SPILLED 0x1  /* EVENT_FAULT: the address lies in spilled memory;
                                 * EVENT_API: a device-side range of a copy or
                                 * memset touches spilled memory */
#define EVENT_FLAG_UNPAIRED 0x2 /* EVENT_API: the return did not match the entry's function */

/* Attach cookie of the API links: the function id in the low 16 bits and,
 * in bits 16..19, one plus the index of an out-pointer argument whose target
 * is read at return (zero when there is none). */
#define COOKIE_FUNC_MASK 0xffffULL
#define COOKIE_OUTARG_SHIFT 16
#define COOKIE_OUTARG_MASK 0xfULL

/* Copies and memsets also carry, in bits 20..25, a mask of the arguments that
 * are addresses to classify against the spilled ranges; in bits 26..29, one
 * plus the index of their byte-count argument; in bits 30..31, log2 of the
 * count's unit (cuMemsetD16/D32 count elements of 2 and 4 bytes). */
#define COOKIE_ADDR_SHIFT 20
#define COOKIE_ADDR_MASK 0x3fULL
#define COOKIE_COUNT_SHIFT 26
#define COOKIE_COUNT_MASK 0xfULL
#define COOKIE_UNIT_SHIFT 30
#define COOKIE_UNIT_MASK 0x3ULL

#define EVENT_ARGS 6

struct event {
	__u64 ts_ns;      /* bpf_ktime_get_ns at entry (API) or at the event */
	__u64 latency_ns; /* EVENT_API: entry to return */
	__u64 args[EVENT_ARGS]; /* arguments at entry; EVENT_FAULT: address, ip, error code */
	__u64 out;        /* EVENT_API: value behind the out-pointer argument; EVENT_FAULT: spilled range start */
	__s64 ret;        /* EVENT_API: return value */
	__u32 pid;        /* thread group id */
	__u32 tid;        /* thread id */
	__u16 type;       /* enum event_type */
	__u16 func;       /* EVENT_API: function id; EVENT_PROBE: enum probe_point */
	__u32 flags;      /* EVENT_FLAG_* */
};

#endif
