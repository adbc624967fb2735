#!/usr/bin/env bash
# Cost of attributing anonymous mappings to call stacks (issue 15, "mmap and
# processes in the reports"): libc's mmap and sbrk are probed at entry and
# capture the caller's stack. Side by side in one run, perf/fixtures/
# mmap_loop.c bare, under `memtrail run --stack-depth 0` (the wrapper's
# probe fires and counts its hit, no stack is captured: the cost of the
# probe itself) and under `memtrail run` (the stack captured and handed to
# the syscall's record), for the program's own mmap/munmap pairs and for
# malloc(1 MiB)/free pairs that glibc serves by mmap (the probe fires
# nested in malloc and returns). Reports per-round ratios, the
# configurations alternating within each round, and checks that the
# profile attributes every loop mmap to map_pair.
# Medians over ROUNDS rounds (default 5). Run as root from the repository.
#
# Usage: perf/mmap_sites.sh [ROUNDS]   (MEMTRAIL=path picks a memtrail build;
#                                       default: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
if [ -z "${MEMTRAIL:-}" ]; then
	cargo build --release --quiet
	MEMTRAIL=target/release/memtrail
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -g -o "$work/mmap_loop" perf/fixtures/mmap_loop.c
python3 - "$rounds" "$work" "$MEMTRAIL" <<'PY'
import json, os, statistics, subprocess, sys
sys.path.insert(0, "perf")
from profile_stacks import stacks

rounds, work, memtrail = int(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
N = 20000

def run(mode, how):
    out = f"{work}/p.json"
    if os.path.exists(out):
        os.remove(out)
    cmd = [f"{work}/mmap_loop", str(N)] + (["malloc"] if mode == "malloc" else [])
    if how != "bare":
        extra = ["--stack-depth", "0"] if how == "no-stacks" else []
        cmd = [memtrail, "run", "-q", *extra, "-o", out, "--", *cmd]
    ns = float(subprocess.check_output(cmd))
    if how == "stacks":
        prof = json.load(open(out))
        prof["stacks"] = stacks(prof)
        loop = [s for s in prof["stacks"] if s["frames"][0]["function"] == "map_pair"]
        mmaps = sum(s["mmaps"] for s in loop)
        assert mmaps == (N if mode == "mmap" else 0), (mode, mmaps)
        if mode == "malloc":
            allocs = [s for s in prof["stacks"] if s["frames"][0]["function"] == "malloc_pair"]
            assert sum(s["allocations"] for s in allocs) == N, allocs
            assert all(s["mmaps"] == 0 for s in allocs), allocs
    return ns

configs = [(m, h) for m in ["mmap", "malloc"] for h in ["bare", "no-stacks", "stacks"]]
res = {c: [] for c in configs}
for _ in range(rounds):
    for c in configs:
        res[c].append(run(*c))
for c, v in res.items():
    print(f"{c[0]:6} {c[1]:9} median {statistics.median(v):8.1f} ns/pair  (runs: {v})")
for mode in ["mmap", "malloc"]:
    r = [s / n for s, n in zip(res[(mode, "stacks")], res[(mode, "no-stacks")])]
    b = [s / n for s, n in zip(res[(mode, "stacks")], res[(mode, "bare")])]
    print(f"{mode}: memtrail / memtrail --stack-depth 0, per round: median {statistics.median(r):.2f}x "
          f"(rounds: {[round(x, 2) for x in r]}); memtrail / bare: median {statistics.median(b):.2f}x")
PY
