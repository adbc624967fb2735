#!/usr/bin/env bash
# Costs of unwinding from tables (issue 12), side by side in one run:
#  1. BPF run time of alloc_enter per allocation (kernel.bpf_stats_enabled):
#     perf/fixtures/unwind_chain.c built with and without frame pointers,
#     each under --unwind fp / dwarf / auto, and --stack-depth 0 (no walk);
#     the walk's own cost is the difference from --stack-depth 0.
#  2. Whole-run wall time on Debian's python3.11: memtrail (default stacks,
#     and --unwind fp) against heaptrack and the bare run.
#  3. Start-up: `memtrail run -- python3.11 -c pass`, --unwind auto with an
#     empty table cache (cold) and a filled one (cached), against --unwind fp.
# Medians over ROUNDS rounds (default 5), the configurations alternating
# within each round. Run as root from the repository, on a quiet machine.
#
# Usage: perf/unwind.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release --quiet
work=$(mktemp -d)
old_stats=$(sysctl -n kernel.bpf_stats_enabled)
trap 'sysctl -qw kernel.bpf_stats_enabled=$old_stats; rm -rf "$work"' EXIT
cc -O2 -fno-omit-frame-pointer -o "$work/chain_fp" perf/fixtures/unwind_chain.c
cc -O2 -fomit-frame-pointer -o "$work/chain_nofp" perf/fixtures/unwind_chain.c
sysctl -qw kernel.bpf_stats_enabled=1
python3 - "$rounds" "$work" <<'PY'
import json, os, statistics, subprocess, sys, time
sys.path.insert(0, "perf")
from profile_stacks import stacks

rounds, work = int(sys.argv[1]), sys.argv[2]
memtrail = os.path.abspath("target/release/memtrail")
N = 200000

def prog_stats(pid):
    """run_time_ns and run_cnt of the alloc_enter program memtrail `pid`
    holds (found through its descriptors' fdinfo: this bpftool cannot name
    a program's process)."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            for line in open(f"/proc/{pid}/fdinfo/{fd}"):
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except OSError:
            pass
    for i in ids:
        p = json.loads(subprocess.check_output(["bpftool", "prog", "show", "id", str(i), "--json"]))
        if p.get("name") == "alloc_enter":
            return p.get("run_time_ns", 0), p.get("run_cnt", 0)
    raise SystemExit(f"memtrail {pid} holds no alloc_enter")

def chain_run(exe, args):
    out = f"{work}/chain.json"
    p = subprocess.Popen([memtrail, "run", "-q", "--force", "-o", out, *args, "--", exe, str(N)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    ns, cnt = prog_stats(p.pid)
    p.stdin.write(b"\n"); p.stdin.close(); p.wait()
    assert p.returncode == 0
    prof = json.load(open(out))
    prof["stacks"] = stacks(prof)
    assert cnt >= N, cnt
    top = max(prof["stacks"], key=lambda s: s["allocations"],
              default={"allocations": N if "0" in args else 0, "frames": []})
    early = {e["reason"]: e["stacks"] for e in prof["unwind"]["ended_early"]}
    if top["allocations"] != N:
        print(f"note: {exe} {args}: the loop's {N} allocations took {len(prof['stacks'])} stacks "
              f"(largest {top['allocations']}), ended early: {early}", file=sys.stderr)
    return ns / cnt, len(top["frames"])

configs = [
    ("fp build, --stack-depth 0", "chain_fp", ["--stack-depth", "0"]),
    ("fp build, --unwind fp", "chain_fp", ["--unwind", "fp"]),
    ("fp build, --unwind dwarf", "chain_fp", ["--unwind", "dwarf"]),
    ("no-fp build, --unwind dwarf", "chain_nofp", ["--unwind", "dwarf"]),
    ("no-fp build, --unwind auto", "chain_nofp", ["--unwind", "auto"]),
    ("no-fp build, --unwind fp", "chain_nofp", ["--unwind", "fp"]),
    # The same depth both ways: the table walk reaches two frames more
    # (__libc_start_main and _start) than the frame-pointer chain does.
    ("fp build, --unwind fp --stack-depth 10", "chain_fp", ["--unwind", "fp", "--stack-depth", "10"]),
    ("no-fp build, --unwind dwarf --stack-depth 10", "chain_nofp", ["--unwind", "dwarf", "--stack-depth", "10"]),
]
res = {c[0]: [] for c in configs}
frames = {}
for _ in range(rounds):
    for label, exe, args in configs:
        ns, f = chain_run(f"{work}/{exe}", args)
        res[label].append(ns)
        frames[label] = f
base = statistics.median(res[configs[0][0]])
fp = statistics.median(res[configs[1][0]]) - base
print(f"## BPF alloc_enter per allocation ({N} allocations, median of {rounds})")
print(f"| configuration | frames | ns/alloc | walk ns | walk / fp walk |")
print(f"|---|---:|---:|---:|---:|")
for label, _, _ in configs:
    m = statistics.median(res[label])
    walk = m - base
    ratio = f"{walk / fp:.2f}x" if label != configs[0][0] else ""
    print(f"| {label} | {frames[label]} | {m:.0f} | {walk:.0f} | {ratio} |")
fp10 = statistics.median(res[configs[-2][0]])
dwarf10 = statistics.median(res[configs[-1][0]])
print()
print(f"At the same depth (10 frames): alloc_enter {dwarf10:.0f} ns with tables against "
      f"{fp10:.0f} ns with frame pointers, {dwarf10 / fp10:.2f}x per allocation "
      f"(walks alone {(dwarf10 - base) / (fp10 - base):.2f}x).")

def wall(cmd, env=None):
    t = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    assert r.returncode == 0, cmd
    return time.monotonic() - t

py = "/usr/bin/python3.11"
workloads = [
    ("list of 200000 strings", ["-c", "x=[str(i)*3 for i in range(200000)]"]),
    ("import stdlib modules", ["-c", "import json, decimal, email.parser, http.client, argparse, asyncio, xml.dom.minidom, sqlite3, csv"]),
]
print()
print(f"## Whole run on {py} (seconds, median of {rounds})")
print("| workload | bare | memtrail (auto) | memtrail --unwind fp | heaptrack | memtrail / heaptrack |")
print("|---|---:|---:|---:|---:|---:|")
cache_env = dict(os.environ, MEMTRAIL_CACHE_DIR=f"{work}/cache")
for name, args in workloads:
    t = {k: [] for k in ("bare", "auto", "fp", "heaptrack")}
    for _ in range(rounds):
        t["bare"].append(wall([py, *args]))
        t["auto"].append(wall([memtrail, "run", "-q", "--force", "-o", f"{work}/p.json", "--", py, *args], cache_env))
        t["fp"].append(wall([memtrail, "run", "-q", "--force", "-o", f"{work}/p.json", "--unwind", "fp", "--", py, *args], cache_env))
        t["heaptrack"].append(wall(["heaptrack", "-o", f"{work}/ht", py, *args]))
        for f in os.listdir(work):
            if f.startswith("ht"):
                os.remove(f"{work}/{f}")
    m = {k: statistics.median(v) for k, v in t.items()}
    print(f"| {name} | {m['bare']:.2f} | {m['auto']:.2f} | {m['fp']:.2f} | {m['heaptrack']:.2f} | {m['auto'] / m['heaptrack']:.2f}x |")

print()
print(f"## Start-up: memtrail run -- {py} -c pass (seconds, median of {rounds})")
t = {k: [] for k in ("fp", "cold", "cached")}
for i in range(rounds):
    t["fp"].append(wall([memtrail, "run", "-q", "--force", "-o", f"{work}/p.json", "--unwind", "fp", "--", py, "-c", "pass"]))
    cold = dict(os.environ, MEMTRAIL_CACHE_DIR=f"{work}/cold{i}")
    t["cold"].append(wall([memtrail, "run", "-q", "--force", "-o", f"{work}/p.json", "--", py, "-c", "pass"], cold))
    t["cached"].append(wall([memtrail, "run", "-q", "--force", "-o", f"{work}/p.json", "--", py, "-c", "pass"], cold))
m = {k: statistics.median(v) for k, v in t.items()}
print("| --unwind fp | auto, cold cache | auto, cached | added cold | added cached |")
print("|---:|---:|---:|---:|---:|")
print(f"| {m['fp']:.3f} | {m['cold']:.3f} | {m['cached']:.3f} | {m['cold'] - m['fp']:+.3f} | {m['cached'] - m['fp']:+.3f} |")
PY
