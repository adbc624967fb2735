# Shared by run.sh and test.sh: installs what the build needs when it is
# missing. Debian/Ubuntu only; elsewhere it says what to install.
set -euo pipefail

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "memtrail: this needs root (BPF programs, uprobes); rerun with sudo" >&2
    exit 72
  fi
}

have_clang() {
  [ -n "${CLANG:-}" ] && command -v "$CLANG" >/dev/null && return 0
  command -v clang-19 >/dev/null || command -v clang >/dev/null
}

# install_deps PACKAGE... : the build's own packages plus extra ones.
install_deps() {
  local missing=()
  have_clang || missing+=(clang-19)
  pkg-config --exists libelf 2>/dev/null || missing+=(libelf-dev)
  pkg-config --exists zlib 2>/dev/null || missing+=(zlib1g-dev)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v cc >/dev/null || missing+=(gcc)
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
      echo "memtrail: please install: ${missing[*]}" >&2
      exit 72
    fi
    echo "memtrail: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if ! command -v cargo >/dev/null; then
    echo "memtrail: cargo (Rust toolchain) not found; install it with rustup" >&2
    exit 72
  fi
}

# Kernel file systems the tests use (tracefs: the cleanup tests read its
# uprobe_events; memtrail itself needs neither).
mount_fs() {
  [ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
  mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
}

# left_behind TARGET_DIR : fails, naming them, if processes of this build
# (memtrail or a test fixture, by executable path) outlived the tests, or a
# tracked tree's process is still stopped. A leftover memtrail would keep
# its uprobes on the host's libc and disturb every later capture.
left_behind() {
  local target="$1" pid exe state found=0
  for pid in /proc/[0-9]*; do
    pid="${pid#/proc/}"
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || continue
    case "$exe" in
      "$target"/*)
        state="$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null)" || continue
        echo "memtrail: left behind by the tests: pid $pid ($exe, state $state)" >&2
        found=1
        ;;
    esac
  done
  [ "$found" -eq 0 ]
}
