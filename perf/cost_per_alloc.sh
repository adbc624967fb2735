#!/usr/bin/env bash
# Cost per allocation on real programs (issue 22): wall time added over the
# bare run by memtrail without stacks (--stack-depth 0), memtrail with its
# default stacks, and heaptrack, on a C++ map build (g++ -O2, no frame
# pointers, ~480k allocations), a node script (objects, JSON round trips,
# Buffers) and python3.11 importing stdlib modules; then the malloc/free
# pair at 1 and 4 threads (perf/fixtures/thread_pairs.c). Interleaved
# rounds (each round runs every configuration once), medians; ratios from
# the same run. Give two memtrail binaries to compare builds side by side.
# Run as root from the repository.
#
# Usage: perf/cost_per_alloc.sh [ROUNDS [MEMTRAIL...]]   (default 5, this build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
if [ $# -eq 0 ]; then
  cargo build --release --quiet
  set -- "$PWD/target/release/memtrail"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
g++ -O2 -o "$work/cxx_map" perf/fixtures/cxx_map.cc
cc -O2 -pthread -o "$work/thread_pairs" perf/fixtures/thread_pairs.c
cp perf/fixtures/node_work.js "$work/"
python3 - "$rounds" "$work" "$@" <<'PY'
import os, statistics, subprocess, sys, time

rounds, work, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
py = "/usr/bin/python3.11" if os.path.exists("/usr/bin/python3.11") else "python3.11"
workloads = {
    "C++ std::map<std::string, std::vector<int>>, 480k allocations": [f"{work}/cxx_map", "68500"],
    "node (objects, JSON, Buffers)": ["node", f"{work}/node_work.js"],
    "python3.11 importing stdlib modules": [py, "-c", "import json, decimal, email.parser, http.client, argparse, asyncio, xml.dom.minidom, sqlite3, csv"],
}
configs = {"bare": lambda c: c, "heaptrack": lambda c: ["heaptrack", "-o", f"{work}/ht", *c]}
for i, b in enumerate(bins):
    tag = f" #{i + 1}" if len(bins) > 1 else ""
    configs[f"memtrail{tag} -S0"] = lambda c, b=b: [b, "run", "-q", "--force", "--stack-depth", "0", "-o", f"{work}/p.json", "--", *c]
    configs[f"memtrail{tag}"] = lambda c, b=b: [b, "run", "-q", "--force", "-o", f"{work}/p.json", "--", *c]

def wall(cmd):
    t = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - t

def rate(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return next(float(l) for l in out.split("\n") if l.strip().replace(".", "").isdigit())

print(f"load before: {open('/proc/loadavg').read().split()[:3]}; binaries: {bins}")
res = {}
for _ in range(rounds):
    for name, cmd in workloads.items():
        for k, make in configs.items():
            res.setdefault((name, k), []).append(wall(make(cmd)))
pairs = {}
for _ in range(rounds):
    for threads in (1, 4):
        cmd = [f"{work}/thread_pairs", str(threads), str(400000 // threads)]
        for k, make in configs.items():
            pairs.setdefault((threads, k), []).append(rate(make(cmd)))
print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
mem = [k for k in configs if k.startswith("memtrail")]
print(f"\n### Wall time added over the bare run (seconds, median of {rounds} interleaved rounds)")
print("| workload | bare | " + " | ".join(["heaptrack", *mem]) + " | " + " | ".join(f"{k} / heaptrack" for k in mem) + " |")
print("|---|" + "---:|" * (2 + 2 * len(mem)))
for name in workloads:
    m = {k: statistics.median(res[(name, k)]) for k in configs}
    add = {k: m[k] - m["bare"] for k in configs}
    cells = " | ".join(f"+{add[k]:.2f}" for k in ["heaptrack", *mem])
    ratios = " | ".join(f"{add[k] / add['heaptrack']:.1f}x" for k in mem)
    print(f"| {name} | {m['bare']:.2f} | {cells} | {ratios} |")
print(f"\n### malloc/free pair: time added per pair, all threads together (µs; 400k pairs; median of {rounds})")
print("| threads | " + " | ".join(["heaptrack", *mem]) + " |")
print("|---:|" + "---:|" * (1 + len(mem)))
for threads in (1, 4):
    m = {k: statistics.median(pairs[(threads, k)]) for k in configs}
    cells = " | ".join(f"{(1 / m[k] - 1 / m['bare']) * 1e6:.2f}" for k in ["heaptrack", *mem])
    print(f"| {threads} | {cells} |")
PY
