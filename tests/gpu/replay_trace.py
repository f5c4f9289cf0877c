#!/usr/bin/env python3
"""Helper of replay_trace.sh: scales the Qwen2.5-32B inference trace to fit a
GPU, and checks and reports what `spillway trace` measured of its replay.

  replay_trace.py scale --trace GZ --out FILE --free-bytes N --host-bytes H
                        --quota-percent P [--factor F]
      writes the trace with every size divided by the factor (the smallest
      whole number for which the scaled peak's quota share fits in 90% of the
      free device memory N and the rest in half the available host memory H,
      unless --factor is given) and prints "factor=F peak_live=B steps=S quota=Q".
  replay_trace.py check --summary JSON --report-log LOG --replay-out OUT
                        --steps S --quota Q --factor F --seconds T [--exact]
      checks the session against the replayer's own counts and the shim's
      SPILLWAY_REPORT line, prints the figures, and exits 1 on a failed check.

Only the standard library is used.
"""
import argparse
import gzip
import json
import math
import re
import sys

ALIGN = 512  # the trace's peak live bytes round each size up to this


def scaled_ops(path, factor):
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.startswith("#"):
                continue
            fields = line.split()
            if fields and fields[0] in ("a", "A"):
                fields[2] = str(-(-int(fields[2]) // factor))
            yield fields


def trace_figures(path, factor):
    live = peak = steps = 0
    sizes = {}
    for fields in scaled_ops(path, factor):
        kind = fields[0]
        if kind in ("a", "A"):
            n = -(-int(fields[2]) // ALIGN) * ALIGN
            sizes[fields[1]] = n
            live += n
            peak = max(peak, live)
        elif kind in ("f", "F"):
            live -= sizes.pop(fields[1])
        elif kind == "s":
            steps += 1
    return peak, steps


def scale(args):
    full_peak, _ = trace_figures(args.trace, 1)
    factor = args.factor
    if factor is None:
        # The device holds the quota share; leave 10% for the context.
        share = args.quota_percent / 100
        factor = max(1, math.ceil(full_peak * share / (0.9 * args.free_bytes)),
                     math.ceil(full_peak * (1 - share) / (0.5 * args.host_bytes)))
    peak, steps = trace_figures(args.trace, factor)
    with open(args.out, "w") as out:
        out.write("# spillway allocation trace v1\n")
        out.write(f"# Qwen2.5-32B inference, sizes / {factor}\n")
        for fields in scaled_ops(args.trace, factor):
            out.write(" ".join(fields) + "\n")
    quota = peak * args.quota_percent // 100
    print(f"factor={factor} peak_live={peak} steps={steps} quota={quota}")


def key_values(line):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def check(args):
    failures = []
    with open(args.summary) as f:
        summary = json.load(f)
    with open(args.replay_out) as f:
        did = {}
        for line in f:
            if line.startswith("steps="):
                did = key_values(line)
    if not did:
        failures.append("the replayer printed no steps= line")
    reports = []
    with open(args.report_log, errors="replace") as f:
        for line in f:
            if re.match(r"^spillway: device \d+: .*peak_reserved=", line):
                reports.append(key_values(line.split(":", 2)[2]))
    if len(reports) != 1:
        failures.append(f"want one SPILLWAY_REPORT line, found {len(reports)}")
    rep = reports[0] if reports else {}

    acc = summary["accesses"]
    steps = summary["steps"]
    moved = summary["moved_bytes"]
    if summary["drops"]:
        failures.append(f"{summary['drops']} records dropped: repeat with a larger --ring-buffer")
    if rep.get("refused", 0) or summary["pool"]["refusals"]:
        failures.append(f"refusals: report {rep.get('refused')}, trace {summary['pool']['refusals']}")
    if rep and rep["peak_reserved"] > args.quota:
        failures.append(f"peak_reserved {rep['peak_reserved']} exceeds the quota {args.quota}")
    if not (steps == args.steps == did.get("steps")):
        failures.append(f"steps: traced {steps}, replayed {did.get('steps')}, the trace has {args.steps}")
    if rep and moved != rep["spilled_total"] + rep["promoted_total"]:
        failures.append(f"moved_bytes {moved} != spilled_total {rep['spilled_total']} + promoted_total {rep['promoted_total']}")
    if rep and rep["spilled_total"] == 0:
        failures.append("nothing spilled: the quota does not bite")
    if acc["total"] != did.get("accesses") or acc["bytes"] != did.get("access_bytes"):
        failures.append(f"accesses: traced {acc['total']} ({acc['bytes']} bytes), replayed {did.get('accesses')} ({did.get('access_bytes')} bytes)")
    if args.exact and (acc["spilled"] != did.get("spilled_accesses") or acc["spilled_bytes"] != did.get("spilled_access_bytes")):
        failures.append(f"spilled accesses: traced {acc['spilled']} ({acc['spilled_bytes']} bytes), replayer's {did.get('spilled_accesses')} ({did.get('spilled_access_bytes')} bytes)")
    # Without --exact (managed memory) spilled blocks may be promoted, so the
    # replayer's counts, taken from where each block was before its touch,
    # bound the traced ones; the touch right after a spilled allocation comes
    # before any promotion, so some must be traced.
    if not args.exact and (acc["spilled"] == 0 or acc["spilled"] > did.get("spilled_accesses", 0)
                           or acc["spilled_bytes"] > did.get("spilled_access_bytes", 0)):
        failures.append(f"spilled accesses: traced {acc['spilled']} ({acc['spilled_bytes']} bytes); want some, and at most "
                        f"the replayer's {did.get('spilled_accesses')} ({did.get('spilled_access_bytes')} bytes)")

    per_step = summary["moved_bytes_per_step"] or 0
    print(f"trace: Qwen2.5-32B inference, sizes / {args.factor}, quota {args.quota} bytes")
    print(f"steps: {steps} in {args.seconds:.1f} s: {steps / args.seconds:.2f} steps/s" if args.seconds > 0 else f"steps: {steps}")
    if rep:
        print(f"migration: demoted {rep.get('demoted_total', 0)} bytes, promoted {rep['promoted_total']} bytes")
    print(f"moved: {moved} bytes (spilled {summary['spill_bytes']}, promoted {summary['promote_bytes']}), "
          f"{per_step:.0f} bytes per step (x{args.factor}: {per_step * args.factor:.0f})")
    frac = acc["spilled_fraction"] or 0
    frac_bytes = acc["spilled_bytes_fraction"] or 0
    print(f"spilled accesses: {acc['spilled']} of {acc['total']} ({100 * frac:.1f}%), "
          f"{acc['spilled_bytes']} of {acc['bytes']} bytes ({100 * frac_bytes:.1f}%)")
    if args.seconds > 0:
        print(f"throughput: {acc['bytes'] / args.seconds / 1e9:.2f} GB/s touched, {acc['total'] / args.seconds:.0f} accesses/s")
    for f in failures:
        print(f"replay-trace: FAIL: {f}")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scale")
    s.add_argument("--trace", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--free-bytes", type=int, required=True)
    s.add_argument("--host-bytes", type=int, required=True)
    s.add_argument("--quota-percent", type=int, required=True)
    s.add_argument("--factor", type=int)
    c = sub.add_parser("check")
    c.add_argument("--summary", required=True)
    c.add_argument("--report-log", required=True)
    c.add_argument("--replay-out", required=True)
    c.add_argument("--steps", type=int, required=True)
    c.add_argument("--quota", type=int, required=True)
    c.add_argument("--factor", type=int, required=True)
    c.add_argument("--seconds", type=float, required=True)
    c.add_argument("--exact", action="store_true")
    args = p.parse_args()
    if args.cmd == "scale":
        if args.factor is not None and args.factor < 1:
            p.error("--factor must be at least 1")
        if args.free_bytes <= 0 or args.host_bytes <= 0 or not 0 < args.quota_percent <= 100:
            p.error("--free-bytes and --host-bytes must be positive, --quota-percent in 1..100")
        scale(args)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
