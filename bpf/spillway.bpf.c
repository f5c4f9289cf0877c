//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
/* Probe programs of a tracing session.
 *
 * Every program first checks that the current process is traced (the traced
 * map, kept by user space and extended here on fork), so processes nobody asked
 * about cost one map lookup and emit nothing. Records go through one ring
 * buffer; a record that does not fit is counted in drops, never lost silently.
 *
 * CUDA API calls are counted once, at the outermost layer: a thread's first
 * probed entry opens a call, nested probed entries (the shim calling the
 * runtime, the runtime calling the driver) only deepen it, and the record is
 * emitted when the outermost call returns. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"

/* libbpf 1.1 names five argument registers; the sixth is r9 on x86-64. */
#ifndef PT_REGS_PARM6
#define PT_REGS_PARM6(x) ((x)->r9)
#endif

/* GPL-compatible, as the helpers that read user and kernel memory require. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Keeps struct event in the BTF so bpf2go emits its Go type. */
const struct event *unused_event __attribute__((unused));

/* Records are submitted without waking the reader, which polls, until this
 * much is waiting: a wakeup per record would cost more than the record. */
const volatile __u64 wakeup_bytes = 1 << 20;

/* Offset of child_pid in sched:sched_process_fork, read from tracefs. */
const volatile __u32 fork_child_pid_offset = 20;

/* nvidia-uvm uvm_perf_event_notify payloads; set per driver version. */
const volatile __u32 uvm_event_fault = 6;
const volatile __u32 uvm_event_migration = 7;
const volatile __u32 uvm_fault_proc_offset = 8;
const volatile __u32 uvm_migration_dst_offset = 16;
const volatile __u32 uvm_migration_src_offset = 20;
const volatile __u32 uvm_migration_address_offset = 32;
const volatile __u32 uvm_migration_bytes_offset = 40;
const volatile __u32 uvm_migration_cause_offset = 56;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);  /* tgid, or the tid of a thread of a traced process */
	__type(value, __u8);
} traced SEC(".maps");

/* A thread's open API call. */
struct call {
	__u64 ts_ns;
	__u64 args[EVENT_ARGS];
	__u64 cookie;
	__u32 depth;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* pid_tgid */
	__type(value, struct call);
} calls SEC(".maps");

struct spill_key {
	__u32 tgid;
	__u32 pad;
	__u64 ptr;
};

/* Spilled allocations by start address, so promote and free find the size. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct spill_key);
	__type(value, __u64);
} spilled SEC(".maps");

/* Spilled ranges as aligned power-of-two blocks, for lookups by address. The
 * tgid is the first 32 bits of every prefix, so a match is always in the
 * faulting process. */
struct range_key {
	__u32 prefixlen;
	__u32 tgid;
	__u64 addr_be;
};

#define MAX_RANGE_BLOCKS 128

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct range_key);
	__type(value, __u64); /* start of the spilled allocation */
} spilled_ranges SEC(".maps");

/* nvidia-uvm va_space events pointer -> tgid, learned in process context so
 * that faults serviced by the driver's bottom-half threads are attributed. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
} uvm_spaces SEC(".maps");

static __always_inline int is_traced(__u32 tgid)
{
	return bpf_map_lookup_elem(&traced, &tgid) != NULL;
}

static __always_inline struct event *reserve(void)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&drops, &zero);
		if (n)
			*n += 1;
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	return e;
}

static __always_inline void submit(struct event *e)
{
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(e, flags);
}

static __always_inline void fill_ids(struct event *e, __u64 pid_tgid)
{
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
}

static __always_inline int enter_call(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_traced(pid_tgid >> 32))
		return 0;

	struct call *c = bpf_map_lookup_elem(&calls, &pid_tgid);
	if (!c) {
		struct call fresh = {};
		bpf_map_update_elem(&calls, &pid_tgid, &fresh, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&calls, &pid_tgid);
		if (!c)
			return 0;
	}
	if (c->depth == 0) {
		c->ts_ns = bpf_ktime_get_ns();
		c->cookie = bpf_get_attach_cookie(ctx);
		c->args[0] = PT_REGS_PARM1(ctx);
		c->args[1] = PT_REGS_PARM2(ctx);
		c->args[2] = PT_REGS_PARM3(ctx);
		c->args[3] = PT_REGS_PARM4(ctx);
		c->args[4] = PT_REGS_PARM5(ctx);
		c->args[5] = PT_REGS_PARM6(ctx);
	}
	c->depth++;
	return 0;
}

static __always_inline int in_spilled(__u32 tgid, __u64 addr)
{
	struct range_key key = {
		.prefixlen = 32 + 64,
		.tgid = tgid,
		.addr_be = __builtin_bswap64(addr),
	};
	return bpf_map_lookup_elem(&spilled_ranges, &key) != NULL;
}

/* Whether an address range a copy or memset names (see COOKIE_ADDR_*) has
 * its first or last byte in spilled memory. The shim spills whole
 * allocations, so a range within one is found by either end. */
static __always_inline int touches_spilled(__u32 tgid, __u64 cookie, const __u64 *args)
{
	__u64 addrs = (cookie >> COOKIE_ADDR_SHIFT) & COOKIE_ADDR_MASK;
	__u64 count = (cookie >> COOKIE_COUNT_SHIFT) & COOKIE_COUNT_MASK;
	if (addrs == 0 || count == 0 || count > EVENT_ARGS)
		return 0;
	__u64 bytes = 0;
	for (int i = 0; i < EVENT_ARGS; i++)
		if (i == count - 1)
			bytes = args[i];
	bytes <<= (cookie >> COOKIE_UNIT_SHIFT) & COOKIE_UNIT_MASK;
	if (bytes == 0)
		return 0;
	for (int i = 0; i < EVENT_ARGS; i++) {
		if (!(addrs & (1ULL << i)))
			continue;
		if (in_spilled(tgid, args[i]) || in_spilled(tgid, args[i] + bytes - 1))
			return 1;
	}
	return 0;
}

static __always_inline int exit_call(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!is_traced(pid_tgid >> 32))
		return 0;

	struct call *c = bpf_map_lookup_elem(&calls, &pid_tgid);
	if (!c || c->depth == 0)
		return 0; /* entered before the session attached */
	if (--c->depth != 0)
		return 0;

	struct event *e = reserve();
	if (!e)
		return 0;
	__u64 cookie = c->cookie;
	e->type = EVENT_API;
	e->func = cookie & COOKIE_FUNC_MASK;
	e->ts_ns = c->ts_ns;
	e->latency_ns = bpf_ktime_get_ns() - c->ts_ns;
	for (int i = 0; i < EVENT_ARGS; i++)
		e->args[i] = c->args[i];
	e->ret = PT_REGS_RC(ctx);
	if (bpf_get_attach_cookie(ctx) != cookie)
		e->flags |= EVENT_FLAG_UNPAIRED;
	__u64 outarg = (cookie >> COOKIE_OUTARG_SHIFT) & COOKIE_OUTARG_MASK;
	if (outarg > 0 && outarg <= EVENT_ARGS && e->ret == 0)
		bpf_probe_read_user(&e->out, sizeof(e->out), (void *)c->args[outarg - 1]);
	if (touches_spilled(pid_tgid >> 32, cookie, e->args))
		e->flags |= EVENT_FLAG_SPILLED;
	fill_ids(e, pid_tgid);
	submit(e);
	return 0;
}

/* Largest power of two not above x (x > 0). */
static __always_inline __u64 floor_pow2(__u64 x)
{
	x |= x >> 1;
	x |= x >> 2;
	x |= x >> 4;
	x |= x >> 8;
	x |= x >> 16;
	x |= x >> 32;
	return x - (x >> 1);
}

/* log2 of a power of two, as the population count of p-1. */
static __always_inline __u32 log2_pow2(__u64 p)
{
	__u64 x = p - 1;
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (x * 0x0101010101010101ULL) >> 56;
}

/* Adds or removes [start, start+size) of tgid in spilled_ranges, as the
 * largest aligned power-of-two blocks that tile it (at most 128). A block the
 * full trie has no room for is left out, so faults in it are not counted as
 * spilled; the removal deletes every block, whether it was added or not. */
static __always_inline void update_ranges(__u32 tgid, __u64 start, __u64 size, int add)
{
	__u64 base = start;
	__u64 end = start + size;
	if (end < start)
		end = ~0ULL;
	for (int i = 0; i < MAX_RANGE_BLOCKS; i++) {
		if (start >= end)
			break;
		__u64 block = floor_pow2(end - start);
		__u64 align = start & (~start + 1);
		if (align && align < block)
			block = align;
		struct range_key key = {
			.prefixlen = 32 + 64 - log2_pow2(block),
			.tgid = tgid,
			.addr_be = __builtin_bswap64(start),
		};
		if (add)
			bpf_map_update_elem(&spilled_ranges, &key, &base, BPF_ANY);
		else
			bpf_map_delete_elem(&spilled_ranges, &key);
		start += block;
	}
}

static __always_inline void track_spill(__u32 tgid, __u32 probe, __u64 ptr, __u64 size)
{
	struct spill_key key = {.tgid = tgid, .ptr = ptr};
	if (probe == PROBE_SPILL) {
		if (size == 0 || bpf_map_lookup_elem(&spilled, &key))
			return;
		/* Promote and free find a range only through its spilled entry:
		 * a range added without one (the map full) would never go. */
		if (bpf_map_update_elem(&spilled, &key, &size, BPF_NOEXIST))
			return;
		update_ranges(tgid, ptr, size, 1);
		return;
	}
	/* PROBE_PROMOTE or PROBE_FREE: forget the range if it was spilled. */
	__u64 *known = bpf_map_lookup_elem(&spilled, &key);
	if (!known)
		return;
	__u64 spilled_size = *known;
	update_ranges(tgid, ptr, spilled_size, 0);
	bpf_map_delete_elem(&spilled, &key);
}

static __always_inline int fire_probe_point(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	if (!is_traced(tgid))
		return 0;

	__u32 probe = bpf_get_attach_cookie(ctx);
	__u64 ptr = PT_REGS_PARM1(ctx);
	__u64 size = PT_REGS_PARM2(ctx);
	/* A block in device memory freed (tier 0) ends no spilled range, even
	 * one reported at its address: host granules mapped under a block in
	 * virtual memory are reported, and returned, as ranges of their own. */
	int device_free = probe == PROBE_FREE && (__s32)PT_REGS_PARM4(ctx) == 0;
	if ((probe == PROBE_SPILL || probe == PROBE_PROMOTE || probe == PROBE_FREE) && !device_free)
		track_spill(tgid, probe, ptr, size);

	struct event *e = reserve();
	if (!e)
		return 0;
	e->type = EVENT_PROBE;
	e->func = probe;
	e->ts_ns = bpf_ktime_get_ns();
	e->args[0] = ptr;
	e->args[1] = size;
	e->args[2] = PT_REGS_PARM3(ctx);
	e->args[3] = PT_REGS_PARM4(ctx);
	e->args[4] = PT_REGS_PARM5(ctx);
	fill_ids(e, pid_tgid);
	submit(e);
	return 0;
}

/* Each uprobe program comes twice: for a link per symbol, and for one
 * uprobe_multi link per file (Linux 6.6), which detaches far faster. */
SEC("uprobe")
int api_enter(struct pt_regs *ctx) { return enter_call(ctx); }

SEC("uretprobe")
int api_exit(struct pt_regs *ctx) { return exit_call(ctx); }

SEC("uprobe")
int probe_point(struct pt_regs *ctx) { return fire_probe_point(ctx); }

SEC("uprobe.multi")
int api_enter_multi(struct pt_regs *ctx) { return enter_call(ctx); }

SEC("uretprobe.multi")
int api_exit_multi(struct pt_regs *ctx) { return exit_call(ctx); }

SEC("uprobe.multi")
int probe_point_multi(struct pt_regs *ctx) { return fire_probe_point(ctx); }

/* Layout of exceptions:page_fault_user (x86), as its tracefs format file gives it. */
struct page_fault_ctx {
	__u64 common;
	__u64 address;
	__u64 ip;
	__u64 error_code;
};

SEC("tracepoint/exceptions/page_fault_user")
int page_fault(struct page_fault_ctx *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	if (!is_traced(tgid))
		return 0;

	struct range_key key = {
		.prefixlen = 32 + 64,
		.tgid = tgid,
		.addr_be = __builtin_bswap64(ctx->address),
	};
	__u64 *base = bpf_map_lookup_elem(&spilled_ranges, &key);

	struct event *e = reserve();
	if (!e)
		return 0;
	e->type = EVENT_FAULT;
	e->ts_ns = bpf_ktime_get_ns();
	e->args[0] = ctx->address;
	e->args[1] = ctx->ip;
	e->args[2] = ctx->error_code;
	if (base) {
		e->flags |= EVENT_FLAG_SPILLED;
		e->out = *base;
	}
	fill_ids(e, pid_tgid);
	submit(e);
	return 0;
}

/* A traced process's children are traced too. Threads are added as well (the
 * tracepoint does not tell them apart) and removed when they exit; a thread id
 * never equals the tgid of another live process, so this is harmless. */
SEC("tracepoint/sched/sched_process_fork")
int process_fork(void *ctx)
{
	__u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!is_traced(parent))
		return 0;
	__s32 child = 0;
	if (bpf_probe_read_kernel(&child, sizeof(child), ctx + (fork_child_pid_offset & 0xff)))
		return 0;
	__u32 key = child;
	__u8 one = 1;
	bpf_map_update_elem(&traced, &key, &one, BPF_ANY);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int process_exit(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 tid = (__u32)pid_tgid;
	if (!is_traced(tgid)) {
		if (tid != tgid)
			bpf_map_delete_elem(&traced, &tid);
		return 0;
	}
	bpf_map_delete_elem(&calls, &pid_tgid);
	if (tid != tgid) {
		bpf_map_delete_elem(&traced, &tid);
		return 0;
	}
	bpf_map_delete_elem(&traced, &tgid);
	struct event *e = reserve();
	if (!e)
		return 0;
	e->type = EVENT_EXIT;
	e->ts_ns = bpf_ktime_get_ns();
	fill_ids(e, pid_tgid);
	submit(e);
	return 0;
}

/* nvidia-uvm's single notification point for faults and migrations:
 * uvm_perf_event_notify(va_space_events, event_id, event_data). Optional; the
 * loader attaches it only where the module and kprobes exist. */
SEC("kprobe/uvm_perf_event_notify")
int uvm_event(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u64 space = PT_REGS_PARM1(ctx);
	__u32 id = PT_REGS_PARM2(ctx);
	void *data = (void *)PT_REGS_PARM3(ctx);

	if (id != uvm_event_fault && id != uvm_event_migration)
		return 0;
	if (is_traced(tgid)) {
		bpf_map_update_elem(&uvm_spaces, &space, &tgid, BPF_ANY);
	} else {
		__u32 *owner = bpf_map_lookup_elem(&uvm_spaces, &space);
		if (!owner)
			return 0;
		tgid = *owner;
		pid_tgid = (__u64)tgid << 32;
	}

	struct event *e = reserve();
	if (!e)
		return 0;
	e->ts_ns = bpf_ktime_get_ns();
	if (id == uvm_event_fault) {
		e->type = EVENT_UVM_FAULT;
		__u32 proc = 0;
		bpf_probe_read_kernel(&proc, sizeof(proc), data + (uvm_fault_proc_offset & 0xff));
		e->args[0] = proc;
	} else {
		e->type = EVENT_UVM_MIGRATION;
		__u32 dst = 0, src = 0, cause = 0;
		bpf_probe_read_kernel(&dst, sizeof(dst), data + (uvm_migration_dst_offset & 0xff));
		bpf_probe_read_kernel(&src, sizeof(src), data + (uvm_migration_src_offset & 0xff));
		bpf_probe_read_kernel(&e->args[2], sizeof(__u64), data + (uvm_migration_address_offset & 0xff));
		bpf_probe_read_kernel(&e->args[3], sizeof(__u64), data + (uvm_migration_bytes_offset & 0xff));
		bpf_probe_read_kernel(&cause, sizeof(cause), data + (uvm_migration_cause_offset & 0xff));
		e->args[0] = dst;
		e->args[1] = src;
		e->args[4] = cause;
	}
	fill_ids(e, pid_tgid);
	submit(e);
	return 0;
}
