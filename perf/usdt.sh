#!/usr/bin/env bash
# Cost of a USDT region begin/end pair (include/memtrail_usdt.h) to a
# program tracked by memtrail (issue 13: target <= 2 us a pair), side by
# side in one run: perf/fixtures/usdt_loop.c built with the markers and
# with them compiled out (-DMEMTRAIL_USDT_DISABLE), each run bare and under
# `memtrail run`; the pair's cost is marked minus unmarked under memtrail,
# per round, both with a malloc/free pair in each iteration and with the
# markers alone (`empty`: no libc call in the loop, so allocator uprobes
# other tracers put on libc system-wide cannot slow it).
# It also checks that every marker probe sits on a `nop` (0x90), which the
# kernel emulates, and that the profile counts every region exactly.
# Medians over ROUNDS rounds (default 5), the configurations alternating
# within each round. Run as root from the repository, on a quiet machine.
#
# Usage: perf/usdt.sh [ROUNDS]   (MEMTRAIL=path picks a memtrail build;
#                                 default: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
if [ -z "${MEMTRAIL:-}" ]; then
	cargo build --release --quiet
	MEMTRAIL=target/release/memtrail
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -Iinclude -o "$work/marked" perf/fixtures/usdt_loop.c
cc -O2 -Iinclude -DMEMTRAIL_USDT_DISABLE -o "$work/unmarked" perf/fixtures/usdt_loop.c
python3 - "$rounds" "$work" "$MEMTRAIL" <<'PY'
import json, os, statistics, subprocess, sys

rounds, work, memtrail = int(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
N = 200000

def run(exe, traced, empty=False):
    out = f"{work}/p.json"
    if os.path.exists(out):
        os.remove(out)
    cmd = [f"{work}/{exe}", str(N)] + (["empty"] if empty else [])
    if traced:
        cmd = [memtrail, "run", "-q", "-o", out, "--", *cmd]
    ns = float(subprocess.check_output(cmd))
    if traced and exe == "marked":
        prof = json.load(open(out))
        regions = {r["name"]: r for r in prof["regions"]}
        n = N // 200 * 200
        assert regions["pair"]["entries"] == n, regions
        assert regions["pair"]["allocations"] == (0 if empty else n), regions
        assert regions["warm"]["entries"] == 1000, regions
        markers = [p for p in prof["probes"] if p["symbol"].startswith("memtrail:")]
        assert len(markers) == 4, markers
        data = open(f"{work}/marked", "rb").read()
        for p in markers:
            assert p["emulated"] and data[p["offset"]] == 0x90, p
    return ns

configs = [("unmarked", False), ("marked", False), ("unmarked", True), ("marked", True),
           ("unmarked", True, True), ("marked", True, True)]
res = {c: [] for c in configs}
for _ in range(rounds):
    for c in configs:
        res[c].append(run(*c))
med = {c: statistics.median(v) for c, v in res.items()}
for c, v in med.items():
    print(f"{c[0]:9} {'memtrail' if c[1] else 'bare':8} {'markers only' if len(c) > 2 else '':12} "
          f"{v:8.1f} ns/iteration  (runs: {res[c]})")
alone = [m - u for m, u in zip(res[("marked", True, True)], res[("unmarked", True, True)])]
print(f"a begin/end pair alone under memtrail (markers-only loop): median {statistics.median(alone):.1f} ns, "
      f"min {min(alone):.1f} ns (rounds: {[round(d) for d in alone]})")
# Per round: the pair's cost (marked - unmarked under memtrail) and its
# ratio to the unmarked iteration (a malloc/free pair under memtrail: three
# probe hits), so a round slowed as a whole by the machine cancels out.
diffs = [m - u for m, u in zip(res[("marked", True)], res[("unmarked", True)])]
ratios = [d / u for d, u in zip(diffs, res[("unmarked", True)])]
bare = med[("marked", False)] - med[("unmarked", False)]
print(f"a begin/end pair under memtrail, per round: median {statistics.median(diffs):.1f} ns "
      f"(rounds: {[round(d) for d in diffs]})")
print(f"  = {statistics.median(ratios):.2f}x a malloc/free pair under memtrail "
      f"(rounds: {[round(r, 2) for r in ratios]})")
print(f"without memtrail: marked - unmarked = {bare:.1f} ns")
PY
