#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test tier:
#   1. unit tests (need nothing),
#   2. root integration tests: real sandboxes, inside the outer guard,
#   3. Python tests of the runner and the client.
# Under CI=true a skipped root test is a failure (TOOLSANDBOXD_TESTS_MUST_RUN).
source "$(dirname "$0")/lib.sh"
setup_all

if [ "${CI:-}" = "true" ]; then export TOOLSANDBOXD_TESTS_MUST_RUN="${TOOLSANDBOXD_TESTS_MUST_RUN:-root}"; fi

log "unit tests"
"$TSB_BUILD/bin/unit_tests" --gtest_brief=1

log "root integration tests (inside the outer guard)"
"$TSB_ROOT/tests/guard/run-guarded" --mem $((4 << 30)) --pids 4096 -- \
  "$TSB_BUILD/bin/integration_tests" --gtest_brief=1

log "python tests (runner, client, Letta adapter; end-to-end against a real daemon)"
(cd "$TSB_ROOT" && TSB_BUILD="$TSB_BUILD" /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python)
log "all tests passed"
