#!/usr/bin/env bash
# What Python frames cost the traced program itself (issue 25), measured
# so that other load on the machine weighs little: the CPU time
# (task-clock, perf stat) of the Python process only, under
# `memtrail run --native-only` and under `memtrail run` (Python frames),
# in interleaved rounds. The BPF programs run in the process's context at
# each allocation, so its CPU time holds their whole cost; waiting for a
# CPU (other captures, builds) and memtrail's own threads are left out.
# Same workload as perf/python_frames.sh (perf/fixtures/python_churn.py,
# PYTHONMALLOC=malloc unless PYMALLOC=1).
#
# Usage: perf/python_frames_cpu.sh [PYTHON=/usr/bin/python3.11] [OPS=200000] [DEPTH=10] [ROUNDS=5]
#        (MEMTRAIL=path picks a memtrail build; default: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
python_churn_from_args "$@"
rounds=$n
memtrail_from_env
scratch_dir out
# msec of task-clock of the workload under memtrail with the given flags.
# A round that failed (memtrail's or the workload's exit status) prints
# nothing after the name, and its stderr on ours.
cpu() {
	rm -f "$out/stat"
	if "$mt" run -q --force -o "$out/p.json" "$@" -- \
		perf stat -x, -e task-clock -o "$out/stat" -- "${work[@]}" 2>"$out/err"; then
		awk -F, '/task-clock/ { print $1 }' "$out/stat"
	else
		echo "round failed (exit $?): $(tail -3 "$out/err")" >&2
	fi
}
for r in $(seq "$rounds"); do
	echo "native-only $(cpu --native-only)"
	echo "python-frames $(cpu)"
done | python3 -c '
import statistics, sys
t = {}
for line in sys.stdin:
    name, *ms = line.split()
    try:
        sec = float(ms[0]) / 1000
    except (IndexError, ValueError):
        sec = 0
    # Some rounds, of either mode, get a count of a few ms for a run of
    # seconds (perf stat under memtrail, the hold of new images perhaps; not
    # understood): left out, and said.
    if sec > 0.05:
        t.setdefault(name, []).append(sec)
    else:
        print(f"{name}: a round with a task-clock count of {sec:.3f} s, left out")
for name, v in t.items():
    runs = " ".join("%.2f" % x for x in v)
    print(f"{name:14} task-clock median {statistics.median(v):7.3f} s  ({runs})")
n, p = statistics.median(t["native-only"]), statistics.median(t["python-frames"])
print(f"python frames / native-only: task-clock {p / n:.2f}x")
'
