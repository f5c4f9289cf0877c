#!/bin/sh
# The whole story on simcuda: a job that needs twice its device quota runs
# under `spillway run --memory-limit 1GiB --oversubscribe --migrate`. The pool
# is in virtual memory (simcuda has it, and the quota holds more than 32
# granules), so what the quota cannot hold is spilled per 2 MiB granule, and
# --migrate moves spilled granules back at the program's device
# synchronization once frees made room (the program drives the device from
# one thread, as migration requires). The application
# (tests/shimtest/testdata/spilldemo.c) checks every byte it wrote; Spillway
# reports at exit what it pooled, spilled and moved back; simcuda's ground
# truth says how much the device really held.
# Called by `make demo` from the repository root after `make simcuda shim spillway-cmd`.
# As root it then runs the job again under `spillway trace` and prints what the
# tracing session saw.
set -eu

BUILD=${BUILD:-build}
CC=${CC:-cc}
QUOTA_MIB=1024
CHUNKS=16
CHUNK_MIB=128
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$CC" -std=c11 -O2 -Wall -Werror -Iinterpose/include -o "$out/spilldemo" \
	tests/shimtest/testdata/spilldemo.c -L"$BUILD/simcuda" -lcudart

echo "== a job needing $((CHUNKS * CHUNK_MIB)) MiB under a $QUOTA_MIB MiB quota, on a simulated 4 GiB GPU =="
echo "\$ spillway run --memory-limit ${QUOTA_MIB}MiB --oversubscribe --migrate --report -- spilldemo $CHUNKS $CHUNK_MIB"
LD_LIBRARY_PATH="$BUILD/simcuda" SIMCUDA_DEVICES=4GiB SIMCUDA_STATE_DIR="$out/state" \
	SIMCUDA_STATS_FILE="$out/stats.json" SPILLWAY_LOG_FILE="$out/spillway.log" \
	"$BUILD/bin/spillway" run --memory-limit ${QUOTA_MIB}MiB --oversubscribe --migrate --report -- \
	"$out/spilldemo" $CHUNKS $CHUNK_MIB

# field NAME FILE: the first numeric value of "NAME": or NAME= in FILE.
field() { sed -n "s/.*[ \"]$1[\"]*[=:]\([0-9]*\).*/\1/p" "$2" | head -n 1; }
mib() { echo $(($1 / 1048576)); }

report="$out/spillway.log"
echo
echo "== what Spillway did (SPILLWAY_REPORT=1; the full line follows) =="
echo "pooled:   $(field cache_hits "$report") requests served from the pool's cache, $(field device_reservations "$report") needed a new device segment; $(field syncs "$report") synchronizations forced"
echo "spilled:  $(mib "$(field spilled_total "$report")") MiB served from host memory the GPU reads in place (2 MiB host granules behind the chunks' addresses)"
echo "promoted: $(mib "$(field promoted_total "$report")") MiB moved back to the device at the cudaDeviceSynchronize after the frees (--migrate; without it spilled granules stay on the host until freed)"
echo "device:   peak reserved $(mib "$(field peak_reserved "$report")") MiB of a $(mib "$(field quota "$report")") MiB quota"
cat "$report"

stats="$out/stats.json"
peak=$(field device_bytes_peak "$stats")
echo
echo "== what the simulated GPU saw (simcuda's SIMCUDA_STATS_FILE at exit) =="
echo "device_bytes_peak:    $(mib "$peak") MiB (quota $QUOTA_MIB MiB)"
echo "device_bytes:         $(mib "$(field device_bytes "$stats")") MiB (the pool's device granules at exit, the promoted ones included)"
echo "host_physical_bytes:  $(mib "$(field host_physical_bytes "$stats")") MiB (granules still on the host)"
if [ "$peak" -le $((QUOTA_MIB * 1048576)) ]; then
	echo "the quota held: the device never held more than $QUOTA_MIB MiB for this process"
else
	echo "THE QUOTA WAS EXCEEDED" >&2
	exit 1
fi

echo
echo "== the same job, watched by an eBPF tracing session (spillway trace) =="
if [ "$(id -u)" -ne 0 ]; then
	echo "(not shown: tracing needs root, or CAP_BPF with CAP_PERFMON)"
	exit 0
fi
echo "\$ spillway trace --summary-json trace.json -- spilldemo $CHUNKS $CHUNK_MIB   (same SPILLWAY_* settings)"
LD_LIBRARY_PATH="$BUILD/simcuda" SIMCUDA_DEVICES=4GiB SIMCUDA_STATE_DIR="$out/state" \
	SPILLWAY_MEMORY_LIMIT=${QUOTA_MIB}MiB SPILLWAY_OVERSUBSCRIBE=1 SPILLWAY_MIGRATE=1 SPILLWAY_LOG_FILE="$out/spillway-traced.log" \
	"$BUILD/bin/spillway" trace --interval 1s --summary-json "$out/trace.json" -- \
	"$out/spilldemo" $CHUNKS $CHUNK_MIB >"$out/trace.out"
python3 - "$out/trace.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
mib = lambda n: n // 1048576
calls = s["calls"]
print("calls:       %d cudaMalloc, %d cudaFree, %d cudaMallocAsync, %d cudaFreeAsync, %d cudaMemcpy"
      % tuple(calls.get(f, 0) for f in ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMemcpy")))
m = s["memcpy_bytes"]
print("copied:      %d MiB host->device, %d MiB device->host, %d MiB device->device"
      % (mib(m["h2d"]), mib(m["d2h"]), mib(m["d2d"])))
p = s["pool"]
print("pool:        %d of %d allocations served from its cache" % (p["cache_hits"], p["allocs"]))
print("tiers:       %d MiB spilled to the host, %d MiB promoted back" % (mib(s["spill_bytes"]), mib(s["promote_bytes"])))
a = s["accesses"]
print("accesses:    %d of the job's %d copies and memsets touched spilled memory (%d of %d MiB)"
      % (a["spilled"], a["total"], mib(a["spilled_bytes"]), mib(a["bytes"])))
print("page faults: %d on the CPU, %d of them on spilled memory, which only the GPU reads here"
      % (s["page_faults"]["total"], s["page_faults"]["spilled"]))
print("drops:       %d records lost" % s["drops"])
PY
