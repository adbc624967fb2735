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
# Added times and ratios are taken within each round (paired) and then
# summarized by their median over the rounds: on a shared machine the
# bare run itself moves by 5x between rounds.
#
# Usage: perf/cost_per_alloc.sh [ROUNDS [MEMTRAIL...]]   (default 5, this build)
#   WORKLOADS=cxx,node,python,pairs picks the parts to run (default all).
#   Each binary runs with the probes and with the preload shim (`--preload`,
#   issue 22), each with and without stacks; PRELOAD=0 leaves the shim out.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
. perf/lib.sh
builds_from_args "$@"
set -- "${builds[@]}"
scratch_dir work
g++ -O2 -o "$work/cxx_map" perf/fixtures/cxx_map.cc
cc -O2 -pthread -o "$work/thread_pairs" perf/fixtures/thread_pairs.c
cc -O2 -o "$work/cpu_of" perf/fixtures/cpu_of.c
cp perf/fixtures/node_work.js "$work/"
python3 - "$rounds" "$work" "$@" <<'PY'
import os, statistics, subprocess, sys, time

rounds, work, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
py = "/usr/bin/python3.11" if os.path.exists("/usr/bin/python3.11") else "python3.11"
parts = os.environ.get("WORKLOADS", "cxx,node,python,pairs").split(",")
preload = os.environ.get("PRELOAD", "1") != "0"
workloads = {
    "C++ std::map<std::string, std::vector<int>>, 480k allocations": ("cxx", [f"{work}/cxx_map", "68500"]),
    "node (objects, JSON, Buffers)": ("node", ["node", f"{work}/node_work.js"]),
    "python3.11 importing stdlib modules": ("python", [py, "-c", "import json, decimal, email.parser, http.client, argparse, asyncio, xml.dom.minidom, sqlite3, csv"]),
}
workloads = {name: [f"{work}/cpu_of", *cmd] for name, (part, cmd) in workloads.items() if part in parts}
# heaptrack traces only the process it starts (its preload library takes
# itself out of LD_PRELOAD): it runs the workload itself, not cpu_of, whose
# child it would not see. Its CPU column is then not measured (nan).
configs = {"bare": lambda c: c, "heaptrack": lambda c: ["heaptrack", "-o", f"{work}/ht", *c[1:]]}
for i, b in enumerate(bins):
    tag = f" #{i + 1}" if len(bins) > 1 else ""
    configs[f"memtrail{tag} -S0"] = lambda c, b=b: [b, "run", "-q", "--force", "--stack-depth", "0", "-o", f"{work}/p.json", "--", *c]
    configs[f"memtrail{tag}"] = lambda c, b=b: [b, "run", "-q", "--force", "-o", f"{work}/p.json", "--", *c]
    if preload:
        configs[f"memtrail{tag} --preload -S0"] = lambda c, b=b: [b, "run", "-q", "--force", "--preload", "--stack-depth", "0", "-o", f"{work}/p.json", "--", *c]
        configs[f"memtrail{tag} --preload"] = lambda c, b=b: [b, "run", "-q", "--force", "--preload", "-o", f"{work}/p.json", "--", *c]

def wall(cmd):
    """Wall time of cmd, and the CPU time of the workload (cpu_of's line)."""
    t = time.monotonic()
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    t = time.monotonic() - t
    cpu = [float(l.split()[1]) for l in out.stderr.splitlines() if l.startswith("cpu_of ")]
    return t, cpu[-1] if cpu else float("nan")

def rate(cmd):
    """thread_pairs' pairs per second, and its CPU time (cpu_of's line)."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    pps = next(float(l) for l in out.stdout.split("\n") if l.strip().replace(".", "").isdigit())
    cpu = [float(l.split()[1]) for l in out.stderr.splitlines() if l.startswith("cpu_of ")]
    return pps, cpu[-1] if cpu else float("nan")

print(f"load before: {open('/proc/loadavg').read().split()[:3]}; binaries: {bins}")
res = {}
for _ in range(rounds):
    for name, cmd in workloads.items():
        for k, make in configs.items():
            t, cpu = wall(make(cmd))
            res.setdefault((name, k), []).append(t)
            res.setdefault((name, k, "cpu"), []).append(cpu)
pairs = {}
for _ in range(rounds if "pairs" in parts else 0):
    for threads in (1, 4):
        cmd = [f"{work}/cpu_of", f"{work}/thread_pairs", str(threads), str(400000 // threads)]
        for k, make in configs.items():
            pps, cpu = rate(make(cmd))
            pairs.setdefault((threads, k), []).append(pps)
            pairs.setdefault((threads, k, "cpu"), []).append(cpu)
print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
mem = [k for k in configs if k.startswith("memtrail")]
med = statistics.median
def paired(rows, k, base):
    """The median over rounds of k's value over base's, within each round."""
    return med([a / b for a, b in zip(rows[k], rows[base])])
print(f"\n### Wall time added over the bare run (seconds; medians over {rounds} interleaved rounds of the per-round differences and ratios)")
shown = ["heaptrack", *mem]
extra = [f"{k} / heaptrack" for k in mem]
if len(bins) > 1:
    extra += [f"{k} / #1" for k in mem if "#1" not in k]
print("| workload | bare | " + " | ".join(shown) + " | " + " | ".join(extra) + " |")
print("|---|" + "---:|" * (1 + len(shown) + len(extra)))
for name in workloads:
    rows = {k: res[(name, k)] for k in configs}
    add = {k: [t - b for t, b in zip(rows[k], rows["bare"])] for k in configs}
    cells = " | ".join(f"+{med(add[k]):.2f}" for k in shown)
    ratios = [f"{paired(add, k, 'heaptrack'):.1f}x" for k in mem]
    if len(bins) > 1:
        ratios += [f"{paired(add, k, k.replace(k.split()[1], '#1')):.2f}x" for k in mem if "#1" not in k]
    print(f"| {name} | {med(rows['bare']):.2f} | {cells} | " + " | ".join(ratios) + " |")
print(f"\n### CPU time the workload took, added over the bare run (seconds: user + system of the traced processes, where uprobe traps and BPF programs count; the tracers' own processes excluded; medians over {rounds} rounds of the per-round differences and ratios)")
print("| workload | bare | " + " | ".join(shown) + " | " + " | ".join(extra) + " |")
print("|---|" + "---:|" * (1 + len(shown) + len(extra)))
for name in workloads:
    rows = {k: res[(name, k, "cpu")] for k in configs}
    add = {k: [t - b for t, b in zip(rows[k], rows["bare"])] for k in configs}
    cells = " | ".join(f"+{med(add[k]):.2f}" for k in shown)
    ratios = [f"{paired(add, k, 'heaptrack'):.1f}x" for k in mem]
    if len(bins) > 1:
        ratios += [f"{paired(add, k, k.replace(k.split()[1], '#1')):.2f}x" for k in mem if "#1" not in k]
    print(f"| {name} | {med(rows['bare']):.2f} | {cells} | " + " | ".join(ratios) + " |")
if pairs:
    print(f"\n### malloc/free pair: time added per pair, all threads together (µs; 400k pairs; medians over {rounds} rounds of the per-round differences)")
    print("| threads | " + " | ".join(shown) + " |")
    print("|---:|" + "---:|" * len(shown))
    for threads in (1, 4):
        r = {k: pairs[(threads, k)] for k in configs}
        cells = " | ".join(f"{med([(1 / a - 1 / b) * 1e6 for a, b in zip(r[k], r['bare'])]):.2f}" for k in shown)
        print(f"| {threads} | {cells} |")
    print(f"\n### malloc/free pair: CPU time added per pair in the traced program (µs; user + system; 400k pairs; medians over {rounds} rounds of the per-round differences)")
    print("| threads | " + " | ".join(shown) + " |")
    print("|---:|" + "---:|" * len(shown))
    for threads in (1, 4):
        r = {k: pairs[(threads, k, "cpu")] for k in configs}
        cells = " | ".join(f"{med([(a - b) / 400000 * 1e6 for a, b in zip(r[k], r['bare'])]):.2f}" for k in shown)
        print(f"| {threads} | {cells} |")
PY
