#!/bin/sh
# Builds tests/simcuda/sample_app.c against simcuda and runs it on two
# simulated 2 GiB devices, then prints simcuda's ground truth for the run.
# Called by `make demo-simcuda` from the repository root after `make simcuda`.
set -eu

BUILD=${BUILD:-build}
CC=${CC:-cc}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$CC" -std=c11 -O2 -Wall -Werror -Iinterpose/include -o "$out/sample_app" \
	tests/simcuda/sample_app.c -L"$BUILD/simcuda" -lcudart

echo "== a CUDA application on simcuda (SIMCUDA_DEVICES=2x2GiB) =="
LD_LIBRARY_PATH="$BUILD/simcuda" SIMCUDA_DEVICES=2x2GiB SIMCUDA_STATE_DIR="$out/state" \
	SIMCUDA_STATS_FILE="$out/stats.json" "$out/sample_app"

echo "== simcuda's statistics for that run (SIMCUDA_STATS_FILE) =="
sed -e 's/\],"calls"/],\n"calls"/' -e 's/},"memcpy_bytes"/},\n"memcpy_bytes"/' "$out/stats.json"
