#!/usr/bin/env bash
# memtrail tracking its own `memtrail report` of a ~3 MB profile (issue 41
# item 12): a Rust program with the mimalloc crate as its global allocator
# (statically linked, no preload shim path). Interleaved rounds of the bare
# report, the report under `memtrail run`, and under `memtrail run
# --preload`; medians, the time each capture adds, the tracked/bare ratio,
# and the probe sites of memtrail's own binary that single-stepped (must be
# none). The profile (~3.5 MB) is g++ -O1 compiling a file that includes
# <vector>, captured once. Run as root from the repository.
#
# Usage: perf/self_report.sh [ROUNDS]   (default 5; MEMTRAIL=path for another build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
. perf/lib.sh
memtrail_from_env
scratch_dir work
export MEMTRAIL_CACHE_DIR="$work/cache"
printf '#include <vector>\nint main() { return std::vector<int>(10).size() != 10; }\n' >"$work/v.cc"
"$mt" run -q --force -o "$work/big.json" -- g++ -O1 -c "$work/v.cc" -o "$work/v.o"
python3 - "$rounds" "$work" "$mt" <<'PY'
import json, os, statistics, subprocess, sys, time

rounds, work, mt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
big = f"{work}/big.json"
report = [mt, "report", big]
runs = {
    "bare": report,
    "run": [mt, "run", "-q", "--force", "-o", f"{work}/self.json", "--", *report],
    "run --preload": [mt, "run", "--preload", "-q", "--force", "-o", f"{work}/self_pre.json", "--", *report],
}
res = {}
for _ in range(rounds):
    for name, argv in runs.items():
        t = time.monotonic()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        res.setdefault(name, []).append(time.monotonic() - t)
bare = statistics.median(res["bare"])
print(f"profile {os.path.getsize(big) / 1e6:.2f} MB; {rounds} rounds, medians")
for name, times in res.items():
    m = statistics.median(times)
    print(f"  {name:14} {m:7.3f} s  added {m - bare:+7.3f} s  ratio {m / bare:6.1f}x")
bad = []
for path in ("self.json", "self_pre.json"):
    probes = json.load(open(f"{work}/{path}"))["probes"]
    own = [p for p in probes if p["image"] == os.path.realpath(mt)]
    stepped = [f"{p['symbol']} {p['hits']}" for p in own if not p["emulated"] and p.get("hits")]
    hits = sum(p.get("hits") or 0 for p in own)
    print(f"  {path}: {hits} hits on memtrail's own allocator, single-stepped: {stepped or 'none'}")
    bad += stepped
assert not bad, f"single-stepping probes: {bad}"
PY
