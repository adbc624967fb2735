#!/usr/bin/env bash
# What Python frames cost a capture (issue 25: target <= 1.3x the
# native-only capture): `memtrail run` of a Python workload
# (perf/fixtures/python_churn.py: OPS rounds of list and string
# allocations at the bottom of a DEPTH-frame Python stack) with Python
# frames (the default) and with --native-only, and the workload alone,
# timed by hyperfine (wall time, and user + system CPU of the whole tree,
# memtrail included). PYTHONMALLOC=malloc: every object through malloc
# (the worst case: every allocation walks the Python stack); set
# PYMALLOC=1 to keep pymalloc (only objects above 512 B reach malloc).
# Before timing, one capture of each checks the outputs: the same site
# with the workload's functions and lines, and none with --native-only.
#
# Usage: perf/python_frames.sh [PYTHON=/usr/bin/python3.11] [OPS=200000] [DEPTH=10] [RUNS=5]
#        (MEMTRAIL=path picks a memtrail build; default: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
python_churn_from_args "$@"
runs=$n
memtrail_from_env
scratch_dir out
"$mt" run -q --force -o "$out/py.json" -- "${work[@]}"
"$mt" run -q --force -o "$out/native.json" --native-only -- "${work[@]}"
PYTHONPATH=perf python3 - "$out" <<'PY'
import json, sys
from profile_stacks import stacks
out = sys.argv[1]
def leaf_sites(p):
    return [s for s in stacks(p) if any(f["function"] == "leaf" and f["module"] == "[python]" for f in s["frames"])]
py = json.load(open(f"{out}/py.json"))
native = json.load(open(f"{out}/native.json"))
sites = leaf_sites(py)
assert sites, "no site in leaf with Python frames"
top = max(sites, key=lambda s: s["allocations"])
frames = [f for f in top["frames"] if f["module"] == "[python]"]
assert [f["function"] for f in frames[:3]] == ["leaf", "site", "site"], frames[:3]
assert not leaf_sites(native), "Python frames with --native-only"
print(f'checked: {py["totals"]["allocations"]} allocations; {len(stacks(py))} stacks with Python '
      f'frames, {len(stacks(native))} without; leaf at line {frames[0]["line"]}: '
      f'{top["allocations"]} allocations')
PY
hyperfine -N --warmup 1 --runs "$runs" --export-json "$out/times.json" \
	-n alone "${work[*]}" \
	-n native-only "$mt run -q --force -o $out/n.json --native-only -- ${work[*]}" \
	-n python-frames "$mt run -q --force -o $out/p.json -- ${work[*]}" >/dev/null
python3 - "$out/times.json" <<'PY'
import json, statistics, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
for name in ("alone", "native-only", "python-frames"):
    x = r[name]
    wall = statistics.median(x["times"])
    print(f'{name:14} wall {wall:7.3f} s (min {min(x["times"]):.3f}), user+system {x["user"] + x["system"]:7.3f} s (mean)')
w = statistics.median(r["python-frames"]["times"]) / statistics.median(r["native-only"]["times"])
c = (r["python-frames"]["user"] + r["python-frames"]["system"]) / (r["native-only"]["user"] + r["native-only"]["system"])
print(f"python frames / native-only: wall {w:.2f}x, CPU {c:.2f}x")
PY
