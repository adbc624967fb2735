# Sourced by the perf scripts, from the repository's top directory.

# builds_from_args [MEMTRAIL...]: the memtrail builds to compare, in the
# array `builds`: those given, else this checkout's release build.
builds_from_args() {
  if [ $# -eq 0 ]; then
    cargo build --release --quiet
    builds=("$PWD/target/release/memtrail")
  else
    builds=("$@")
  fi
}

# memtrail_from_env: the build in $MEMTRAIL (a path), else this checkout's
# release build; its full path in `mt`.
memtrail_from_env() {
  if [ -z "${MEMTRAIL:-}" ]; then
    cargo build --release --quiet
    MEMTRAIL=target/release/memtrail
  fi
  mt=$(realpath "$MEMTRAIL")
}

# scratch_dir NAME: a temporary directory in the variable NAME, removed
# when the script exits.
scratch_dir() {
  local dir
  dir=$(mktemp -d)
  printf -v "$1" '%s' "$dir"
  # shellcheck disable=SC2064 # the path is fixed now
  trap "rm -rf '$dir'" EXIT
}

# The Python churn workload of the python_frames scripts, from their
# arguments [PYTHON [OPS [DEPTH [N]]]]: sets work (the command) and n (runs
# or rounds, default 5); PYTHONMALLOC=malloc unless PYMALLOC=1.
python_churn_from_args() {
	local python=${1:-/usr/bin/python3.11} ops=${2:-200000} depth=${3:-10}
	n=${4:-5}
	if [ -z "${PYMALLOC:-}" ]; then
		export PYTHONMALLOC=malloc
	fi
	work=("$python" perf/fixtures/python_churn.py "$ops" "$depth")
}
