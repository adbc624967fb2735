#!/usr/bin/env bash
# Where one capture's time goes: start-up (memtrail's start to "command
# started"), the run ("command started" to "detaching started") and the
# tail ("detaching started" to memtrail's exit), in ms, from the debug
# log's timestamps (MEMTRAIL_LOG=debug). Run as root from the repository.
#
# Usage: perf/phases.sh ROUNDS [MEMTRAIL-RUN-FLAGS...] -- CMD ARGS...
#   MEMTRAIL=path picks the build (default: this checkout's release build).
#   Example: perf/phases.sh 3 --preload -- node perf/fixtures/node_work.js
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1
shift
. perf/lib.sh
memtrail_from_env
scratch_dir work
for _ in $(seq "$rounds"); do
  MEMTRAIL_LOG=debug "$mt" run -q --force -o "$work/p.json" "$@" \
    >/dev/null 2>"$work/log" || true
  ended=$(date -u +%s.%N)
  python3 - "$work/log" "$ended" <<'PY'
import datetime, re, sys

log, ended = sys.argv[1], float(sys.argv[2])
lines = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in open(log)]
at = lambda l: datetime.datetime.fromisoformat(l.split()[0].replace("Z", "+00:00")).timestamp()
line = lambda what: next(l for l in lines if what in l)
started, detaching = line("command started"), line("detaching started")
startup = float(started.split('total_ms="')[1].split('"')[0])
print(f"start-up {startup:5.0f}  run {(at(detaching) - at(started)) * 1e3:5.0f}  tail {(ended - at(detaching)) * 1e3:5.0f}")
PY
done
