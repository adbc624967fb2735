#!/usr/bin/env bash
# The malloc/free pair under the probes and under the preload shim (issue
# 22), measured only while no other BPF uprobe is attached on this host:
# another capture's system-wide probes on libc make every process (the bare
# run included) trap on malloc and free, and the probes' own mode then
# shares those traps while the shim's pays them on top, so such rounds
# favour the probes. A round starts when `bpftool link list` shows no
# uprobe_multi link, and is dropped if one appeared by its end.
# CPU time of the traced program per pair (perf/fixtures/cpu_of.c), medians
# of the rounds kept. Give several memtrail builds to compare them side by
# side: each round runs every build's configurations. Run as root from the
# repository.
#
# Usage: perf/preload_pairs.sh [ROUNDS [MEMTRAIL...]]   (default 5, this build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
. perf/lib.sh
builds_from_args "$@"
scratch_dir work
cc -O2 -pthread -o "$work/thread_pairs" perf/fixtures/thread_pairs.c
cc -O2 -o "$work/cpu_of" perf/fixtures/cpu_of.c
python3 - "$rounds" "$work" "${builds[@]}" <<'PY'
import statistics, subprocess, sys, time

rounds, work, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
PAIRS = 400000

def uprobe_links():
    out = subprocess.run(["bpftool", "link", "list"], capture_output=True, text=True).stdout
    return sum(1 for l in out.splitlines() if "type 12" in l or "uprobe_multi" in l)

def cpu(cmd):
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    return [float(l.split()[1]) for l in out.stderr.splitlines() if l.startswith("cpu_of ")][-1]

configs = {"bare": []}
for i, mt in enumerate(bins):
    tag = f" #{i + 1}" if len(bins) > 1 else ""
    run = [mt, "run", "-q", "--force", "-o", f"{work}/p.json"]
    configs.update({
        f"probes{tag} -S0": [*run, "--stack-depth", "0", "--"],
        f"probes{tag}": [*run, "--"],
        f"preload{tag} -S0": [*run, "--preload", "--stack-depth", "0", "--"],
        f"preload{tag}": [*run, "--preload", "--"],
    })
print(f"load before: {open('/proc/loadavg').read().split()[:3]}; binaries: {bins}")
res, kept, dropped = {}, 0, 0
deadline = time.monotonic() + 900
while kept < rounds and time.monotonic() < deadline:
    if uprobe_links():
        time.sleep(1)
        continue
    row = {}
    for threads in (1, 4):
        cmd = [f"{work}/cpu_of", f"{work}/thread_pairs", str(threads), str(PAIRS // threads)]
        for k, pre in configs.items():
            row[(threads, k)] = cpu([*pre, *cmd])
    time.sleep(0.5)  # the last run's own links close after it exits
    if uprobe_links():
        dropped += 1
        continue
    kept += 1
    for key, v in row.items():
        res.setdefault(key, []).append(v)
print(f"load after: {open('/proc/loadavg').read().split()[:3]}; rounds kept {kept}, dropped {dropped}")
med = statistics.median
print("\n| threads | " + " | ".join(k for k in configs if k != "bare") + " |")
print("|---:|" + "---:|" * (len(configs) - 1))
for threads in (1, 4):
    cells = [f"{med([(a - b) / PAIRS * 1e6 for a, b in zip(res[(threads, k)], res[(threads, 'bare')])]):.2f}"
             for k in configs if k != "bare"]
    print(f"| {threads} | " + " | ".join(cells) + " |")
PY
