#!/usr/bin/env bash
# What a parent watching with waitpid(WUNTRACED) sees of memtrail's pressure
# pauses: the storm fixture (8 threads or 16 processes of malloc/free pairs)
# with a slow events poller (MEMTRAIL_FAULT=slow-events) under
# `--pressure-timeout inf`, paused by the cgroup freezer (default) and by
# SIGSTOP (MEMTRAIL_FAULT=no-cgroup, the fallback without a cgroup v2
# freezer), on a 64 KiB and a 1 MiB events ring. Prints stops seen by the
# parent, pause episodes, the longest pause, and the allocation count (which
# must be 8 x N or 16 x N plus the fixture's own few).
#   perf/pauses.sh [ROUNDS=3] [N=3000]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
n=${2:-3000}
cargo build --release --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -o "$out/wuntraced" perf/fixtures/wuntraced.c
cc -O0 -g -fno-builtin -Itests/fixtures -o "$out/storm" tests/fixtures/storm.c -ldl -lpthread
export MEMTRAIL_CACHE_DIR="$out/cache"
# Warm the image cache: the first exec of an image is held (a visible stop).
target/release/memtrail run -q -- "$out/wuntraced" "$out/storm" threads 1 >/dev/null
printf '%-8s %-7s %-6s %8s %9s %12s %12s\n' pause mode ring stops episodes longest_ms allocations
for pause in freeze sigstop; do
  faults=slow-events
  [ "$pause" = sigstop ] && faults=slow-events,no-cgroup
  for mode in threads procs; do
    for ring in 64K 1M; do
      for _ in $(seq "$rounds"); do
        stops=$(MEMTRAIL_FAULT=$faults target/release/memtrail run -q --ring-size "$ring" \
          --pressure-timeout inf --force -o "$out/p.json" -- "$out/wuntraced" "$out/storm" "$mode" "$n" |
          sed -n 's/^stops=//p')
        python3 - "$out/p.json" "$pause" "$mode" "$ring" "$stops" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
q = p["pressure"]
print(f"{sys.argv[2]:<8} {sys.argv[3]:<7} {sys.argv[4]:<6} {sys.argv[5]:>8} {q['episodes']:>9} "
      f"{q['longest_pause_ns'] / 1e6:>12.1f} {p['totals']['allocations']:>12}")
PY
        rm -f "$out/p.json"
      done
    done
  done
done
