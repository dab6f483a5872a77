#!/bin/bash
# run-lane.sh: the whole cgroup v2 lane in one command (docs/VM-LANE.md).
#
#   tests/vm/run-lane.sh [--build DIR] [--only integration|egress|systemd] [--no-build] [--quick]
#
# 1. Builds DIR (default build-vm/ of this checkout, or $TSB_VM_BUILD);
#    a new DIR is configured with -DCMAKE_INSTALL_PREFIX=/usr, as a package
#    is; an existing one keeps its prefix (the systemd part installs at that
#    prefix). Incremental: cheap when up to date. --no-build skips this step
#    (scripts/test.sh passes its own, already built, tree).
# 2. Boots the v2-only VM and runs the root integration tests inside the
#    outer guard (tests/guard/run-guarded), with
#      TSB_EXPECT_CGROUP=v2             the cgroup v2 tests may not skip;
#      TOOLSANDBOXD_TESTS_MUST_RUN=root no root test may skip.
#    Every test runs in full, NothingLeftBehindAfter500Runs included (about
#    40 s of the lane at low load). --quick passes TSB_LEAK_TEST_RUNS=100:
#    that test then does 100 runs and says so on stderr, and the summary
#    says so too. The gtest XML report is kept in the results directory.
# 3. Boots the VM again and runs the egress reachability tests
#    (tests/egress) inside the outer guard with a network namespace of its
#    own, as the test command does on the host: the daemon's proxy, its
#    deny list and its caps on cgroup v2.
# 4. Boots the VM with systemd as PID 1 and runs tests/vm/systemd-lane.sh:
#    install, sysusers, tmpfiles, socket activation, delegation, stop.
#
# Prints each phase's result and wall time; exit status 0 only when every
# phase passed. Results (logs, XML) go to $TSB_VM_RESULTS, default
# DIR/vm-lane-results/ (replaced on each run).
#
# Environment: VM_LANE_ACCEL etc. as for vm-run; TSB_VM_TIMEOUT (seconds for
# the integration VM, default 2400), TSB_VM_EGRESS_TIMEOUT (default 900),
# TSB_VM_SYSTEMD_TIMEOUT (default 900).

set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${TSB_VM_BUILD:-$src/build-vm}
only="" do_build=1 quick=0

usage() {
	sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	--no-build) do_build=0; shift ;;
	--quick) quick=1; shift ;;
	-h | --help) usage ;;
	*) echo "run-lane.sh: unknown argument '$1'" >&2; usage ;;
	esac
done
case $only in "" | integration | egress | systemd) ;; *) usage ;; esac
[ "$(id -u)" = 0 ] || { echo "run-lane.sh: run as root (the VM lane installs packages and shares the host read-write)" >&2; exit 2; }
build=$(mkdir -p "$build" && cd "$build" && pwd)
results=${TSB_VM_RESULTS:-$build/vm-lane-results}

log() { printf '==> [vm-lane] %s\n' "$*" >&2; }
now() { date +%s; }
elapsed() { local s=$(($(now) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

lane_start=$(now)
summary=()
status=0

if [ "$do_build" = 1 ]; then
	t=$(now)
	if [ ! -f "$build/CMakeCache.txt" ]; then
		log "configuring $build (prefix /usr)"
		cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr >/dev/null || exit 1
	fi
	log "building $build"
	cmake --build "$build" -j "$(nproc)" >"$build/vm-lane-build.log" 2>&1 ||
		{ tail -30 "$build/vm-lane-build.log"; log "build failed (log: $build/vm-lane-build.log)"; exit 1; }
	summary+=("build: $(elapsed "$t")")
fi
needed="toolsandboxd toolsandbox toolsandbox-init"
[ "$only" = systemd ] || needed="$needed integration_tests tsb-probe"
for f in $needed; do
	[ -x "$build/bin/$f" ] || { log "missing $build/bin/$f (build first, or drop --no-build)"; exit 1; }
done
[ -x /var/lib/toolsandbox/venv/bin/python3 ] ||
	{ log "the default venv /var/lib/toolsandbox/venv is missing (scripts/test.sh creates it)"; exit 1; }

rm -rf "$results"
mkdir -p "$results"
# The checkout and the build tree stay visible in the guest and in the guard
# even when they live under /tmp or /run, which both mount fresh.
keep=(--keep "$src" --keep "$build")
"$here/vm-run" --prepare >/dev/null || { log "vm-run --prepare failed"; exit 1; }

if [ -z "$only" ] || [ "$only" = integration ]; then
	log "integration tests in the v2 VM, inside the outer guard (3-8 min under emulation)"
	t=$(now)
	quick_env=()
	if [ "$quick" = 1 ]; then
		quick_env=(--env TSB_LEAK_TEST_RUNS=100)
		summary+=("NOTE --quick: NothingLeftBehindAfter500Runs did 100 runs, not 500")
	fi
	"$here/vm-run" --verbose --timeout "${TSB_VM_TIMEOUT:-2400}" "${keep[@]}" --rw "$results" \
		--env TSB_EXPECT_CGROUP=v2 --env TOOLSANDBOXD_TESTS_MUST_RUN=root "${quick_env[@]}" \
		-- "$src/tests/guard/run-guarded" --mem 1536M --pids 4096 --ro "$src" --ro "$build" --rw "$results" -- \
		"$build/bin/integration_tests" --gtest_brief=1 --gtest_output="xml:$results/integration.xml" \
		> >(tee "$results/integration.log") 2>&1
	rc=$?
	summary+=("integration tests (v2, guarded): $([ $rc = 0 ] && echo passed || echo "FAILED ($rc)"), $(elapsed "$t")")
	[ $rc = 0 ] || status=1
	if [ -f "$results/integration.xml" ]; then
		summary+=("  $(grep -o '<testsuites tests="[0-9]*" failures="[0-9]*" disabled="[0-9]*" errors="[0-9]*"' "$results/integration.xml" | tr -d '<')")
		skipped=$(grep -c 'result="skipped"' "$results/integration.xml")
		summary+=("  skipped: $skipped")
	fi
fi

if [ -z "$only" ] || [ "$only" = egress ]; then
	log "egress reachability tests in the v2 VM, inside the outer guard, in network namespaces of their own"
	t=$(now)
	"$here/vm-run" --verbose --timeout "${TSB_VM_EGRESS_TIMEOUT:-900}" "${keep[@]}" --rw "$results" \
		--env TSB_EXPECT_CGROUP=v2 --env "TSB_BUILD=$build" \
		-- "$src/tests/guard/run-guarded" --net --mem 2G --pids 4096 --ro "$src" --ro "$build" --rw "$results" -- \
		/usr/bin/python3 -m pytest -q -p no:cacheprovider --junitxml="$results/egress.xml" "$src/tests/egress" \
		> >(tee "$results/egress.log") 2>&1
	rc=$?
	summary+=("egress tests (v2, guarded): $([ $rc = 0 ] && echo passed || echo "FAILED ($rc)"), $(elapsed "$t") ($(grep -E '[0-9]+ (passed|failed)' "$results/egress.log" | tail -1))")
	[ $rc = 0 ] || status=1
fi

if [ -z "$only" ] || [ "$only" = systemd ]; then
	log "systemd units in the v2 VM (systemd as PID 1)"
	t=$(now)
	"$here/vm-run" --systemd --verbose --timeout "${TSB_VM_SYSTEMD_TIMEOUT:-900}" "${keep[@]}" -- \
		"$here/systemd-lane.sh" "$build" > >(tee "$results/systemd.log") 2>&1
	rc=$?
	summary+=("systemd units: $([ $rc = 0 ] && echo passed || echo "FAILED ($rc)"), $(elapsed "$t") ($(grep -E '^[0-9]+ passed, [0-9]+ failed' "$results/systemd.log" | tail -1))")
	[ $rc = 0 ] || status=1
fi

log "summary (results in $results):"
for line in "${summary[@]}"; do log "  $line"; done
log "  total: $(elapsed "$lane_start")"
exit $status
