#!/usr/bin/env bash
# Profile size and `memtrail report` cost on `gcc -O2 -c big.c` (issue 24,
# "Profiles that scale"): a generated big.c of FUNCS functions compiled
# under memtrail; the profile's size as version 2 (the old memtrail's) and
# version 3 (plain and .zst), and `memtrail report` (text, pprof) wall time
# and max RSS (/usr/bin/time -v) on each, old and new side by side. The
# version 3 files are the old capture converted (`report --format
# profile`), so both hold the same capture; a capture by the new build is
# measured too. Run as root from the repository.
#
# Usage: perf/profile_size.sh [OLD_MEMTRAIL [NEW_MEMTRAIL [FUNCS]]]
#   OLD_MEMTRAIL: a build that writes version 2 (e.g. main before issue 24);
#                 without it, only the new build is measured.
#   NEW_MEMTRAIL: default this checkout's release build. FUNCS: default 400.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:-}
new=${2:-}
funcs=${3:-400}
if [ -z "$new" ]; then
  cargo build --release --quiet
  new=$PWD/target/release/memtrail
fi
. scripts/lib.sh
mount_fs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 - "$funcs" <<'PY'
import sys
n = int(sys.argv[1])
out = ["#include <string.h>\n"]
for i in range(n):
    out.append(f"""
struct s{i} {{ int a[{i % 7 + 1}]; double d; }};
static int helper{i}(int x) {{
  int acc = 0;
  for (int k = 0; k < x; k++) acc += (k * {i + 3}) ^ (acc >> 2);
  return acc;
}}
int func{i}(int *v, int n) {{
  struct s{i} t; memset(&t, 0, sizeof t);
  int r = 0;
  for (int j = 0; j < n; j++) {{
    if (v[j] % {i % 5 + 2} == 0) r += helper{i}(v[j]);
    else if (v[j] > {i}) r -= v[j] * {i % 11 + 1};
    else switch (v[j] & 3) {{ case 0: r ^= j; break; case 1: r += t.a[0]; break; default: r -= {i}; }}
  }}
  return r + (int)t.d;
}}
""")
out.append("int main(void) { int v[16] = {0}; int r = 0;\n")
out += [f"  r += func{i}(v, 16);\n" for i in range(n)]
out.append("  return r; }\n")
open("big.c", "w").write("".join(out))
PY
echo "big.c: $(wc -l < big.c) lines, $funcs functions"

# wall seconds and max RSS (KiB) of a command, as "S KIB".
measure() {
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" > /dev/null
  cat "$work/time"
}
size() { stat -c %s "$1"; }
mb() { awk -v b="$1" 'BEGIN { printf "%.2f MB", b / 1e6 }'; }

capture() { # BIN OUT
  local t0 t1
  t0=$(date +%s.%N)
  "$1" run -q --force -o "$2" -- gcc -O2 -c big.c
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }'
}

rows=()
if [ -n "$old" ]; then
  secs=$(capture "$old" old.json)
  echo "old capture: $secs s"
  "$new" report old.json --format profile -o conv.json
  t0=$(date +%s.%N)
  "$new" report old.json --format profile -o conv.json.zst
  t1=$(date +%s.%N)
  echo "conversion to .zst: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s"
  echo "| profile | size |"
  echo "|---|---:|"
  echo "| version 2 (old build) | $(mb "$(size old.json)") |"
  echo "| version 2, gzip -9 | $(mb "$(gzip -9c old.json | wc -c)") |"
  echo "| version 3, same capture | $(mb "$(size conv.json)") |"
  echo "| version 3 .zst, same capture | $(mb "$(size conv.json.zst)") |"
  rows+=("old build, version 2:$old:old.json" "new build, version 2:$new:old.json"
         "new build, version 3:$new:conv.json" "new build, version 3 .zst:$new:conv.json.zst")
fi
secs=$(capture "$new" new.json)
echo "new capture: $secs s, $(mb "$(size new.json)")"
secs=$(capture "$new" new.json.zst)
echo "new capture to .zst: $secs s, $(mb "$(size new.json.zst)")"
rows+=("new build, its capture:$new:new.json" "new build, its capture .zst:$new:new.json.zst")

echo
echo "| memtrail report | text: wall | max RSS (MiB) | pprof: wall | max RSS (MiB) |"
echo "|---|---:|---:|---:|---:|"
for row in "${rows[@]}"; do
  IFS=: read -r label bin file <<< "$row"
  read -r ts tk < <(measure "$bin" report "$file")
  read -r ps pk < <(measure "$bin" report "$file" --format pprof -o "$work/p.pb.gz" --force)
  printf '| %s (%s) | %s s | %d | %s s | %d |\n' "$label" "$file" "$ts" $((tk / 1024)) \
    "$ps" $((pk / 1024))
done
