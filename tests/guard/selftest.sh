#!/bin/bash
# Conditions are single-quoted on purpose: expect() evaluates them later,
# and the variables they read are set only for that.
# shellcheck disable=SC2016,SC2034

# Proves that tests/guard/run-guarded holds: each check runs something
# hostile inside the guard and looks at the host afterwards.
#
#   tests/guard/selftest.sh            # needs root
#
# Prints one "ok"/"not ok" line per check (TAP) and exits 1 if any failed.
# Without root or util-linux it skips (exit 77) unless
# TOOLSANDBOXD_TESTS_MUST_RUN names the "root" tier, in which case the skip
# is a failure.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUARD=$HERE/run-guarded
MARK=tsb-guard-selftest-$$
PY=/usr/bin/python3

skip_all() {
  if [[ ,${TOOLSANDBOXD_TESTS_MUST_RUN:-}, == *,root,* ]]; then
    echo "Bail out! $1 (TOOLSANDBOXD_TESTS_MUST_RUN includes root)"
    exit 1
  fi
  echo "1..0 # SKIP $1"
  exit 77
}
((EUID == 0)) || skip_all "needs root"
for t in unshare setpriv "$PY"; do
  command -v "$t" >/dev/null || skip_all "missing $t"
done

TMP=$(mktemp -d /tmp/tsb-guard-selftest.XXXXXX)
SENTINEL=""
cleanup() {
  [[ -n $SENTINEL ]] && kill "$SENTINEL" 2>/dev/null
  rm -rf -- "$TMP"
}
trap cleanup EXIT

n=0 failed=0
ok() {
  n=$((n + 1))
  echo "ok $n - $1"
}
not_ok() {
  n=$((n + 1))
  failed=$((failed + 1))
  echo "not ok $n - $1"
  shift
  local l
  for l in "$@"; do echo "#   $l"; done
}
# check NAME CONDITION-COMMAND... [-- DIAGNOSTIC]
expect() {
  local name=$1 cond=$2
  shift 2
  if eval "$cond"; then ok "$name"; else not_ok "$name" "condition: $cond" "$@"; fi
}

# A process that sleeps with the marker on its command line.
SLEEPER=("$PY" -c 'import time; time.sleep(1000)' "$MARK")

# The sleeper itself, once it runs (not the guard that carries its argv).
sleeping() { pgrep -f -- "^$PY -c import time; time.sleep.* $MARK\$" || true; }

# Processes whose command line carries this run's marker.
marked() { pgrep -f -- "$MARK" | grep -vx "$$" || true; }

# Cgroups of guards that are gone (tsb-guard-PID, PID no longer running),
# under the cgroups this shell sits in: what a guard must sweep. A guard
# running beside this test (another test tier, a benchmark) is not one.
guard_cgroups() {
  local ctrls path mp cg
  while IFS=: read -r _ ctrls path; do
    for mp in /sys/fs/cgroup/"${ctrls#name=}" /sys/fs/cgroup/unified /sys/fs/cgroup; do
      [[ -d $mp$path ]] || continue
      for cg in "$mp${path%/}"/tsb-guard-*; do
        [[ -d $cg ]] && ! kill -0 "${cg##*-}" 2>/dev/null && echo "$cg"
      done
    done
  done </proc/self/cgroup | sort -u
}

echo "# guard: $GUARD"
# A first run also sweeps what earlier killed guards left, so that "before"
# is the clean state.
"$GUARD" -- true || { echo "Bail out! the guard does not start"; exit 1; }
cgroups_before=$(guard_cgroups)

# --- file system -------------------------------------------------------------
out=$("$GUARD" -- sh -c '
  if echo x >/etc/'"$MARK"' 2>/dev/null; then echo etc=writable; else echo etc=ro; fi
  if mkdir /'"$MARK"' 2>/dev/null; then echo root=writable; else echo root=ro; fi
  if echo x >/tmp/inner 2>/dev/null; then echo tmp=writable; else echo tmp=ro; fi
  if [ -e '"$TMP"' ]; then echo host_tmp=visible; else echo host_tmp=hidden; fi
  if [ -w /sys/kernel ]; then echo sys=writable; else echo sys=ro; fi
' 2>&1)
expect "writing to /etc fails inside" '[[ $out == *etc=ro* && ! -e /etc/$MARK ]]' "$out"
expect "creating a directory in / fails inside" '[[ $out == *root=ro* && ! -e /$MARK ]]' "$out"
expect "/tmp inside is a fresh writable tmpfs" '[[ $out == *tmp=writable* && $out == *host_tmp=hidden* && ! -e /tmp/inner ]]' "$out"
expect "/sys is read-only inside" '[[ $out == *sys=ro* ]]' "$out"

mkdir "$TMP/out"
"$GUARD" --rw "$TMP/out" -- sh -c "echo from-inside >$TMP/out/file && echo x >$TMP/beside"
rc=$?
expect "--rw directory under /tmp is writable and shared with the host" \
  '[[ $rc == 0 && $(cat "$TMP/out/file" 2>/dev/null) == from-inside && ! -e $TMP/beside ]]' "rc=$rc"
# --ro: a checkout or build tree under /tmp stays visible at its own path,
# read-only, and its programs run; a --rw directory inside it is writable.
mkdir -p "$TMP/tree/bin" "$TMP/tree/out"
printf '#!/bin/sh\necho ran-from-tree\n' >"$TMP/tree/bin/prog"
chmod 0755 "$TMP/tree/bin/prog"
out=$("$GUARD" --ro "$TMP/tree" --rw "$TMP/tree/out" -- sh -c "
  $TMP/tree/bin/prog
  if echo x >$TMP/tree/new 2>/dev/null; then echo tree=writable; else echo tree=ro; fi
  echo inside >$TMP/tree/out/file && echo out=rw
  if echo x >/tmp/beside 2>/dev/null; then echo tmp=writable; fi
  echo ro_dirs=\$TSB_GUARD_RO_DIRS" 2>&1)
expect "--ro directory under /tmp is visible read-only and its programs run" \
  '[[ $out == *ran-from-tree*tree=ro* && ! -e $TMP/tree/new && $out == *"ro_dirs=$TMP/tree"* ]]' "$out"
expect "--rw directory inside a --ro one is writable, the rest of /tmp is still fresh" \
  '[[ $out == *out=rw*tmp=writable* && $(cat "$TMP/tree/out/file" 2>/dev/null) == inside ]]' "$out"
RUNDIR=$(mktemp -d /run/tsb-guard-selftest.XXXXXX)
echo here >"$RUNDIR/file"
out=$("$GUARD" --ro "$RUNDIR" -- sh -c "cat $RUNDIR/file" 2>&1)
expect "--ro directory under /run is visible" '[[ $out == here ]]' "$out"
rm -rf -- "$RUNDIR"

VARTMP=$(mktemp -d /var/tmp/tsb-guard-selftest.XXXXXX)
mkdir "$VARTMP/out"
out=$("$GUARD" --rw "$VARTMP/out" -- sh -c "
  echo from-inside >$VARTMP/out/file && echo out=rw
  if echo x >$VARTMP/beside 2>/dev/null; then echo beside=rw; else echo beside=ro; fi" 2>&1)
expect "--rw directory on the read-only root is writable, its neighbours are not" \
  '[[ $out == *out=rw*beside=ro* && $(cat "$VARTMP/out/file" 2>/dev/null) == from-inside ]]' "$out"
rm -rf -- "$VARTMP"

out=$("$GUARD" -- sh -c '
  echo blockdevs=$(find /dev -type b | wc -l)
  [ -e /dev/kvm ] && echo kvm=present
  echo x >/dev/null && echo devnull=ok
  '"$PY"' -c "import os; m, s = os.openpty(); print(\"pty=\" + os.ttyname(s))"
  '"$PY"' -c "
bnd = int([l.split()[1] for l in open(\"/proc/self/status\") if l.startswith(\"CapBnd\")][0], 16)
print(\"capbnd\", *(c for c, bit in ((\"sys_module\", 16), (\"sys_rawio\", 17), (\"sys_boot\", 22), (\"sys_time\", 25), (\"sys_admin\", 21)) if bnd >> bit & 1))
"' 2>&1)
expect "/dev inside is minimal: no block devices, no kvm; null and ptys work" \
  '[[ $out == *blockdevs=0* && $out != *kvm=present* && $out == *devnull=ok* && $out == *pty=/dev/pts/* ]]' "$out"
expect "bounding set keeps sys_admin but not sys_module/sys_rawio/sys_boot/sys_time" \
  '[[ $out == *"capbnd sys_admin"* ]]' "$out"

# --- namespaces --------------------------------------------------------------
out=$("$GUARD" -- sh -c 'for ns in pid mnt uts ipc cgroup; do echo "$ns $(readlink /proc/self/ns/$ns)"; done' 2>&1)
for ns in pid mnt uts ipc cgroup; do
  inner=$(awk -v ns="$ns" '$1 == ns {print $2}' <<<"$out")
  expect "own $ns namespace" '[[ -n $inner && $inner != "$(readlink /proc/self/ns/$ns)" ]]' "inside: $inner"
done

host_name=$(hostname)
out=$("$GUARD" -- sh -c 'hostname '"$MARK"' && hostname' 2>&1)
expect "hostname change stays inside" '[[ $out == "$MARK" && $(hostname) == "$host_name" ]]' "inside: $out"

out=$("$GUARD" -- sh -c 'ls /proc | grep -c "^[0-9]*$"' 2>&1)
expect "only the guard's own processes are visible" '[[ $out =~ ^[0-9]+$ && $out -lt 10 ]]' "visible: $out"

# --- kill(-1) ----------------------------------------------------------------
sleep 600 &
SENTINEL=$!
"$GUARD" -- sh -c 'sleep 100 & kill -9 -1; echo survived' >"$TMP/kill.out" 2>&1
rc=$?
expect "kill -9 -1 inside leaves host processes alone" \
  '[[ $rc == 0 ]] && kill -0 "$SENTINEL" 2>/dev/null && grep -q survived "$TMP/kill.out"' \
  "rc=$rc" "$(cat "$TMP/kill.out")"
kill "$SENTINEL" 2>/dev/null
wait "$SENTINEL" 2>/dev/null
SENTINEL=""

# --- pids limit --------------------------------------------------------------
out=$("$GUARD" --pids 64 -- "$PY" -c '
import os, sys, time
n = 0
err = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        n += 1
except OSError as e:
    err = e.errno
print(n, err)
' "$MARK" 2>&1)
read -r forked err <<<"$out"
expect "fork bomb stops at the guard's pids limit (EAGAIN)" \
  '[[ $forked =~ ^[0-9]+$ && $forked -lt 64 && $forked -gt 32 && $err == 11 ]]' "output: $out"
expect "fork bomb children are gone after the guard exits" '[[ -z $(marked) ]]' "left: $(marked)"

# --- memory limit ------------------------------------------------------------
# The hog runs under the engine's parent cgroup (TSB_CGROUP_PARENT), as a
# sandbox would, to show that it still counts against the guard's limit.
hog_script='
set -u
layout=$TSB_GUARD_CGROUP_LAYOUT
if [ "$layout" = v2 ]; then mem=/sys/fs/cgroup; else mem=/sys/fs/cgroup/memory; fi
mkdir "$mem$TSB_CGROUP_PARENT/run1"
sh -c "echo 0 >$mem$TSB_CGROUP_PARENT/run1/cgroup.procs && exec '"$PY"' -c \"b = b\\\"x\\\" * ($1 << 20)\""
echo "hog_rc=$?"
# v2 counts OOM kills hierarchically; v1 counts them where the victim was.
if [ "$layout" = v2 ]; then
  grep oom_kill "$mem/memory.events"
else
  grep oom_kill "$mem$TSB_CGROUP_PARENT/run1/memory.oom_control"
fi
'
out=$("$GUARD" --mem 64M -- sh -c "$hog_script" sh 256 2>&1)
kills=$(awk '$1 == "oom_kill" {print $2}' <<<"$out")
# The hog went past the guard's limit, not one of its own: run1 has none.
expect "memory hog is killed by the guard's memory limit" \
  '[[ $out == *hog_rc=137* && ${kills:-0} -ge 1 ]]' "output: $out"
out=$("$GUARD" --mem 64M -- sh -c "$hog_script" sh 16 2>&1)
expect "a process within the memory limit is not killed" '[[ $out == *hog_rc=0* ]]' "output: $out"

# --- teardown ----------------------------------------------------------------
out=$("$GUARD" -- sh -c '
  setsid "$@" </dev/null >/dev/null 2>&1 &
  for i in $(seq 1 50); do
    pgrep -x python3 >/dev/null && { echo started; exit 0; }
    sleep 0.1
  done
  exit 1' sh "${SLEEPER[@]}" 2>&1)
rc=$?
expect "a daemon left behind is killed when the command exits" \
  '[[ $rc == 0 && $out == started && -z $(marked) ]]' "rc=$rc output: $out left: $(marked)"

"$GUARD" -- sh -c 'exit 7'
rc=$?
expect "exit status is passed through" '[[ $rc == 7 ]]' "rc=$rc"
"$GUARD" -- sh -c 'kill -9 $$'
rc=$?
expect "death by signal is reported as 128+N" '[[ $rc == 137 ]]' "rc=$rc"
"$GUARD" --timeout 0.5 -- "${SLEEPER[@]}"
rc=$?
expect "--timeout kills everything (137)" '[[ $rc == 137 && -z $(marked) ]]' "rc=$rc left: $(marked)"

"$GUARD" -- sh -c '"$@" & "$@"' sh "${SLEEPER[@]}" &
gpid=$!
for _ in $(seq 1 100); do [[ $(sleeping | wc -l) -ge 2 ]] && break; sleep 0.1; done
kill -TERM "$gpid"
wait "$gpid"
rc=$?
sleep 0.2
expect "SIGTERM to the guard kills everything inside (status 143)" '[[ $rc == 143 && -z $(marked) ]]' "rc=$rc left: $(marked)"

"$GUARD" -- "${SLEEPER[@]}" &
gpid=$!
for _ in $(seq 1 100); do [[ -n $(sleeping) ]] && break; sleep 0.1; done
disown "$gpid"  # no "Killed" report from this shell
kill -KILL "$gpid"
for _ in $(seq 1 20); do [[ -z $(marked) ]] && ! kill -0 "$gpid" 2>/dev/null && break; sleep 0.1; done
expect "SIGKILL to the guard still kills everything inside" '[[ -z $(marked) ]]' "left: $(marked)"
"$GUARD" -- true
expect "the next guard removes the cgroups a killed guard left" \
  '[[ $(guard_cgroups) == "$cgroups_before" ]]' "now: $(guard_cgroups)"

"$GUARD" --pids 0 -- true 2>/dev/null
rc=$?
expect "bad options fail with 125 before running anything" '[[ $rc == 125 ]]' "rc=$rc"

cgroups_after=$(guard_cgroups)
expect "no guard cgroup is left behind" '[[ $cgroups_after == "$cgroups_before" ]]' \
  "before: $cgroups_before" "after: $cgroups_after"

echo "1..$n"
((failed == 0)) || { echo "# $failed of $n checks failed"; exit 1; }
