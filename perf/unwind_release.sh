#!/bin/sh
# Locked memory of the unwind tables when processes that map large images
# run one after another (issue 23: a table lives while a process maps its
# image; its slots are reused once none does). Four processes in turn,
# each loading one image of ~1 M rows and exiting: libLLVM 14, 15 and 19,
# then libclang-cpp 19 (which maps libLLVM 19 again).
#
#   perf/unwind_release.sh MEMTRAIL...   # one or more memtrail builds
#
# Prints, per build, the session's closing account of the tables (debug
# log "unwind tables: ..."): slots made, and with release the most in use
# at once and the tables released, and the shards' locked memory in MiB.
# Each build runs with a cold table cache of its own, then a warm one.
set -eu
dir=/usr/lib/x86_64-linux-gnu
libs="$dir/libLLVM-14.so.1 $dir/libLLVM-15.so.1 $dir/libLLVM.so.19.1 $dir/libclang-cpp.so.19.1"
for lib in $libs; do
	[ -e "$lib" ] || { echo "missing $lib" >&2; exit 1; }
done
script="for l in $libs; do python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' \$l; done"
for bin in "$@"; do
	work=$(mktemp -d)
	for run in cold warm; do
		start=$(date +%s.%N)
		MEMTRAIL_CACHE_DIR=$work/cache "$bin" --log debug run -q -o "$work/$run.json" \
			-- sh -c "$script" 2>"$work/$run.log"
		end=$(date +%s.%N)
		printf '%s %s %.1fs: ' "$bin" "$run" "$(echo "$end - $start" | bc)"
		grep -o "unwind tables: .*" "$work/$run.log" | sed "s/\x1b\[[0-9;]*m//g" || echo "(no account logged)"
	done
	rm -rf "$work"
done
