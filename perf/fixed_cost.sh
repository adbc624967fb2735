#!/usr/bin/env bash
# The fixed cost of a capture (issue 17): `memtrail run -- true` and
# `memtrail run -- python3.11 -c pass` against the bare commands and
# heaptrack, side by side in interleaved rounds, then one run's phases as
# `--log debug` prints them. The image cache is a fresh one, filled by the
# first round (the rounds after run with it, as a user's second run does).
# Run as root from the repository, on a quiet machine.
#
# Usage: perf/fixed_cost.sh [ROUNDS]   (default 10; medians)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MEMTRAIL_CACHE_DIR="$work/cache"
python3 - "$rounds" "$work" <<'PY'
import os, statistics, subprocess, sys, time

rounds, work = int(sys.argv[1]), sys.argv[2]
memtrail = os.path.abspath("target/release/memtrail")
commands = [("true", ["/usr/bin/true"]), ("python3.11 -c pass", ["/usr/bin/python3.11", "-c", "pass"])]
configs = {
    "bare": lambda c: c,
    "memtrail": lambda c: [memtrail, "run", "-q", "--force", "-o", f"{work}/p.json", "--", *c],
    "memtrail --unwind fp": lambda c: [memtrail, "run", "-q", "--force", "--unwind", "fp", "-o", f"{work}/p.json", "--", *c],
    "heaptrack": lambda c: ["heaptrack", "-o", f"{work}/ht", *c],
}

def wall(cmd):
    t = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.monotonic() - t

print(f"## Fixed cost (ms, median of {rounds}, interleaved)")
print("| command | " + " | ".join(configs) + " | memtrail over bare |")
print("|---|" + "---:|" * (len(configs) + 1))
for name, cmd in commands:
    t = {k: [] for k in configs}
    for _ in range(rounds):
        for k, make in configs.items():
            t[k].append(wall(make(cmd)))
    m = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    cells = " | ".join(f"{m[k]:.0f}" for k in configs)
    print(f"| {name} | {cells} | +{m['memtrail'] - m['bare']:.0f} |")

print()
print("## Phases of one `memtrail run -- python3.11 -c pass` (--log debug)")
out = subprocess.run([memtrail, "--log", "debug", "run", "-q", "--force", "-o", f"{work}/p.json",
                      "--", "/usr/bin/python3.11", "-c", "pass"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
print("| phase | ms |")
print("|---|---:|")
for line in out.splitlines():
    if "start-up:" in line or "finish:" in line or "loaded a file ahead" in line:
        msg = line.split("DEBUG ", 1)[-1]
        ms = next((w.split('"')[1] for w in msg.split() if w.startswith("ms=")), "")
        phase = msg.split(" ms=")[0].split(" path=")[0]
        if "path=" in msg:
            phase += " (" + msg.split("path=")[1].split()[0] + ")"
        print(f"| {phase} | {ms} |")
PY
