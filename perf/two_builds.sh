#!/usr/bin/env bash
# Two memtrail builds side by side, interleaved rounds: a malloc/free loop's
# median ns per pair under each, and the wall time of `memtrail run` on it
# and on the C++ map workload (issue 27: the restructuring must not move
# them). Usage (root): perf/two_builds.sh OLD_BINARY NEW_BINARY [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -o "$work/alloc_loop" perf/fixtures/alloc_loop.c
g++ -O2 -o "$work/cxx_map" perf/fixtures/cxx_map.cc
export MEMTRAIL_CACHE_DIR="$work/cache"
for r in $(seq "$rounds"); do
  for b in old new; do
    bin=${!b}
    s=$(date +%s%N)
    ns=$("$bin" run -q --force -o "$work/a.json" -- "$work/alloc_loop" 300000 2>/dev/null)
    m=$(date +%s%N)
    "$bin" run -q --force -o "$work/c.json" -- "$work/cxx_map" >/dev/null 2>&1
    e=$(date +%s%N)
    echo "$r $b pair_ns=$ns alloc_loop_wall_ms=$(((m - s) / 1000000)) cxx_map_wall_ms=$(((e - m) / 1000000))"
  done
done
