#!/usr/bin/env bash
# The binary event stream against JSON lines (issue 15): bytes per event
# and the capture's wall time with each, side by side in one run, and the
# reader's throughput (`memtrail events`, binary to JSON lines).
#
# Each round captures `pairs N` (N malloc/free pairs, 2N events) three
# times in turn: without --events, with --events E.jsonl and with
# --events E.mtev (--pressure-timeout inf: nothing is lost, the stream's
# writer paces the tree instead). Prints each round and the medians:
# bytes per event of each format, each capture's wall time as a ratio to
# the capture without a stream, and events per second converted.
# Target: <= 10 bytes an event (binary).
#   perf/events_stream.sh [ROUNDS=5] [PAIRS=1000000]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
pairs=${2:-1000000}
cargo build --release --quiet
mt=$PWD/target/release/memtrail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O0 -g -fno-builtin -Itests/fixtures -o "$out/pairs" tests/fixtures/pairs.c
now() { date +%s%N; }
capture() { # $1: extra flags as one word or empty
  local t0 t1
  t0=$(now)
  # shellcheck disable=SC2086
  "$mt" run -q -o /dev/null --pressure-timeout inf $1 -- "$out/pairs" "$pairs"
  t1=$(now)
  echo $(((t1 - t0) / 1000))
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
events=$((2 * pairs))
: >"$out/none"; : >"$out/json"; : >"$out/bin"; : >"$out/jb"; : >"$out/bb"; : >"$out/conv"
for r in $(seq "$rounds"); do
  rm -f "$out/e.jsonl" "$out/e.mtev"
  n=$(capture "")
  j=$(capture "--events $out/e.jsonl")
  b=$(capture "--events $out/e.mtev")
  jb=$(stat -c %s "$out/e.jsonl")
  bb=$(stat -c %s "$out/e.mtev")
  t0=$(now)
  "$mt" events "$out/e.mtev" >"$out/back.jsonl"
  t1=$(now)
  conv=$(((t1 - t0) / 1000))
  lines=$(wc -l <"$out/back.jsonl")
  [ "$lines" -ge "$events" ] || { echo "round $r: $lines events read back, expected >= $events" >&2; exit 1; }
  echo "$n" >>"$out/none"; echo "$j" >>"$out/json"; echo "$b" >>"$out/bin"
  echo "$jb" >>"$out/jb"; echo "$bb" >>"$out/bb"; echo "$conv" >>"$out/conv"
  awk -v r="$r" -v n="$n" -v j="$j" -v b="$b" -v jb="$jb" -v bb="$bb" -v e="$lines" -v c="$conv" 'BEGIN {
    printf "round %d: %d events; none %.2fs, jsonl %.2fs (x%.3f, %.1f B/event), binary %.2fs (x%.3f, %.2f B/event); read back %.1f M events/s\n",
      r, e, n/1e6, j/1e6, j/n, jb/e, b/1e6, b/n, bb/e, e/c }'
done
n=$(median <"$out/none"); j=$(median <"$out/json"); b=$(median <"$out/bin")
jb=$(median <"$out/jb"); bb=$(median <"$out/bb"); c=$(median <"$out/conv")
awk -v n="$n" -v j="$j" -v b="$b" -v jb="$jb" -v bb="$bb" -v e="$events" -v c="$c" 'BEGIN {
  printf "median: jsonl %.1f B/event, capture x%.3f of no stream; binary %.2f B/event, capture x%.3f of no stream (x%.3f of jsonl); size binary/jsonl %.4f; memtrail events %.1f M events/s\n",
    jb/e, j/n, bb/e, b/n, b/j, bb/jb, e/c }'
