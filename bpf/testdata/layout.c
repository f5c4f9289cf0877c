/* Prints struct event's layout and the shared constants as the host C
 * compiler sees events.h, one "name value" line each, for layout_test.go. */
#include <stddef.h>
#include <stdio.h>

#include "../events.h"

#define FIELD(f) printf("offset.%s %zu\nsize.%s %zu\n", #f, offsetof(struct event, f), #f, sizeof(((struct event *)0)->f))
#define CONST(c) printf("const.%s %llu\n", #c, (unsigned long long)(c))

int main(void)
{
	printf("size.event %zu\n", sizeof(struct event));
	FIELD(ts_ns);
	FIELD(latency_ns);
	FIELD(args);
	FIELD(out);
	FIELD(ret);
	FIELD(pid);
	FIELD(tid);
	FIELD(type);
	FIELD(func);
	FIELD(flags);
	CONST(EVENT_API);
	CONST(EVENT_PROBE);
	CONST(EVENT_FAULT);
	CONST(EVENT_EXIT);
	CONST(EVENT_UVM_FAULT);
	CONST(EVENT_UVM_MIGRATION);
	CONST(PROBE_ALLOC);
	CONST(PROBE_FREE);
	CONST(PROBE_SYNC);
	CONST(PROBE_SPILL);
	CONST(PROBE_PROMOTE);
	CONST(PROBE_REFUSE);
	CONST(EVENT_FLAG_SPILLED);
	CONST(EVENT_FLAG_UNPAIRED);
	CONST(COOKIE_OUTARG_SHIFT);
	CONST(COOKIE_ADDR_SHIFT);
	CONST(COOKIE_COUNT_SHIFT);
	CONST(COOKIE_UNIT_SHIFT);
	CONST(EVENT_ARGS);
	return 0;
}
