#!/usr/bin/env bash
# Oversubscription on a real GPU: runs oversubscribe.py with PyTorch under
# `spillway run --memory-limit QUOTA --oversubscribe` and checks the shim's
# SPILLWAY_REPORT line. See README.md in this directory.
#
# usage: tests/gpu/oversubscribe.sh [QUOTA]     (default 8GiB, or $GPU_CHECK_QUOTA)
#
# Prints one `SKIP: <why>` line and exits 0 where there is no NVIDIA GPU or no
# PyTorch with CUDA; otherwise exits 0 when every check passed, 1 when one
# failed, 2 on bad usage.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

case ${1:-} in
-h | --help)
	sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
	exit 0
	;;
esac
if (($# > 1)); then
	echo "usage: $0 [QUOTA]" >&2
	exit 2
fi

quota=${1:-${GPU_CHECK_QUOTA:-8GiB}}
chunk=${GPU_CHECK_CHUNK:-512MiB}
slack=${GPU_CHECK_SLACK:-256MiB}
log_level=${GPU_CHECK_LOG_LEVEL:-info}
limit_s=${GPU_CHECK_TIMEOUT:-540}
if [[ ! $limit_s =~ ^[1-9][0-9]*$ ]]; then
	echo "$0: GPU_CHECK_TIMEOUT must be a whole number of seconds, got '$limit_s'" >&2
	exit 2
fi
# GPU_CHECK_TIMEOUT bounds the whole check, build included (SECONDS counts
# from the start): the build gets what is left, and the run what is left
# after it, less the time its kill may take.
kill_grace=20
python=${PYTHON:-python3}

skip() {
	echo "SKIP: $*"
	exit 0
}

if [[ ! -e /dev/nvidiactl ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
	skip "no NVIDIA GPU (no /dev/nvidiactl, no nvidia-smi)"
fi
command -v "$python" >/dev/null 2>&1 || skip "no Python ($python not found)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The probe runs without the shim: it only asks whether PyTorch sees a GPU.
probe_status=0
"$python" "$here/oversubscribe.py" --probe --quota "$quota" --chunk "$chunk" --slack "$slack" \
	>"$tmp/probe.out" 2>"$tmp/probe.err" || probe_status=$?
if ((probe_status == 2)); then # bad arguments, explained by argparse
	cat "$tmp/probe.err" >&2
	exit 2
elif ((probe_status != 0)); then
	echo "FAIL: the readiness probe failed:"
	cat "$tmp/probe.err"
	exit 1
fi
probe=$(tail -n 1 "$tmp/probe.out")
case $probe in
ready) ;;
"SKIP: "*)
	echo "$probe"
	exit 0
	;;
*)
	echo "FAIL: unexpected answer from the readiness probe: $probe"
	cat "$tmp/probe.err"
	exit 1
	;;
esac

spillway=$root/build/bin/spillway
if [[ ! -x $spillway || ! -e $root/build/lib/libspillway.so || ! -e $root/build/lib/libspillway-core.so ]]; then
	# Nothing may be downloaded here: Go modules come from the local module
	# cache (or build/ is built elsewhere and copied along; see README.md).
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

# One line of text at exit, on standard error, that this script reads.
export SPILLWAY_REPORT=1 SPILLWAY_LOG_FORMAT=text
unset SPILLWAY_LOG_FILE SPILLWAY_DISABLE
# Spilling needs about half the quota of host memory; allow the whole quota
# unless the operator chose a limit.
export SPILLWAY_HOST_LIMIT=${SPILLWAY_HOST_LIMIT:-$quota}
# Expandable segments would allocate through cuMemCreate, beside the shim.
unset PYTORCH_CUDA_ALLOC_CONF
# Without PyTorch's cache every tensor is one cudaMalloc and every free one
# cudaFree, so what the shim holds is what the check holds; GPU_CHECK_TORCH_CACHING=1
# keeps the cache, as a training job would run.
if [[ ${GPU_CHECK_TORCH_CACHING:-0} == 1 ]]; then
	unset PYTORCH_NO_CUDA_MEMORY_CACHING
else
	export PYTORCH_NO_CUDA_MEMORY_CACHING=1
fi

log=$tmp/run.log
run_s=$((limit_s - SECONDS - kill_grace))
if ((run_s <= 0)); then
	echo "oversubscribe: FAIL: GPU_CHECK_TIMEOUT=$limit_s s spent before the run (build and setup took $SECONDS s)"
	exit 1
fi
set +e
timeout -k "$kill_grace" "$run_s" "$spillway" run --memory-limit "$quota" --oversubscribe --log-level "$log_level" -- \
	"$python" -u "$here/oversubscribe.py" --quota "$quota" --chunk "$chunk" --slack "$slack" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

failures=()
case $status in
0) ;;
124 | 137) failures+=("timed out after ${run_s} s (GPU_CHECK_TIMEOUT=${limit_s} s in all), or killed") ;;
*) failures+=("the check exited with status $status") ;;
esac
if grep -q '^SKIP: ' "$log"; then
	failures+=("the check skipped under the shim although the probe found a GPU")
fi

# The shim's summary: key=value fields (see pool.Stats.String) after `spillway:`.
field() { sed -nE "s/.*[ :]$1=([0-9]+).*/\\1/p" <<<"$2"; }
reports=$(grep -E '^spillway: .*[ :]peak_reserved=[0-9]+' "$log" || true)
echo "---- SPILLWAY_REPORT ----"
if [[ -z $reports ]]; then
	echo "no SPILLWAY_REPORT line with peak_reserved= in the output"
	failures+=("no SPILLWAY_REPORT line: the shim did not run the check, or did not report at exit")
else
	while IFS= read -r line; do
		peak=$(field peak_reserved "$line")
		cap=$(field quota "$line")
		spilled=$(field spilled_total "$line")
		promoted=$(field promoted_total "$line")
		echo "$line"
		echo "report: peak_reserved=${peak} quota=${cap:-?} spilled_total=${spilled:-?} promoted_total=${promoted:-?}"
		if [[ -n $cap ]] && ((peak > cap)); then
			failures+=("the report's peak_reserved ${peak} exceeds its quota ${cap}")
		fi
		if [[ -n $spilled ]] && ((spilled == 0)); then
			failures+=("the report shows nothing spilled")
		fi
	done <<<"$reports"
fi

# Whether the CPU reaches host granules at their addresses (README, Page-granular
# spill): oversubscribe.py's `cpu-access: STATE: ...` line, and whether the
# shim warned that the driver refused the CPU that grant (its fallback).
warned=0
if grep -qF "the CPU cannot reach host granules at their addresses" "$log"; then
	warned=1
fi
cpu_line=$(grep -E '^cpu-access: ' "$log" | tail -n 1 || true)
cpu_state=$(sed -nE 's/^cpu-access: ([a-z ]+): .*/\1/p' <<<"$cpu_line")
echo "---- CPU access to host granules ----"
[[ -n $cpu_line ]] && echo "$cpu_line"
case $cpu_state in
granted)
	wrong=()
	if ! grep -q '^PASS  cpu-access: ' "$log"; then
		wrong+=("the CPU faulted on them or read or wrote other bytes than PyTorch copied (the cpu-access line above)")
	fi
	if ((warned)); then
		wrong+=("the shim warned that the driver refused the CPU access to host granules")
	fi
	if ((${#wrong[@]} == 0)); then
		cpu_verdict="granted: PASS"
	else
		cpu_verdict="granted: FAIL ($(printf '%s; ' "${wrong[@]}" | sed 's/; $//'))"
		for w in "${wrong[@]}"; do
			failures+=("the driver grants the CPU host granules, but $w")
		done
	fi
	;;
refused)
	if ((warned)); then
		cpu_verdict="refused by the driver (fallback warning seen): the documented fallback, a finding, not a failure"
	elif [[ $log_level == error ]]; then
		cpu_verdict="refused by the driver (--log-level error hides the shim's fallback warning): a finding, not a failure"
	else
		cpu_verdict="refused by the driver, yet the shim did not warn: FAIL"
		failures+=("the CPU has no access to host granules and the shim did not warn that the driver refused it")
	fi
	;;
"not asked")
	cpu_verdict="not asked (no chunk on host granules)"
	((warned)) && cpu_verdict+="; the shim warned that the driver refused the CPU access to host granules"
	;;
mixed | failed)
	cpu_verdict="$cpu_state: FAIL (see the cpu-access line above)"
	failures+=("the CPU's access to host granules: $cpu_state")
	;;
*)
	cpu_verdict="not checked: the run ended before that step"
	((warned)) && cpu_verdict+="; the shim warned that the driver refused the CPU access to host granules"
	((status == 0)) && failures+=("oversubscribe.py printed no cpu-access line")
	;;
esac
echo "cpu access to host granules: $cpu_verdict"

if ((${#failures[@]} == 0)); then
	echo "oversubscribe: PASS (quota $quota)"
	exit 0
fi
for f in "${failures[@]}"; do
	echo "oversubscribe: FAIL: $f"
done
exit 1
