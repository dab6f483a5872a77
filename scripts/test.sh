#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test tier:
#   1. unit tests (need nothing), and the static checks: the root spawner's
#      size (scripts/count-root-code.sh), the layout (scripts/check-layout.sh:
#      the root's folders, per-folder budgets, function length), no bare
#      JSON parse (scripts/check-json-rule.sh), no error passed up without
#      context (scripts/check-error-idiom.py),
#   2. the installed systemd units, checked without booting (tests/systemd/verify.sh),
#   3. the outer guard's selftest (tests/guard/selftest.sh),
#   4. root integration tests: real sandboxes, inside the outer guard,
#   5. Python tests of the runner and the client, the session tests
#      (tests/sessions: MCP servers over stdio, inside the guard), and the
#      egress reachability tests (tests/egress, inside the guard, network
#      namespaces of their own),
#   6. sanitizers: a second tree ($TSB_BUILD-asan, -DTSB_SANITIZE=address,undefined)
#      runs the unit tests and an integration subset (scripts/lib.sh says which),
#   7. fuzzing: a clang-14 tree ($TSB_BUILD-fuzz, -DTSB_FUZZ=ON) runs each
#      libFuzzer target of tests/fuzz for TSB_FUZZ_SECONDS (default 30),
#   8. the cgroup v2 VM lane (tests/vm/run-lane.sh: the integration tests on a
#      v2-only kernel, and the systemd units booted): by default under CI=true
#      only (TSB_VM_LANE=1 runs it elsewhere too, TSB_SKIP_VM_LANE=1 skips it).
# Under CI=true a skipped root test is a failure (TOOLSANDBOXD_TESTS_MUST_RUN).
# TSB_SKIP_ASAN=1 and TSB_SKIP_FUZZ=1 skip tiers 6 and 7, loudly.
#
# Works from any checkout, /tmp included: the guard keeps the checkout and
# the build trees visible (run-guarded --ro). tests/README.md has the
# measured time of each tier.
source "$(dirname "$0")/lib.sh"
setup_all
install_test_mcp

if [ "${CI:-}" = "true" ]; then export TOOLSANDBOXD_TESTS_MUST_RUN="${TOOLSANDBOXD_TESTS_MUST_RUN:-root}"; fi

# Wall time of each tier, for the summary at the end.
timings=()
tier_started=0
tier() {
  log "$1"
  tier_name=$2
  tier_started=$SECONDS
}
tier_done() { timings+=("$(printf '%-26s %4ds' "$tier_name" $((SECONDS - tier_started)))"); }

tier "unit tests" unit
"$TSB_BUILD/bin/unit_tests" --gtest_brief=1
# The root spawner's code may shrink, never grow unnoticed: raising this
# ceiling is a change a reviewer sees (docs/SECURITY.md, "Privilege
# separation", says what the lines are).
"$TSB_ROOT/scripts/count-root-code.sh" --build "$TSB_BUILD" --max 3432
# The tree is the trust map: the root's folders hold what the root runs and
# nothing else, each folder of the unprivileged side keeps to its line
# budget, and no function grows past what a reviewer can hold.
"$TSB_ROOT/scripts/check-layout.sh" --build "$TSB_BUILD"
# JSON from outside the process goes through the bounded readers only
# (docs/HACKING.md): no bare nlohmann parse outside the listed trusted sites.
"$TSB_ROOT/scripts/check-json-rule.sh"
# Every error passed up says what its caller was doing (docs/ERRORS.md).
"$TSB_ROOT/scripts/check-error-idiom.py"
tier_done

tier "systemd units: systemd-analyze verify, sysusers.d, tmpfiles.d, toolsandboxd --check" systemd
verify_rc=0
"$TSB_ROOT/tests/systemd/verify.sh" "$TSB_BUILD" || verify_rc=$?
if [ "$verify_rc" = 77 ]; then log "systemd unit checks SKIPPED (a systemd tool is missing)"
elif [ "$verify_rc" != 0 ]; then exit "$verify_rc"; fi
tier_done

tier "outer guard selftest (tests/guard/selftest.sh)" guard-selftest
guard_rc=0
"$TSB_ROOT/tests/guard/selftest.sh" || guard_rc=$?
if [ "$guard_rc" = 77 ]; then log "outer guard selftest SKIPPED"
elif [ "$guard_rc" != 0 ]; then exit "$guard_rc"; fi
tier_done

tier "root integration tests (inside the outer guard)" root
run_root_tier "$TSB_BUILD"
tier_done

tier "python tests (runner, client, Letta adapter; end-to-end against a real daemon)" python
(cd "$TSB_ROOT" && TSB_BUILD="$TSB_BUILD" /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python)
tier_done

# The README as a newcomer types it, from a fresh clone under /tmp: the start
# command (it builds the programs of the clone), every console block's
# commands and answers, Ctrl-C, and the systemd section's build and install
# into a DESTDIR (a second build of the programs, prefix /usr).
if [ "${TSB_SKIP_README:-}" = 1 ]; then
  log "!!! SKIPPING the README tier (TSB_SKIP_README=1): the README's commands were not run"
else
  tier "the README's commands, from a fresh clone (tests/readme/check_readme.py)" readme
  /usr/bin/python3 "$TSB_ROOT/tests/readme/check_readme.py"
  tier_done
fi

tier "sessions: MCP servers over stdio (inside the outer guard, only loopback)" sessions
run_sessions_tier "$TSB_BUILD"
tier_done

tier "egress reachability (inside the outer guard, in network namespaces of its own)" egress
run_egress_tier "$TSB_BUILD"
tier_done

if [ "${TSB_SKIP_ASAN:-}" = 1 ]; then
  log "!!! SKIPPING the sanitizer tier (TSB_SKIP_ASAN=1): no ASan/UBSan run of the unit tests and the integration subset"
else
  tier "sanitizers: building $TSB_ASAN_BUILD" asan-build
  build_asan
  tier_done
  tier "sanitizers: unit tests under ASan and UBSan" asan-unit
  run_asan_unit_tier "$TSB_ASAN_BUILD"
  tier_done
  tier "sanitizers: integration subset under ASan and UBSan (inside the outer guard)" asan-root
  run_asan_root_tier "$TSB_ASAN_BUILD"
  tier_done
fi

if [ "${TSB_SKIP_FUZZ:-}" = 1 ]; then
  log "!!! SKIPPING the fuzz tier (TSB_SKIP_FUZZ=1): the libFuzzer targets of tests/fuzz did not run"
else
  tier "fuzzing: building $TSB_FUZZ_BUILD" fuzz-build
  build_fuzz
  tier_done
  tier "fuzzing: each target for ${TSB_FUZZ_SECONDS:-30} s (tests/fuzz/run-fuzz.sh)" fuzz
  run_fuzz_tier "$TSB_FUZZ_BUILD"
  tier_done
fi

# The cgroup v2 lane boots a VM under emulation: 5-10 minutes on the 2-core
# build machine (docs/VM-LANE.md has the measured times). It reuses this
# build; the VM sees it read-only.
if [ "${TSB_SKIP_VM_LANE:-}" = 1 ]; then
  log "!!! SKIPPING the cgroup v2 VM lane (TSB_SKIP_VM_LANE=1): CLONE_INTO_CGROUP, cgroup.kill,"
  log "!!! memory.events/memory.peak, delegation and the booted systemd units are NOT tested in this run"
elif [ "${CI:-}" = "true" ] || [ "${TSB_VM_LANE:-}" = 1 ]; then
  tier "cgroup v2 VM lane (tests/vm/run-lane.sh; 5-10 min under emulation)" vm-lane
  "$TSB_ROOT/tests/vm/run-lane.sh" --build "$TSB_BUILD" --no-build
  tier_done
else
  log "cgroup v2 VM lane not run (it runs under CI=true, or with TSB_VM_LANE=1; alone: tests/vm/run-lane.sh)"
fi

log "wall time per tier:"
for t in "${timings[@]}"; do log "  $t"; done
log "all tests passed"
