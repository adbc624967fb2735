#!/usr/bin/env bash
# Loads every BPF program of every object memtrail builds (the skeletons of
# src/bpf/skel.rs, one per bpf/*.bpf.c) with verifier statistics, prints each
# program's stack depth, and fails when one is over the budget below or does
# not verify. This is the load-only test of every BPF program.
#
# Usage: scripts/check-bpf-stack.sh   (as root, from anywhere in the repo)
# Exit:  0 all load within budget; 1 over budget or a program failed to
#        load; 2 cannot run (not root, build failed).
#
# Nothing is attached or pinned: bpf_stack holds every object by fd only,
# and its exit unloads them. The trap stops it if this script is stopped.
# (Every program loads by BTF name: tracefs is not needed.)
set -euo pipefail

# Stack budget of one BPF program, in bytes: its deepest call chain's frames
# (from the verifier's `stack depth A+B+...` and the calls between its
# subprograms; see scripts/bpf_stack.rs). The kernel's limit is 512; the
# rest is headroom for kernels that spill more and for growth.
STACK_BUDGET_BYTES=256

cd "$(dirname "$0")/.."

if [[ $EUID -ne 0 ]]; then
	echo "check-bpf-stack: loading BPF programs needs root" >&2
	exit 2
fi

tool_pid=
cleanup() {
	if [[ -n $tool_pid ]]; then
		kill "$tool_pid" 2>/dev/null || true
		wait "$tool_pid" 2>/dev/null || true
	fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

cargo build --quiet --example bpf_stack || exit 2
tool="${CARGO_TARGET_DIR:-target}/debug/examples/bpf_stack"

# In the background so the trap can stop it.
"$tool" --budget "$STACK_BUDGET_BYTES" &
tool_pid=$!
status=0
wait "$tool_pid" || status=$?
tool_pid=
exit "$status"
