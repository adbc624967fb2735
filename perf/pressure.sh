#!/usr/bin/env bash
# Cost of backpressure pauses: the storm fixture (8 threads x N
# malloc/free pairs) under `memtrail run --pressure-timeout inf` with a small
# and a large events ring, side by side, plus the same with the events
# pipeline slowed (test-only fault) so that pauses are certain. Prints wall
# time, pause episodes and pause lengths. Run as root from the repo.
#
# Usage: perf/pressure.sh [ROUNDS]   (default 20000 pairs per thread)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20000}
cargo build --release --quiet
memtrail=target/release/memtrail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O0 -pthread -Itests/fixtures -o "$work/storm" tests/fixtures/storm.c

run() { # label, ring size, fault
  local start end
  start=$(date +%s%N)
  MEMTRAIL_FAULT=$3 "$memtrail" run -q --force --pressure-timeout inf --ring-size "$2" \
    --output "$work/p.json" -- "$work/storm" threads "$rounds"
  end=$(date +%s%N)
  python3 - "$1" "$(( (end - start) / 1000000 ))" "$work/p.json" <<'PY'
import json, sys
label, ms, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = json.load(open(path))["pressure"]
print(f"{label:<34} {ms:>7} ms  episodes {p['episodes']:>5}  "
      f"paused {p['total_pause_ns']/1e6:8.1f} ms  longest {p['longest_pause_ns']/1e6:6.2f} ms  "
      f"events ring high water {p['high_water']['events']} B")
PY
}

echo "storm: 8 threads x $rounds malloc/free pairs, --pressure-timeout inf"
run "large ring (64M)" 64M none
run "small ring (64K)" 64K none
run "small ring (64K), slowed consumer" 64K slow-events
run "large ring (64M), slowed consumer" 64M slow-events
