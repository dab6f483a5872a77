#!/usr/bin/env bash
# The root integration tier, N times in a row, under a parallel CPU load:
# the test for races that only show on a busy machine (CI runs on one).
#
#   ./scripts/soak.sh [--runs N] [--workers W] [-- GTEST-ARGS...]
#
# N defaults to 10. The load is stress-ng with W CPU workers (default: two
# per core), started before the first round and stopped after the last.
# Each round is the root tier exactly as scripts/test.sh runs it (inside
# the outer guard, scripts/lib.sh run_root_tier); its output goes to
# $TSB_BUILD/soak/round-K.log. Prints one line per round with its result,
# wall time and load average, and "K/N rounds passed" at the end. Exit
# status 0 only when every round passed.
source "$(dirname "$0")/lib.sh"

runs=10
workers=$((2 * $(nproc)))
extra=()
while (($#)); do
  case $1 in
    --runs) runs=${2:?}; shift 2 ;;
    --workers) workers=${2:?}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--runs N] [--workers W] [-- GTEST-ARGS...]" >&2; exit 2 ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ && $workers =~ ^[0-9]+$ ]] || { echo "soak.sh: --runs and --workers take numbers" >&2; exit 2; }

setup_all
logs="$TSB_BUILD/soak"
mkdir -p "$logs"

load_pid=
stop_load() { [ -n "$load_pid" ] && kill "$load_pid" 2>/dev/null && wait "$load_pid" 2>/dev/null; load_pid=; }
trap stop_load EXIT
if ((workers > 0)); then
  stress-ng --cpu "$workers" --cpu-method all --quiet &
  load_pid=$!
  log "CPU load: stress-ng --cpu $workers (pid $load_pid) on $(nproc) cores"
  sleep 5
fi

passed=0
for ((k = 1; k <= runs; k++)); do
  started=$SECONDS
  if run_root_tier "$TSB_BUILD" "${extra[@]}" >"$logs/round-$k.log" 2>&1; then
    result=passed
    passed=$((passed + 1))
  else
    result="FAILED: $(grep -E '^ *[0-9]+ FAILED TESTS?$' "$logs/round-$k.log" | tr -s ' ') ($logs/round-$k.log)"
  fi
  log "round $k/$runs: $result in $((SECONDS - started)) s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
stop_load
log "$passed/$runs rounds passed"
((passed == runs))
