#!/usr/bin/env bash
# The whole test suite: formatting, lints, the BPF stack budget, every test.
# Installs missing build and test dependencies first. Needs root: the tests
# load real BPF programs and track real processes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
install_deps g++ bpftool golang-go libjemalloc-dev libmimalloc-dev libtcmalloc-minimal4 libcap2-bin python3.11
mount_fs

echo "== cargo fmt --check" >&2
cargo fmt --check
echo "== cargo clippy" >&2
cargo clippy --all-targets --quiet -- -D warnings
echo "== C header (include/memtrail.h) up to date" >&2
cargo test --quiet --test ffi_header
echo "== BPF stack budget" >&2
scripts/check-bpf-stack.sh
echo "== cargo test" >&2
# The tests' image and table cache is their own: the hundreds of fixtures
# they build would otherwise fill the user's (~/.cache/memtrail), and every
# later capture would read them at start-up.
export MEMTRAIL_CACHE_DIR="${MEMTRAIL_CACHE_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/tmp/memtrail-cache}"
# The C and Python clients link libmemtrail.so, which cargo test does not
# build by itself.
cargo build --lib --quiet
# --no-fail-fast: one failing binary does not hide the others; the timeout
# turns a hang the tests own watchdogs miss into a failure within CI's limit.
target="$(cd "${CARGO_TARGET_DIR:-target}" && pwd -P)"
status=0
timeout --kill-after=60 70m cargo test --no-fail-fast || status=$?
left_behind "$target" || status=1
echo "== exact-count tests again, with per-CPU events rings" >&2
# On this two-CPU machine `--event-rings auto` keeps one shared ring; the
# captures' exact counts must hold as well with a ring per CPU merged by
# time (the tests whose ring sizes are for one ring ask for it).
per_cpu_tests=(attach capture_loss cli_attach cli_exit cli_signals events_binary guardian pressure
  probes_scope reliability report_run stacks stacks_unwind stops track_apis track_cleanup track_clock
  track_cxx track_cxx_throw track_leaks track_mapping_sites track_mappings
  track_processes track_startup track_temporary track_threads usdt_regions)
MEMTRAIL_EVENT_RINGS=per-cpu timeout --kill-after=60 20m \
  cargo test --no-fail-fast "${per_cpu_tests[@]/#/--test=}" || status=$?
left_behind "$target" || status=1
exit "$status"
