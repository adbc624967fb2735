#!/usr/bin/env bash
# Builds memtrail, tracks the bundled demo workload and prints its report.
# Usage: scripts/run.sh            (installs missing build dependencies)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
install_deps
cargo build --release --quiet
out=target/demo
mkdir -p "$out"
cc -O1 -g -fno-omit-frame-pointer -pthread -o "$out/demo" scripts/demo/demo.c
target/release/memtrail run --force --output "$out/profile.json" --report text -- "$out/demo"
