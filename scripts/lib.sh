# Shared by scripts/*.sh: installs what the project needs from Debian's
# archive, creates the default venv, builds. Source it; do not run it.
set -euo pipefail

TSB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TSB_BUILD="${TSB_BUILD:-$TSB_ROOT/build}"
TSB_VENV="${TSB_VENV:-/var/lib/toolsandbox/venv}"

# Debian 12 packages. Build: compiler, cmake, libraries. Run: python3 and
# venv for the default venv. Tests and benchmarks: bubblewrap (reference),
# util-linux (outer guard), qemu/busybox/kmod (cgroup v2 VM lane), strace.
TSB_PACKAGES=(
  build-essential cmake pkg-config
  libseccomp-dev libcap-dev nlohmann-json3-dev libasio-dev libspdlog-dev
  libgtest-dev libgmock-dev libcurl4-openssl-dev libssl-dev libsystemd-dev
  python3 python3-venv python3-pytest
  bubblewrap util-linux procps iproute2
  qemu-system-x86 busybox-static kmod
)

log() { printf '==> %s\n' "$*" >&2; }

require_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "error: run this as root (it installs packages and creates namespaces and cgroups)" >&2
    exit 1
  fi
}

install_packages() {
  local missing=()
  for p in "${TSB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The default venv of the embedded policies: Debian's own python3, so the
# sandbox (which binds /usr read-only) can run it. No network needed.
make_venv() {
  if [ ! -x "$TSB_VENV/bin/python3" ]; then
    log "creating the default venv at $TSB_VENV"
    mkdir -p "$(dirname "$TSB_VENV")"
    /usr/bin/python3 -m venv "$TSB_VENV"
  fi
  # Readable by the sandboxes' unprivileged ids, writable by root only.
  chmod 0755 "$(dirname "$TSB_VENV")" "$TSB_VENV"
}

build() {
  log "building in $TSB_BUILD"
  cmake -S "$TSB_ROOT" -B "$TSB_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$TSB_BUILD" -j "$(nproc)"
}

setup_all() {
  require_root
  install_packages
  make_venv
  build
}
