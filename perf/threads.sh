#!/usr/bin/env bash
# Allocation throughput of 1 to 16 threads (issue 17, part 1): pairs/s of
# perf/fixtures/thread_pairs (THREADS threads released together, PAIRS
# malloc/free pairs each), bare, under `memtrail run --event-rings shared`
# and `--event-rings per-cpu`, and under heaptrack; interleaved rounds
# (each round runs every configuration once), medians. The fixture times
# itself from the threads' release to the last one's end, so start-up and
# teardown are not in the figure. Run as root from the repository, on a
# quiet machine.
#
# Usage: perf/threads.sh [ROUNDS] [PAIRS]   (defaults 5, and 400000 pairs
# in all, split between the threads)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
pairs=${2:-400000}
cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -fno-builtin -pthread -o "$work/thread_pairs" perf/fixtures/thread_pairs.c
python3 - "$rounds" "$pairs" "$work" <<'PY'
import os, statistics, subprocess, sys

rounds, pairs, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
memtrail = os.path.abspath("target/release/memtrail")
exe = f"{work}/thread_pairs"
configs = {
    "bare": lambda c: c,
    "memtrail, shared ring": lambda c: [memtrail, "run", "-q", "--force", "--event-rings", "shared", "-o", f"{work}/p.json", "--", *c],
    "memtrail, per-CPU rings": lambda c: [memtrail, "run", "-q", "--force", "--event-rings", "per-cpu", "-o", f"{work}/p.json", "--", *c],
    "heaptrack": lambda c: ["heaptrack", "-o", f"{work}/ht", *c],
}

def rate(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    # heaptrack writes its own lines on stdout around the fixture's number.
    return next(float(l) for l in out.split("\n") if l.strip().isdigit())

print(f"## Threads: malloc/free pairs per second, all threads together (median of {rounds}; {pairs} pairs split between the threads; {os.cpu_count()} CPUs)")
print("| threads | " + " | ".join(configs) + " | per-CPU / shared | memtrail per-CPU / heaptrack |")
print("|---:|" + "---:|" * (len(configs) + 2))
for threads in (1, 2, 4, 8, 16):
    cmd = [exe, str(threads), str(pairs // threads)]
    r = {k: [] for k in configs}
    for _ in range(rounds):
        for k, make in configs.items():
            r[k].append(rate(make(cmd)))
    m = {k: statistics.median(v) for k, v in r.items()}
    cells = " | ".join(f"{m[k] / 1e6:.3f} M" for k in configs)
    per_cpu, shared = m["memtrail, per-CPU rings"], m["memtrail, shared ring"]
    print(f"| {threads} | {cells} | {per_cpu / shared:.2f}x | {per_cpu / m['heaptrack']:.2f}x |")
PY
