#!/usr/bin/env bash
# memtrail bench's own cost per benchmark run, beyond the capture, and the
# determinism of its metrics (issue 14).
#
# Overhead: `memtrail bench --runs N -- FIXTURE` timed from outside, less
# the wall time of its N child captures (`memtrail run -q -o P.json --
# FIXTURE`, each timed by bench around spawn and wait, logged with --log
# info), divided by N: the harness's own cost per run (its start, reading
# each profile, the statistics, the results document and its directory).
# Measured in the same process as the captures, so the captures' own
# variance (±100 ms on this machine) does not enter it. For scale, N plain
# captures are timed before each bench. Prints each round and the median.
# Target: <= 50 ms a run.
#
# Determinism: a suite of the deterministic fixtures run --runs 10; prints
# each benchmark's `deterministic` and its metrics' spread (must be 0).
#   perf/bench_overhead.sh [ROUNDS=5] [N=5]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
n=${2:-5}
cargo build --release --quiet
mt=$PWD/target/release/memtrail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-O0 -g -fno-builtin -Itests/fixtures)
cc "${flags[@]}" -o "$out/work" tests/fixtures/bench_work.c
cc "${flags[@]}" -DEXTRA -o "$out/work_extra" tests/fixtures/bench_work.c
for f in peak leaks stacks stack_repeat; do
  cc "${flags[@]}" -o "$out/$f" "tests/fixtures/$f.c"
done
export MEMTRAIL_CACHE_DIR="$out/cache"
"$mt" run -q -- "$out/work" # warm the image cache

now() { date +%s%N; }
echo "overhead: $rounds rounds of $n captures vs memtrail bench --runs $n (fixture bench_work)"
printf '%-6s %16s %10s %18s %16s\n' round plain_captures_ms bench_ms its_captures_ms overhead_ms/run
per_run=()
for r in $(seq "$rounds"); do
  t0=$(now)
  for _ in $(seq "$n"); do
    "$mt" run -q --force -o "$out/p.json" -- "$out/work"
  done
  t1=$(now)
  "$mt" --log info bench -q --dir "$out/b" --runs "$n" --name work --format json \
    -o "$out/r.json" -- "$out/work" 2>"$out/log"
  t2=$(now)
  c=$(sed 's/\x1b\[[0-9;]*m//g' "$out/log" | sed -n 's/.*captures_us=\([0-9]*\).*/\1/p')
  a=$(( (t1 - t0) / 1000 )); b=$(( (t2 - t1) / 1000 ))
  o=$(( (b - c) / n ))
  per_run+=("$o")
  printf '%-6s %16.1f %10.1f %18.1f %16.1f\n' "$r" "$(echo "$a/1000" | bc -l)" \
    "$(echo "$b/1000" | bc -l)" "$(echo "$c/1000" | bc -l)" "$(echo "$o/1000" | bc -l)"
done
median=$(printf '%s\n' "${per_run[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
printf 'median overhead per run: %.1f ms\n' "$(echo "$median/1000" | bc -l)"

cat > "$out/suite.toml" <<TOML
[[bench]]
name = "bench_work"
command = ["$out/work"]
[[bench]]
name = "bench_work_extra"
command = ["$out/work_extra"]
[[bench]]
name = "peak"
command = ["$out/peak"]
[[bench]]
name = "leaks"
command = ["$out/leaks"]
[[bench]]
name = "stacks"
command = ["$out/stacks"]
[[bench]]
name = "stack_repeat"
command = ["$out/stack_repeat"]
TOML
echo
echo "determinism: memtrail bench --runs 10 over the deterministic fixtures"
"$mt" bench -q --suite "$out/suite.toml" --runs 10 --dir "$out/d" --format json -o "$out/d.json"
python3 - "$out/d.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{'benchmark':<18} {'runs':>4} {'deterministic':>13} {'max spread':>10}  allocations  allocated_bytes  peak_live_bytes")
for b in doc["benchmarks"]:
    m = b["metrics"]
    spread = max(s["max"] - s["min"] for s in m.values())
    print(f"{b['name']:<18} {b['runs']:>4} {str(b['deterministic']):>13} {spread:>10}  "
          f"{m['allocations']['value']:>11}  {m['allocated_bytes']['value']:>15}  {m['peak_live_bytes']['value']:>15}")
PY
