#!/usr/bin/env bash
# What the preload shim's checked reads of Python memory cost (issue 40):
# python3.11 importing a dozen stdlib modules under `memtrail run --preload`
# with two memtrail builds, interleaved rounds; the python process's own
# wall, user and system seconds (/usr/bin/time), medians. Root, from the
# repository. Usage: perf/python_shim_reads.sh OLD_BINARY NEW_BINARY [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-10}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "import json, decimal, email.parser, http.client, argparse, asyncio, xml.dom.minidom, sqlite3, csv" >"$work/imports.py"
export MEMTRAIL_CACHE_DIR="$work/cache"
for r in $(seq "$rounds"); do
  for b in old new; do
    bin=${!b}
    echo "$b $("$bin" run -q --force -o "$work/p.json" --preload -- \
      /usr/bin/time -f '%e %U %S' /usr/bin/python3.11 "$work/imports.py" 2>&1 | tail -1)"
  done
done | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    f = line.split()
    if len(f) == 4:
        runs.setdefault(f[0], []).append([float(x) for x in f[1:]])
for name, v in runs.items():
    med = lambda i: statistics.median(x[i] for x in v)
    cpu = statistics.median(x[1] + x[2] for x in v)
    print(f"{name}: wall {med(0):.3f} s, user {med(1):.3f} s, system {med(2):.3f} s, user+system {cpu:.3f} s ({len(v)} rounds)")
'
