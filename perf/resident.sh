#!/usr/bin/env bash
# What recording resident memory costs (issue 24): page faults fire the
# kernel's rss_stat tracepoint once each, system-wide. Median ns per page
# fault of perf/fixtures/touch_pages (256 MiB, 4 rounds) under an OLD build
# (without the rss_stat program) and a NEW one, interleaved: tracked (run
# under memtrail), and untracked while a capture of another command runs
# (every process of the machine pays the program's exit test), and with no
# capture at all. Usage (root): perf/resident.sh OLD_BINARY NEW_BINARY [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -o "$work/touch" perf/fixtures/touch_pages.c
export MEMTRAIL_CACHE_DIR="$work/cache"
for r in $(seq "$rounds"); do
  bare=$("$work/touch" 256 4)
  for b in old new; do
    bin=${!b}
    tracked=$("$bin" run -q --force -o "$work/t.json" -- "$work/touch" 256 4 2>/dev/null)
    "$bin" run -q --force -o "$work/s.json" -- sleep 3 2>/dev/null &
    cap=$!
    sleep 1.5
    untracked=$("$work/touch" 256 4)
    wait "$cap"
    echo "$r $b fault_ns: bare=$bare tracked=$tracked untracked_during_capture=$untracked"
  done
done
