#!/usr/bin/env bash
# The Qwen2.5-32B inference trace on a real GPU, oversubscribed: replays it
# (tests/tracetest/testdata/replay.c, against the real CUDA runtime) under
# `spillway trace` with a quota of 60% of its peak live bytes, and reports the
# bytes moved per step, the share of accesses that touched spilled memory and
# the throughput. See README.md in this directory.
#
# usage: tests/gpu/replay_trace.sh [FACTOR]   (sizes divided by FACTOR; default:
#        the smallest that fits the GPU's free memory, or $GPU_CHECK_FACTOR;
#        SPILLWAY_MIGRATE=1 in the environment: granules migrate)
#
# Prints one `SKIP: <why>` line and exits 0 where there is no NVIDIA GPU, no
# CUDA 12 runtime, no Python or no root; otherwise exits 0 when every check
# passed, 1 when one failed, 2 on bad usage.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

case ${1:-} in
-h | --help)
	sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
	exit 0
	;;
esac
if (($# > 1)); then
	echo "usage: $0 [FACTOR]" >&2
	exit 2
fi
factor=${1:-${GPU_CHECK_FACTOR:-}}
if [[ -n $factor && ! $factor =~ ^[1-9][0-9]*$ ]]; then
	echo "$0: FACTOR must be a whole number of at least 1, got '$factor'" >&2
	exit 2
fi
percent=60
touch_bytes=${GPU_CHECK_TOUCH:-65536}
limit_s=${GPU_CHECK_TIMEOUT:-540}
if [[ ! $limit_s =~ ^[1-9][0-9]*$ ]]; then
	echo "$0: GPU_CHECK_TIMEOUT must be a whole number of seconds, got '$limit_s'" >&2
	exit 2
fi
# GPU_CHECK_TIMEOUT bounds the whole check, build included (SECONDS counts
# from the start): the build gets what is left, and the run what is left
# after it, less the time its kill may take.
kill_grace=20
spill=${SPILLWAY_SPILL:-pinned}
if [[ $spill != pinned && $spill != managed ]]; then
	echo "$0: SPILLWAY_SPILL must be pinned or managed, got '$spill'" >&2
	exit 2
fi
migrate=${SPILLWAY_MIGRATE:-0}
if [[ $migrate != 0 && $migrate != 1 ]]; then
	echo "$0: SPILLWAY_MIGRATE must be 0 or 1, got '$migrate'" >&2
	exit 2
fi
python=${PYTHON:-python3}

skip() {
	echo "SKIP: $*"
	exit 0
}

if [[ ! -e /dev/nvidiactl ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
	skip "no NVIDIA GPU (no /dev/nvidiactl, no nvidia-smi)"
fi
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi to read the GPU's free memory"
command -v "$python" >/dev/null 2>&1 || skip "no Python ($python not found)"
((EUID == 0)) || skip "not root: spillway trace needs root (or CAP_BPF with CAP_PERFMON)"

# The real runtime: CUDA_HOME, the dynamic linker's cache, or PyTorch's wheel.
cudart=
for dir in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64; do
	[[ -e $dir/libcudart.so.12 ]] && cudart=$dir/libcudart.so.12 && break
done
if [[ -z $cudart ]]; then
	cudart=$(ldconfig -p 2>/dev/null | awk '/libcudart\.so\.12 / {print $NF; exit}')
fi
if [[ -z $cudart ]]; then
	cudart=$("$python" -c 'import glob, os, nvidia.cuda_runtime as m; print((glob.glob(os.path.join(list(m.__path__)[0], "lib", "libcudart.so.12")) or [""])[0])' 2>/dev/null || true)
fi
[[ -n $cudart && -e $cudart ]] || skip "no CUDA 12 runtime (libcudart.so.12) found"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

spillway=$root/build/bin/spillway
if [[ ! -x $spillway || ! -e $root/build/lib/libspillway.so || ! -e $root/build/lib/libspillway-core.so ]]; then
	if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
		PATH=$PATH:/usr/local/go/bin
	fi
	echo "building spillway (make all) ..."
	if ! GOFLAGS=${GOFLAGS:--mod=mod} GOPROXY=off timeout "$((limit_s > SECONDS ? limit_s - SECONDS : 1))" make -C "$root" all >"$tmp/build.log" 2>&1; then
		tail -n 30 "$tmp/build.log"
		echo "FAIL: building spillway failed (it needs Go, gcc and the module cache offline; see tests/gpu/README.md)"
		exit 1
	fi
fi

replay=$tmp/replay
if ! gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -I "$root/interpose/include" \
	-o "$replay" "$root/tests/tracetest/testdata/replay.c" "$cudart" -Wl,-rpath,"$(dirname "$cudart")" 2>"$tmp/gcc.err"; then
	cat "$tmp/gcc.err"
	echo "FAIL: compiling the replayer failed"
	exit 1
fi

free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | head -n 1)
host_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 | head -n 1)
if ! scaled=$("$python" "$here/replay_trace.py" scale --trace "$root/tests/traces/qwen2.5-32b-inference.trace.gz" \
	--out "$tmp/qwen.trace" --free-bytes $((free_mib << 20)) --host-bytes $((host_kib << 10)) \
	--quota-percent "$percent" ${factor:+--factor "$factor"}); then
	echo "replay-trace: FAIL: scaling the trace failed"
	exit 1
fi
if [[ ! $scaled =~ ^factor=([0-9]+)\ peak_live=([0-9]+)\ steps=([0-9]+)\ quota=([0-9]+)$ ]]; then
	echo "replay-trace: FAIL: unexpected answer from replay_trace.py scale: $scaled"
	exit 1
fi
factor=${BASH_REMATCH[1]} peak_live=${BASH_REMATCH[2]} steps=${BASH_REMATCH[3]} quota=${BASH_REMATCH[4]}
echo "gpu: $gpu, ${free_mib} MiB free; runtime $cudart"
echo "trace: sizes / $factor, peak live $peak_live bytes, $steps steps; quota $quota bytes ($percent%); SPILLWAY_SPILL=$spill SPILLWAY_MIGRATE=$migrate"

export SPILLWAY_REPORT=1 SPILLWAY_LOG_FORMAT=text SPILLWAY_OVERSUBSCRIBE=1 SPILLWAY_SPILL=$spill SPILLWAY_MIGRATE=$migrate
export SPILLWAY_MEMORY_LIMIT=$quota SPILLWAY_HOST_LIMIT=$peak_live
unset SPILLWAY_LOG_FILE SPILLWAY_DISABLE SPILLWAY_POOL
start=$(date +%s.%N)
run_s=$((limit_s - SECONDS - kill_grace))
if ((run_s <= 0)); then
	echo "replay-trace: FAIL: GPU_CHECK_TIMEOUT=$limit_s s spent before the run (build and setup took $SECONDS s)"
	exit 1
fi
set +e
timeout -k "$kill_grace" "$run_s" "$spillway" trace --interval 10s --ring-buffer 256MiB --summary-json "$tmp/summary.json" \
	--output "$tmp/view.txt" -- "$replay" "$tmp/qwen.trace" "$touch_bytes" >"$tmp/replay.out" 2>"$tmp/run.log"
status=$?
set -e
end=$(date +%s.%N)
seconds=$("$python" -c "print($end - $start)")
cat "$tmp/replay.out"
grep -E '^spillway: device' "$tmp/run.log" || true

case $status in
0) ;;
124 | 137)
	echo "replay-trace: FAIL: timed out after ${run_s} s (GPU_CHECK_TIMEOUT=${limit_s} s in all), or killed"
	tail -n 20 "$tmp/run.log"
	exit 1
	;;
*)
	echo "replay-trace: FAIL: the replay exited with status $status"
	tail -n 20 "$tmp/run.log"
	exit 1
	;;
esac

exact=
[[ $spill == pinned ]] && exact=--exact
if "$python" "$here/replay_trace.py" check --summary "$tmp/summary.json" --report-log "$tmp/run.log" \
	--replay-out "$tmp/replay.out" --steps "$steps" --quota "$quota" --factor "$factor" --seconds "$seconds" $exact; then
	echo "replay-trace: PASS (sizes / $factor, quota $percent% of the peak)"
	exit 0
fi
exit 1
