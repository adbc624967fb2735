#!/usr/bin/env bash
# What per-process probes cost and what they spare (issue 17, part 2), side
# by side in interleaved rounds, medians:
# - a fork storm (fork_storm: 300 children in a row, 100 malloc/free pairs
#   each; and a shell running /bin/true 300 times, a fork and an exec each)
#   bare, under `memtrail run --probes system-wide` and `--probes
#   per-process`: per-process holds every new process at fork until its
#   own probes exist, so the difference over system-wide, divided by the
#   processes, is the price per process;
# - a bystander: an unrelated process's malloc/free loop (perf/fixtures/
#   alloc_loop, ns per pair) alone, and while memtrail tracks a `sleep`
#   with each kind of probes: system-wide probes trap its every call.
# Run as root from the repository, on a quiet machine.
#
# Usage: perf/fork_storm.sh [ROUNDS]   (default 7)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-7}
cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -o "$work/fork_storm" perf/fixtures/fork_storm.c
cc -O2 -o "$work/alloc_loop" perf/fixtures/alloc_loop.c
python3 - "$rounds" "$work" <<'PY'
import os, statistics, subprocess, sys, time

rounds, work = int(sys.argv[1]), sys.argv[2]
memtrail = os.path.abspath("target/release/memtrail")
n = 300
storms = {
    f"fork_storm {n} 100": [f"{work}/fork_storm", str(n), "100"],
    f"sh: /bin/true x{n}": ["/bin/sh", "-c", f"i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done"],
}
configs = {
    "bare": lambda c: c,
    "system-wide": lambda c: [memtrail, "run", "-q", "--force", "--probes", "system-wide", "-o", f"{work}/p.json", "--", *c],
    "per-process": lambda c: [memtrail, "run", "-q", "--force", "--probes", "per-process", "-o", f"{work}/p.json", "--", *c],
}

def wall(cmd):
    t = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - t

print(f"## Fork storms (ms, median of {rounds}, interleaved)")
print("| command | " + " | ".join(configs) + " | per-process over system-wide, per process |")
print("|---|" + "---:|" * (len(configs) + 1))
for name, cmd in storms.items():
    t = {k: [] for k in configs}
    for _ in range(rounds):
        for k, make in configs.items():
            t[k].append(wall(make(cmd)))
    m = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    per = (m["per-process"] - m["system-wide"]) / n
    print(f"| {name} | " + " | ".join(f"{m[k]:.0f}" for k in configs) + f" | {per:+.2f} ms |")

def bystander_ns():
    out = subprocess.run([f"{work}/alloc_loop", "200000"], capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])

print()
print(f"## A bystander's malloc/free pair (ns, median of {rounds}, interleaved)")
print("| memtrail running | ns per pair |")
print("|---|---:|")
b = {"none": [], "system-wide": [], "per-process": []}
for _ in range(rounds):
    for k in b:
        if k == "none":
            b[k].append(bystander_ns())
            continue
        run = subprocess.Popen([memtrail, "run", "-q", "--force", "--probes", k, "-o", f"{work}/b.json", "--", "/bin/sh", "-c", "echo go; read x"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # The tracked shell runs once memtrail's start-up is done.
        assert run.stdout.readline() == b"go\n"
        b[k].append(bystander_ns())
        run.communicate(b"\n")
        assert run.returncode == 0
for k, v in b.items():
    print(f"| {k} | {statistics.median(v):.0f} |")
PY
