#!/usr/bin/env bash
# Where a malloc/free pair's cost goes under memtrail (issue 22): the
# traced program's CPU time added per pair (uprobe traps, the session's
# return, BPF programs: they run in its context), the BPF programs' own run
# time per pair (kernel.bpf_stats_enabled=1: bpftool's run_time_ns and
# run_cnt of alloc_session, sys_enter and sys_exit, read just before and
# just after the workload, inside the capture), and memtrail's own CPU per
# pair (its consumers; its start and end measured on a 1-pair run and taken
# off). Configurations: bare, --stack-depth 0, --unwind fp, the default
# (tables), for each memtrail binary given, with --probes per-process (so
# that the run counts are the workload's alone); 1 and 4 threads
# (perf/fixtures/thread_pairs.c). Interleaved rounds, medians.
#
# bpf_stats costs two clock reads per program run (~40-60 ns here): the
# BPF column includes them, the run without stats does not.
#
# Usage (root): perf/pair_profile.sh [ROUNDS [MEMTRAIL...]]  (default 5, this build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
. perf/lib.sh
builds_from_args "$@"
set -- "${builds[@]}"
scratch_dir work
cc -O2 -pthread -o "$work/thread_pairs" perf/fixtures/thread_pairs.c
cc -O2 -o "$work/cpu_of" perf/fixtures/cpu_of.c
stats_was=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
trap 'sysctl -qw kernel.bpf_stats_enabled=$stats_was; rm -rf "$work"' EXIT
python3 - "$rounds" "$work" "$@" <<'PY'
import json, os, statistics, subprocess, sys

rounds, work, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
PAIRS = 400000
PROGS = ("alloc_session", "sys_enter", "sys_exit")
configs = {}
for i, b in enumerate(bins):
    tag = f"#{i + 1} " if len(bins) > 1 else ""
    configs[f"{tag}-S0"] = (b, ["--stack-depth", "0"])
    configs[f"{tag}fp"] = (b, ["--unwind", "fp"])
    configs[f"{tag}tables"] = (b, [])

def cpu_lines(err):
    return [float(l.split()[1]) for l in err.splitlines() if l.startswith("cpu_of ")]

def snap(path):
    return f"bpftool -j prog show > {path}"

def stats(path, ours):
    """run_time_ns and run_cnt of this capture's programs (ours: their ids)."""
    out = {}
    for p in json.load(open(path)):
        if p["id"] in ours:
            t, c = out.get(p["name"], (0, 0))
            out[p["name"]] = (t + p.get("run_time_ns", 0), c + p.get("run_cnt", 0))
    return out

def run(config, threads, pairs):
    """(workload CPU, memtrail's own CPU, {prog: (ns, runs)} over the workload)."""
    cmd = [f"{work}/cpu_of", f"{work}/thread_pairs", str(threads), str(pairs // threads)]
    if config == "bare":
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return cpu_lines(out.stderr)[-1], 0.0, {}
    b, flags = configs[config]
    # This capture's programs: those memtrail (the shell's parent) holds
    # open (other sessions' captures have theirs).
    owned = f"cat /proc/$PPID/fdinfo/* 2>/dev/null | grep '^prog_id:' > {work}/ours"
    inner = f"{owned}; {snap(work + '/a.json')}; {' '.join(cmd)}; {snap(work + '/b.json')}"
    full = [f"{work}/cpu_of", b, "run", "-q", "--force", "--probes", "per-process", *flags, "-o", f"{work}/p.json", "--",
            "sh", "-c", inner]
    p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate()
    assert p.returncode == 0, err
    lines = cpu_lines(err)
    wl, total = lines[-2], lines[-1]
    ours = {int(l.split()[1]) for l in open(work + "/ours")}
    a, z = stats(work + "/a.json", ours), stats(work + "/b.json", ours)
    d = {k: (z[k][0] - a.get(k, (0, 0))[0], z[k][1] - a.get(k, (0, 0))[1]) for k in z}
    return wl, total - wl, d

med = statistics.median
res = {}
print(f"load before: {open('/proc/loadavg').read().split()[:3]}; binaries: {bins}")
for _ in range(rounds):
    for threads in (1, 4):
        for c in ["bare", *configs]:
            res.setdefault((threads, c), []).append(run(c, threads, PAIRS))
            if c != "bare":
                res.setdefault((threads, c, "start"), []).append(run(c, 1, 1))
print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
us = 1e6 / PAIRS
print(f"\n### A malloc/free pair's cost, µs per pair (medians over {rounds} interleaved rounds; {PAIRS} pairs)")
print("| threads | config | program CPU added | BPF alloc_session | its runs per pair | ns per run | BPF sys_enter+exit | left: traps, session return | memtrail's own CPU |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for threads in (1, 4):
    bare = [r[0] for r in res[(threads, "bare")]]
    for c in configs:
        rows = res[(threads, c)]
        start = med([r[1] for r in res[(threads, c, "start")]])
        added = [(r[0] - b) * us for r, b in zip(rows, bare)]
        sess = [r[2].get("alloc_session", (0, 0)) for r in rows]
        sys_ = [r[2].get("sys_enter", (0, 0))[0] + r[2].get("sys_exit", (0, 0))[0] for r in rows]
        bpf = [t / 1000 / PAIRS for t, _ in sess]
        left = [a - s / 1000 / PAIRS - y / 1000 / PAIRS for a, (s, _), y in zip(added, sess, sys_)]
        print(f"| {threads} | {c} | {med(added):.2f} | {med(bpf):.2f} | {med([n / PAIRS for _, n in sess]):.2f} | "
              f"{med([t / n if n else 0 for t, n in sess]):.0f} | {med([y / 1000 / PAIRS for y in sys_]):.2f} | "
              f"{med(left):.2f} | {max(0.0, med([(r[1] - start) * us for r in rows])):.2f} |")
PY
