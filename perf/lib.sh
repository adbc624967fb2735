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
