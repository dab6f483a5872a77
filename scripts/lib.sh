# Shared by scripts/*.sh: installs what the project needs from Debian's
# archive, creates the default venv, builds. Source it; do not run it.
set -euo pipefail

TSB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TSB_BUILD="${TSB_BUILD:-$TSB_ROOT/build}"
TSB_VENV="${TSB_VENV:-/var/lib/toolsandbox/venv}"
# The sanitizer tree (gcc, -DTSB_SANITIZE=address,undefined) and the fuzz
# tree (clang-14, -DTSB_FUZZ=ON), next to the main one.
TSB_ASAN_BUILD="${TSB_ASAN_BUILD:-$TSB_BUILD-asan}"
TSB_FUZZ_BUILD="${TSB_FUZZ_BUILD:-$TSB_BUILD-fuzz}"

# Debian 12 packages. Build: compiler, cmake, libraries. Run: python3 and
# venv for the default venv. The egress tests' tools: pip, requests, curl,
# and openssl for their servers' certificate. Tests and benchmarks: bubblewrap (reference),
# util-linux (outer guard), qemu/busybox/kmod (cgroup v2 VM lane), strace,
# stress-ng (the CPU load of scripts/soak.sh).
# Fuzzing: clang-14 with its runtimes (libclang-rt-14-dev holds libFuzzer
# and clang's sanitizer runtimes; clang-14 only recommends it) and llvm-14
# for llvm-symbolizer (symbolised stacks in sanitizer reports). gcc's own
# sanitizer runtimes (libasan8, libubsan1) come with build-essential.
TSB_PACKAGES=(
  build-essential cmake pkg-config
  libseccomp-dev libcap-dev nlohmann-json3-dev libasio-dev libspdlog-dev
  libgtest-dev libgmock-dev libcurl4-openssl-dev libssl-dev libsystemd-dev
  python3 python3-venv python3-pytest python3-pip python3-requests curl openssl
  bubblewrap util-linux procps iproute2
  qemu-system-x86 busybox-static kmod
  clang-14 libclang-rt-14-dev llvm-14
  stress-ng acl
  nodejs esbuild node-typescript node-acorn
)

# Sanitizer findings abort with a report and a non-zero status. halt_on_error
# also stops ASan after its first report; LeakSanitizer runs at exit
# (detect_leaks); UBSan prints the stack of each finding. Set before any
# sanitized program runs, kept if the caller set them.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"

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
  # npm, which builds TypeScript tools' node_modules: a nodejs that does
  # not carry it (Debian's own) gets Debian's npm package.
  if [ ! -f /usr/lib/node_modules/npm/bin/npm-cli.js ] && [ ! -f /usr/share/nodejs/npm/bin/npm-cli.js ]; then
    log "installing: npm"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
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
  # Letta's script mode serializes results with pydantic 2, which Debian 12
  # does not package: installed from the wheel directory when an operator
  # put its wheels there, else said (docs/CONFIGURATION.md, "The default venv").
  if ! "$TSB_VENV/bin/python3" -c 'import pydantic, sys; sys.exit(int(pydantic.VERSION.split(".")[0]) < 2)' 2>/dev/null; then
    if ls /var/lib/toolsandbox/wheels/pydantic-2*.whl >/dev/null 2>&1; then
      log "installing pydantic 2 into the default venv from /var/lib/toolsandbox/wheels"
      "$TSB_VENV/bin/pip" install --quiet --no-index --find-links /var/lib/toolsandbox/wheels 'pydantic>=2'
    else
      log "note: the default venv has no pydantic 2 (Debian 12 packages none): Letta's script-mode results come back as strings, tool mode's are typed (docs/CONFIGURATION.md, \"The default venv\")"
    fi
  fi
}

# Test-only: the MCP SDK and the reference MCP servers the session tests
# drive (tests/sessions), from the npm registry, exactly as
# tests/sessions/mcp/package-lock.json pins them (npm ci, no install
# scripts), into a directory of their own that nothing else reads. Done
# again only when the lock changes; the tests then run offline.
TSB_TEST_MCP_DIR=/var/lib/toolsandbox-test/mcp
install_test_mcp() {
  local lock="$TSB_ROOT/tests/sessions/mcp/package-lock.json" stamp="$TSB_TEST_MCP_DIR/.lock.sha256" want
  want=$(sha256sum "$lock" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$TSB_TEST_MCP_DIR/node_modules" ]; then return 0; fi
  log "installing the MCP SDK and reference servers (test-only) into $TSB_TEST_MCP_DIR"
  rm -rf "$TSB_TEST_MCP_DIR"
  install -d -m 0755 "$TSB_TEST_MCP_DIR"
  cp "$TSB_ROOT/tests/sessions/mcp/package.json" "$lock" "$TSB_TEST_MCP_DIR/"
  (cd "$TSB_TEST_MCP_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  # Readable by the sandboxes' ids, writable by root only.
  chmod -R go-w,a+rX "$TSB_TEST_MCP_DIR"
  echo "$want" >"$stamp"
}

# The users of systemd/toolsandboxd.sysusers, for runs outside systemd (the
# tests, the command line): the toolsandboxd user, whose uid the daemon's
# unprivileged front end runs as, and the toolsandbox group of the socket.
# useradd/groupadd are Debian's passwd package (essential).
make_users() {
  getent group toolsandbox >/dev/null || { log "creating the toolsandbox group"; groupadd --system toolsandbox; }
  if ! getent passwd toolsandboxd >/dev/null; then
    log "creating the toolsandboxd system user (the daemon's front end)"
    useradd --system --user-group --no-create-home --home-dir / --shell /usr/sbin/nologin \
      --comment "toolsandboxd front end" toolsandboxd
  fi
}

# The per-tool venv cache (venvs.cache_dir), as toolsandboxd.tmpfiles makes
# it: the front end's own directory; and the default policy's wheels.
make_venv_cache() {
  install -d -m 0711 -o root -g root /var/cache/toolsandbox
  install -d -m 0755 -o toolsandboxd -g toolsandboxd /var/cache/toolsandbox/venvs
  # The wheels and npm tarballs the default policy's builds install from
  # (packages.wheels, typescript.packages.tarballs).
  install -d -m 0755 -o root -g root /var/lib/toolsandbox/wheels /var/lib/toolsandbox/npm
}

# The daemon's front end runs as the toolsandboxd user and reads the runner
# the test daemons name in the checkout (it reads no configuration or
# policy file: the compile helper hands it those): from a checkout
# under a private directory (/root) that user gets through, read-only, by
# an ACL entry for it alone on each directory in the way. Nothing else
# changes, and a checkout it can already read is left as it is.
as_front_end() { setpriv --reuid=toolsandboxd --regid=toolsandboxd --clear-groups -- "$@"; }
grant_front_end_access() {
  local top d
  for top in "$TSB_ROOT" "$TSB_BUILD"; do
    d=$top
    while [ "$d" != / ] && [ -n "$d" ]; do
      if [ -d "$d" ] && ! as_front_end test -x "$d"; then
        log "letting the toolsandboxd user through $d (ACL u:toolsandboxd:x)"
        setfacl -m u:toolsandboxd:x "$d"
      fi
      d=$(dirname "$d")
    done
  done
  for d in isolate/runner; do
    if ! as_front_end test -r "$TSB_ROOT/$d/." || [ -n "$(as_front_end find "$TSB_ROOT/$d" ! -readable 2>/dev/null | head -1)" ]; then
      log "letting the toolsandboxd user read $TSB_ROOT/$d (ACL u:toolsandboxd:rX)"
      setfacl -R -m u:toolsandboxd:rX "$TSB_ROOT/$d"
    fi
  done
}

# build [TARGET...]: everything, or only the targets named.
build() {
  log "building in $TSB_BUILD${1:+ ($*)}"
  cmake -S "$TSB_ROOT" -B "$TSB_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$TSB_BUILD" -j "$(nproc)" ${1:+--target "$@"}
}

# What the daemon and the command line need, and nothing of the tests:
# what scripts/start.sh builds.
TSB_PROGRAMS=(toolsandboxd toolsandboxd-frontend toolsandbox toolsandbox-init tsb_runner_bytecode)

# The sanitizer and fuzz trees are built with -O1 -g1 and asserts on: line
# tables are all a sanitizer report needs, and on the 2-core CI machine this
# halves their compile time against -O2 -g (measured in tests/README.md).
TSB_CHECK_FLAGS="-O1 -g1"

# The sanitizer tree: only what its tests run (no benchmarks).
build_asan() {
  log "building the sanitizer tree in $TSB_ASAN_BUILD (address,undefined)"
  cmake -S "$TSB_ROOT" -B "$TSB_ASAN_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$TSB_CHECK_FLAGS" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$TSB_CHECK_FLAGS" \
    -DTSB_SANITIZE=address,undefined >/dev/null
  cmake --build "$TSB_ASAN_BUILD" -j "$(nproc)" --target unit_tests integration_tests
}

# The fuzz tree: the libraries and the libFuzzer targets, with clang-14.
build_fuzz() {
  log "building the fuzz targets in $TSB_FUZZ_BUILD (clang-14, libFuzzer, address,undefined)"
  CC=clang-14 CXX=clang++-14 cmake -S "$TSB_ROOT" -B "$TSB_FUZZ_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$TSB_CHECK_FLAGS" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$TSB_CHECK_FLAGS" \
    -DTSB_FUZZ=ON >/dev/null
  cmake --build "$TSB_FUZZ_BUILD" -j "$(nproc)"
}

# ---------------------------------------------------------------------------
# Test tiers, shared by scripts/test.sh and CTest (tests/CMakeLists.txt), so
# that both run each tier the same way.

# The outer guard for the root tiers, keeping the checkout and the build tree
# visible at their own paths even when they live under /tmp or /run (which
# the guard covers with fresh tmpfs).
guarded() {
  local build=$1
  shift
  "$TSB_ROOT/tests/guard/run-guarded" --mem $((4 << 30)) --pids 4096 --ro "$TSB_ROOT" --ro "$build" -- "$@"
}

# The CgroupV2Test suite proves the cgroup v2 paths (CLONE_INTO_CGROUP,
# cgroup.kill, memory.events, memory.peak, delegation). On a host without a
# v2 hierarchy with controllers it cannot run here: it is left out by name,
# not skipped, and runs in the VM lane (tests/vm/run-lane.sh).
root_tier_filter() {
  if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo "*"
  else
    log "this host's cgroups are v1/hybrid: CgroupV2Test runs in the cgroup v2 VM lane (tests/vm/run-lane.sh), not here"
    echo "-CgroupV2Test.*"
  fi
}

# run_root_tier BUILD: the root integration tests, inside the outer guard.
# Further arguments go to integration_tests (a later --gtest_filter wins).
run_root_tier() {
  local build=${1:-$TSB_BUILD} filter
  (($#)) && shift
  filter=$(root_tier_filter)
  guarded "$build" "$build/bin/integration_tests" --gtest_brief=1 --gtest_filter="$filter" "$@"
}

# run_egress_tier [BUILD]: the egress reachability tests (tests/egress),
# inside the outer guard with a network namespace of its own (--net: only
# lo). The tests build their own namespaces below it: a daemon and a
# "world" of test servers, with no route anywhere else.
run_egress_tier() {
  local build=${1:-$TSB_BUILD}
  TSB_BUILD=$build "$TSB_ROOT/tests/guard/run-guarded" --net --mem $((4 << 30)) --pids 4096 --ro "$TSB_ROOT" \
    --ro "$build" -- /usr/bin/python3 -m pytest -q -p no:cacheprovider "$TSB_ROOT/tests/egress"
}

# run_sessions_tier [BUILD]: the session tests (tests/sessions: the raw
# protocol, toolsandbox session, the MCP SDK and reference servers, and
# commands that fork, flood or never read), inside the outer guard with a
# network namespace of its own (only lo): nothing of them reaches the host's
# processes or network. The MCP packages (install_test_mcp) are read there.
run_sessions_tier() {
  local build=${1:-$TSB_BUILD}
  TSB_BUILD=$build "$TSB_ROOT/tests/guard/run-guarded" --net --mem $((4 << 30)) --pids 4096 --ro "$TSB_ROOT" \
    --ro "$build" --ro "$TSB_TEST_MCP_DIR" -- /usr/bin/python3 -m pytest -q -p no:cacheprovider "$TSB_ROOT/tests/sessions"
}

# The integration tests the sanitizer tier runs: the engine's parent side
# (every lifecycle path, 50 runs of the leak test, the memory and pids
# limits, whose cgroups the sanitized engine sets up) and the daemon end to
# end (its request parsing, framing and result shaping, on a real socket).
TSB_ASAN_INTEGRATION_TESTS=(
  EngineTest.MissingCommandIsASetupFailureAtExecve
  EngineTest.CommandIsSearchedInPath
  EngineTest.MissingVenvIsASetupFailureNamingTheStage
  EngineTest.SpawnWithoutSeccompIsRefused
  EngineTest.ExitCodesAndSignalsPassThrough
  EngineTest.ConcurrentRunsGetDistinctHostUids
  EngineTest.NothingLeftBehindAfter500Runs
  EngineTest.MemoryBombEndsAsOom
  EngineTest.ForkBombStopsAtThePidsLimit
  'EngineTest.Daemon*'
  'EngineTest.Privsep*'
)
# Left out of that subset, each for a reason the sanitizers impose:
TSB_ASAN_INTEGRATION_EXCLUDED=(
  # They measure the daemon's memory against a request's or a budget's
  # size, which ASan's redzones and quarantine inflate by design.
  EngineTest.DaemonLimitsConnectionCapAndBudgetBoundMemory
  EngineTest.DaemonLimitsMaximalRunToolRequestPeakMemory
  EngineTest.DaemonLimitsUnreadAnswersAreDroppedAfterWriteTimeout
  # It runs the daemon out of descriptors. The sanitizer runtime checks
  # that memory is readable through a pipe(2), so with no descriptor left
  # UBSan's vptr check reports every not-yet-cached object as having an
  # "invalid vptr": a false finding, not the daemon's.
  EngineTest.DaemonLimitsOutOfDescriptorsBacksOffAndRecovers
)

# Whether a line of stdin matches the glob $1.
glob_matches_a_line() {
  local line
  while IFS= read -r line; do
    # shellcheck disable=SC2053  # a glob on purpose
    [[ $line == $1 ]] && return 0
  done
  return 1
}

# Unit tests left out under the sanitizers: they measure the allocator's
# peak memory against the request's size, which ASan's redzones and
# quarantine inflate by design.
TSB_ASAN_UNIT_EXCLUDED=(
  'RunnerRequestMemory.*'
)

# run_asan_unit_tier [BUILD]: the unit tests of the sanitizer tree.
run_asan_unit_tier() {
  local build=${1:-$TSB_ASAN_BUILD} filter
  filter=-$(IFS=:; echo "${TSB_ASAN_UNIT_EXCLUDED[*]}")
  log "left out under the sanitizers (they measure memory use): ${TSB_ASAN_UNIT_EXCLUDED[*]}"
  "$build/bin/unit_tests" --gtest_brief=1 --gtest_filter="$filter"
}

# run_asan_root_tier [BUILD]: the subset above, sanitized, inside the guard.
# Every name must still match a test: a renamed test must not silently
# shrink the subset.
run_asan_root_tier() {
  local build=${1:-$TSB_ASAN_BUILD} pattern listed
  listed=$("$build/bin/integration_tests" --gtest_list_tests | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }')
  for pattern in "${TSB_ASAN_INTEGRATION_TESTS[@]}" "${TSB_ASAN_INTEGRATION_EXCLUDED[@]}"; do
    if ! glob_matches_a_line "$pattern" <<<"$listed"; then
      log "the sanitizer subset names '$pattern', which matches no integration test (renamed? update scripts/lib.sh)"
      return 1
    fi
  done
  local filter
  filter=$(IFS=:; echo "${TSB_ASAN_INTEGRATION_TESTS[*]}")-$(IFS=:; echo "${TSB_ASAN_INTEGRATION_EXCLUDED[*]}")
  log "left out under the sanitizers (memory measurements, descriptor exhaustion): ${TSB_ASAN_INTEGRATION_EXCLUDED[*]}"
  TSB_LEAK_TEST_RUNS=50 guarded "$build" "$build/bin/integration_tests" --gtest_brief=1 --gtest_filter="$filter"
}

# run_fuzz_tier [BUILD]: every fuzz target for TSB_FUZZ_SECONDS (default 30)
# each; tests/fuzz/run-fuzz.sh says where a crash's reproducer is.
run_fuzz_tier() {
  local build=${1:-$TSB_FUZZ_BUILD}
  "$TSB_ROOT/tests/fuzz/run-fuzz.sh" --build "$build" --all
}

# setup_all [TARGET...]: the whole set-up; the build of only the targets
# named, if any.
setup_all() {
  require_root
  install_packages
  make_users
  make_venv
  make_venv_cache
  build "$@"
  grant_front_end_access
}
