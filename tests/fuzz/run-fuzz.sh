#!/bin/bash
# run-fuzz.sh: run the libFuzzer targets of a fuzz tree for a bounded time.
#
#   tests/fuzz/run-fuzz.sh [--build DIR] [--seconds N] (--all | TARGET...) [-- LIBFUZZER-ARGS...]
#
# DIR is the fuzz tree (default: $TSB_FUZZ_BUILD, else build-fuzz/ of this
# checkout; scripts/test.sh builds $TSB_BUILD-fuzz). Each TARGET (request,
# policy, letta_legacy, letta_binary, shape_result, spawn_wire, venv_archive,
# venv_manifest) runs for N seconds
# (default $TSB_FUZZ_SECONDS, else 30), starting from its seeds in
# tests/fuzz/corpus/TARGET/ plus what earlier runs found, kept in
# DIR/fuzz-corpus/TARGET/ (the checked-in seeds are never written to). Extra
# arguments after -- go to every target (-jobs=2, -use_value_profile=1, ...).
#
# A crash, a sanitizer report, a broken invariant, an input slower than
# -timeout or a run above -rss_limit_mb fails the target: its reproducer is
# saved as DIR/fuzz-artifacts/TARGET/crash-<sha1> (or timeout-, oom-,
# leak-, slow-unit-), the log as DIR/fuzz-logs/TARGET.log, and both are
# named on stderr with the command that replays it. Exit status: 0 when every
# target ran its time without a finding, 1 otherwise, 2 for bad usage.

set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${TSB_FUZZ_BUILD:-$src/build-fuzz}
seconds=${TSB_FUZZ_SECONDS:-30}
all=0
targets=()
extra=()

# Every target, and the longest input each gets (-max_len): room for the
# biggest seed, not much more, so that mutations stay dense.
declare -A max_len=(
  [request]=16384        # a request line with a script and arguments
  [policy]=16384         # policies/default.json is 2 KiB; inline profiles are bigger
  [letta_legacy]=16384   # stdout around a frame, and the payload
  [letta_binary]=16384
  [shape_result]=32768   # fixed fields, stderr, stdout, a nonce frame's payload
  [spawn_wire]=8192      # a run order with an environment; a compiled set of two policies
  [venv_archive]=65536   # a venv archive: within reach of its fuzz limits (256 entries, 16 KiB of files)
  [venv_manifest]=32768  # a builder's manifest: room for more values than it may hold (10,321: 21 KiB of "0,")
)
all_targets=(request policy letta_legacy letta_binary shape_result spawn_wire venv_archive venv_manifest)
# Targets whose every input makes and removes files: their private directory
# is on a tmpfs (/dev/shm) when there is one, made afresh for the run and
# removed after it (on a loaded ext4 disk each mkdir costs a millisecond,
# which keeps such a target at a few dozen runs a second).
declare -A on_tmpfs=([venv_archive]=1)

usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2
  exit 2
}
while (($#)); do
  case $1 in
    --build) build=${2:-}; shift 2 ;;
    --seconds) seconds=${2:-}; shift 2 ;;
    --all) all=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) usage ;;
    -*) echo "run-fuzz.sh: unknown option '$1'" >&2; usage ;;
    *) targets+=("$1"); shift ;;
  esac
done
((all)) && targets=("${all_targets[@]}")
((${#targets[@]})) || usage
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "run-fuzz.sh: --seconds / TSB_FUZZ_SECONDS must be a whole number of seconds, not '$seconds'" >&2; exit 2; }
for t in "${targets[@]}"; do
  [[ -n ${max_len[$t]:-} ]] || { echo "run-fuzz.sh: unknown target '$t' (known: ${all_targets[*]})" >&2; exit 2; }
done

log() { printf '==> [fuzz] %s\n' "$*" >&2; }
shm=""
drop_shm() {
  if [[ -n $shm ]]; then
    chmod -R u+rwx -- "$shm" 2>/dev/null
    rm -rf -- "$shm"
    shm=""
  fi
}
trap 'drop_shm; exit 130' INT TERM

failed=()
for t in "${targets[@]}"; do
  bin=$build/bin/fuzz_$t
  [[ -x $bin ]] || { log "missing $bin (build the fuzz tree: scripts/lib.sh build_fuzz, or tests/README.md)"; failed+=("$t (not built)"); continue; }
  seeds=$here/corpus/$t
  work=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  logfile=$build/fuzz-logs/$t.log
  # The policy and venv_archive targets write to a private temporary
  # directory: kept under the tree, and emptied first, so a crashed run
  # leaves nothing in /tmp; or a fresh one on a tmpfs (on_tmpfs), removed
  # after the run.
  scratch=$build/fuzz-tmp/$t
  # (A venv a crash left is read-only: writable again first.)
  [[ -d $scratch ]] && chmod -R u+rwx -- "$scratch" 2>/dev/null
  rm -rf -- "$scratch"
  if [[ -n ${on_tmpfs[$t]:-} && -d /dev/shm && -w /dev/shm ]] && [[ $(stat -f -c %T /dev/shm 2>/dev/null) == tmpfs ]]; then
    shm=$(mktemp -d /dev/shm/tsb-fuzz-"$t"-XXXXXX) && scratch=$shm || shm=""
  fi
  mkdir -p "$work" "$artifacts" "$scratch" "$(dirname "$logfile")"
  args=(-max_total_time="$seconds" -max_len="${max_len[$t]}" -rss_limit_mb=2048 -timeout=10
        -artifact_prefix="$artifacts/" -print_final_stats=1 -detect_leaks=1)
  [[ -f $here/dict/$t.dict ]] && args+=(-dict="$here/dict/$t.dict")
  started=$SECONDS
  TMPDIR=$scratch "$bin" "${args[@]}" "${extra[@]}" "$work" "$seeds" >"$logfile" 2>&1
  rc=$?
  drop_shm
  took=$((SECONDS - started))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logfile" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' "$logfile" | tail -1)
  if ((rc == 0)); then
    log "$t: ok, ${execs:-?} runs in ${took}s (${cov:-no coverage line}), corpus $work"
    continue
  fi
  failed+=("$t")
  repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$logfile" | tail -1)
  log "$t: FAILED (libFuzzer status $rc after ${took}s); the end of $logfile:"
  grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|INITED|RELOAD)' "$logfile" | tail -60 | sed 's/^/    /' >&2
  if [[ -n $repro ]]; then
    log "$t: reproducer: $repro"
    log "$t: replay it with: $bin $repro"
  else
    log "$t: no reproducer was written (see $logfile)"
  fi
done

if ((${#failed[@]})); then
  log "fuzz targets with findings: ${failed[*]} (reproducers under $build/fuzz-artifacts/)"
  exit 1
fi
exit 0
