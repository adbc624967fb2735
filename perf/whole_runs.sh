#!/usr/bin/env bash
# Whole-run wall time on Debian's python3.11 (issue 12): memtrail with
# default stacks against heaptrack, interleaved (each round runs every
# configuration once), medians. Only the whole-run part of perf/unwind.sh,
# quicker to repeat; give other memtrail binaries to compare builds.
# Run as root from the repository, on a quiet machine.
#
# Usage: perf/whole_runs.sh [ROUNDS [MEMTRAIL...]]   (default 10, this build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
shift || true
. perf/lib.sh
builds_from_args "$@"
set -- "${builds[@]}"
scratch_dir work
python3 - "$rounds" "$work" "$@" <<'PY'
import statistics, subprocess, sys, time

rounds, work, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
py = "/usr/bin/python3.11"
workloads = {
    "list of 200000 strings": "x=[str(i)*3 for i in range(200000)]",
    "import stdlib modules": "import json, decimal, email.parser, http.client, argparse, asyncio, xml.dom.minidom, sqlite3, csv",
    "pass": "pass",
}
def command(who, code):
    if who == "heaptrack":
        return ["heaptrack", "-o", f"{work}/ht", py, "-c", code]
    if who == "bare":
        return [py, "-c", code]
    return [who, "run", "-q", "--force", "-o", f"{work}/p.json", "--", py, "-c", code]
who = ["bare", *bins, "heaptrack"]
res = {}
for _ in range(rounds):
    for name, code in workloads.items():
        for w in who:
            t = time.monotonic()
            subprocess.run(command(w, code), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            res.setdefault((name, w), []).append(time.monotonic() - t)
label = lambda w: w if w in ("bare", "heaptrack") else f"memtrail ({w})" if len(bins) > 1 else "memtrail"
print(f"## Whole runs on {py} (seconds, median of {rounds}, interleaved)")
print("| workload | " + " | ".join(label(w) for w in who) + " | memtrail / heaptrack |")
print("|---|" + "---:|" * (len(who) + 1))
for name in workloads:
    m = {w: statistics.median(res[(name, w)]) for w in who}
    print(f"| {name} | " + " | ".join(f"{m[w]:.3f}" for w in who) + f" | {m[bins[0]] / m['heaptrack']:.2f}x |")
PY
