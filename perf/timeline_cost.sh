#!/usr/bin/env bash
# The timeline's cost on the capture, end to end (issue 15: target <= 2 %
# over no timeline): `memtrail run` of an allocation-heavy workload
# (perf/fixtures/timeline_churn.c: OPS operations, about 2 events each, over
# 64 call sites whose live bytes keep moving) with the timeline (the
# default) and with --no-timeline, side by side: each round is one
# hyperfine call timing one run of each, their order alternating between
# rounds. Prints each round, then the medians and their ratio (with /
# without), of the wall time and of the CPU time (user + system, memtrail
# and the traced program together). --pressure-timeout inf: nothing is
# lost, so where the events poller (which keeps the timeline) is the
# bottleneck, the tree is paused and the cost shows in the wall time.
# Before timing, one capture of each checks the outputs: the same exact
# totals, 10 site series in the timeline's profile, none in the other.
#
# Usage: perf/timeline_cost.sh [ROUNDS=10] [OPS=1000000]
#        (MEMTRAIL=path picks a memtrail build; default: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
ops=${2:-1000000}
. perf/lib.sh
memtrail_from_env
scratch_dir out
cc -O2 -o "$out/churn" perf/fixtures/timeline_churn.c
with=("$mt" run -q --force -o "$out/with.json" --pressure-timeout inf -- "$out/churn" "$ops")
without=("$mt" run -q --force -o "$out/without.json" --pressure-timeout inf --no-timeline -- "$out/churn" "$ops")
"${with[@]}"
"${without[@]}"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
w = json.load(open(f"{out}/with.json"))
n = json.load(open(f"{out}/without.json"))
assert w["totals"]["allocations"] == n["totals"]["allocations"] > 0, "totals differ"
assert w["totals"]["peak_live_bytes"] == n["totals"]["peak_live_bytes"], "peaks differ"
t = w["timeline"]
assert len(t["sites"]) == 10, f'{len(t["sites"])} site series'
assert len(t["other_bytes"]) == len(t["tree"]["points"]) > 0
assert not n["timeline"]["tree"]["points"] and not n["timeline"]["sites"], "a timeline with --no-timeline"
print(f'checked: {w["totals"]["allocations"]} allocations, peak {w["totals"]["peak_live_bytes"]} B; '
      f'timeline {len(t["tree"]["points"])} points of {t["interval_ns"] / 1e6:g} ms, 10 sites')
PY
for r in $(seq "$rounds"); do
	a="${with[*]}"
	b="${without[*]}"
	if [ $((r % 2)) -eq 0 ]; then
		order=(-n without "$b" -n with "$a")
	else
		order=(-n with "$a" -n without "$b")
	fi
	hyperfine -N --style none --runs 1 --export-json "$out/round$r.json" "${order[@]}" >/dev/null 2>&1
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
wall = {"with": [], "without": []}
cpu = {"with": [], "without": []}
for r in range(1, rounds + 1):
    res = {x["command"]: x for x in json.load(open(f"{out}/round{r}.json"))["results"]}
    for k in wall:
        wall[k].append(res[k]["times"][0])
        # memtrail and the traced program (its children) together.
        cpu[k].append(res[k]["user"] + res[k]["system"])
    print(f'round {r}: wall with {wall["with"][-1]:.3f} s, without {wall["without"][-1]:.3f} s, '
          f'ratio {wall["with"][-1] / wall["without"][-1]:.3f}; '
          f'cpu with {cpu["with"][-1]:.3f} s, without {cpu["without"][-1]:.3f} s')
med = statistics.median
for name, t in (("wall", wall), ("cpu", cpu)):
    ratios = [a / b for a, b in zip(t["with"], t["without"])]
    print(f'median {name}: with {med(t["with"]):.3f} s, without {med(t["without"]):.3f} s, '
          f'ratio {med(t["with"]) / med(t["without"]):.3f} (median of the rounds\' ratios {med(ratios):.3f})')
PY
