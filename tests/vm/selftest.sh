#!/bin/bash
# selftest.sh: proves that the VM lane gives tests what production has.
#
#   tests/vm/selftest.sh [--systemd] [vm-run options...]
#
# On the host it boots VMs through vm-run and checks vm-run's own contract
# (output streams, exit status, timeout, --rw share); inside the guest (run
# as "selftest.sh --in-guest OUTDIR") it checks the kernel features the
# daemon relies on: a cgroup-v2-only hierarchy with delegable controllers,
# clone3(CLONE_INTO_CGROUP), cgroup.kill, memory accounting, user and pid
# namespaces, overlay and pivot_root.  With --systemd it also runs
# systemd-selftest.sh in a VM whose PID 1 is the host's systemd.
#
# Prints "ok"/"not ok" lines and ends with "N passed, N failed".

set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
passed=0 failed=0

check() { # check DESCRIPTION COMMAND...: run COMMAND, count the result
	local what=$1
	shift
	if "$@" > /tmp/selftest.out.$$ 2>&1; then
		echo "ok - $what"
		passed=$((passed + 1))
	else
		echo "not ok - $what"
		sed 's/^/    # /' /tmp/selftest.out.$$
		failed=$((failed + 1))
	fi
	rm -f /tmp/selftest.out.$$
}

summary() {
	echo "$passed passed, $failed failed"
	[ "$failed" = 0 ]
}

# ------------------------------------------------------------ in the guest

cg=/sys/fs/cgroup
t=$cg/selftest

only_cgroup2() {
	# One cgroup file system, v2, at /sys/fs/cgroup; no v1 hierarchy, and the
	# v1 controllers cannot be mounted either.
	awk '$3 ~ /^cgroup/ { print $2, $3 }' /proc/mounts | tee /dev/stderr \
		| grep -qx "/sys/fs/cgroup cgroup2" || return 1
	[ "$(awk '$3 ~ /^cgroup/' /proc/mounts | wc -l)" = 1 ] || return 1
	[ "$(cat /proc/self/cgroup)" = "0::/" ] || return 1
	mkdir -p /tmp/v1
	if mount -t cgroup -o memory none /tmp/v1; then umount /tmp/v1; return 1; fi
	grep -q cgroup_no_v1=all /proc/cmdline
}

root_controllers() {
	local c
	cat $cg/cgroup.controllers $cg/cgroup.subtree_control
	for c in cpu memory pids io; do
		grep -qw $c $cg/cgroup.controllers || return 1
		grep -qw $c $cg/cgroup.subtree_control || return 1
	done
}

child_cgroup() {
	mkdir $t || return 1
	echo 64M > $t/memory.max || return 1
	echo 0 > $t/memory.swap.max 2>/dev/null # no swap in the guest anyway
	echo 16 > $t/pids.max || return 1
	echo "50000 100000" > $t/cpu.max || return 1
	echo 50 > $t/cpu.weight || return 1
	[ "$(cat $t/memory.max)" = 67108864 ] && [ "$(cat $t/pids.max)" = 16 ]
}

# The daemon starts sandboxes straight into their cgroup with clone3; the
# child reports the cgroup it was born in.
clone_into_cgroup() {
	python3 - "$t" <<-'EOF'
	import ctypes, os, signal, sys
	CLONE_INTO_CGROUP = 0x200000000
	SYS_clone3 = 435
	libc = ctypes.CDLL(None, use_errno=True)
	libc.syscall.restype = ctypes.c_long
	fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
	# struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal,
	# stack, stack_size, tls, set_tid, set_tid_size, cgroup (all u64)
	args = (ctypes.c_uint64 * 11)(CLONE_INTO_CGROUP, 0, 0, 0, signal.SIGCHLD,
	                               0, 0, 0, 0, 0, fd)
	pid = libc.syscall(SYS_clone3, ctypes.byref(args), ctypes.sizeof(args))
	if pid == 0:
	    with open("/proc/self/cgroup") as f:
	        os._exit(0 if f.read().strip() == "0::/selftest" else 3)
	if pid < 0:
	    sys.exit("clone3: " + os.strerror(ctypes.get_errno()))
	_, status = os.waitpid(pid, 0)
	print("child", pid, "status", status)
	sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 else 1)
	EOF
}

# Over memory.max the kernel OOM-kills inside the cgroup, and says so in
# memory.events; memory.peak shows the high-water mark.
memory_limit() {
	sh -c "echo \$\$ > $t/cgroup.procs && exec python3 -c 'x = b\"a\" * (256 << 20)'"
	local rc=$?
	echo "exit $rc"
	cat $t/memory.events
	echo "peak $(cat $t/memory.peak)"
	[ $rc = 137 ] || return 1
	[ "$(awk '$1 == "oom_kill" { print $2 }' $t/memory.events)" -ge 1 ] || return 1
	[ "$(cat $t/memory.peak)" -gt $((32 << 20)) ]
}

pids_limit() {
	echo 4 > $t/pids.max
	sh -c "echo \$\$ > $t/cgroup.procs && exec python3 -c '
import os
pids = []
try:
    for i in range(10):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    raise SystemExit(\"forked 10 times past pids.max\")
except BlockingIOError:
    print(\"fork refused after\", len(pids))
for pid in pids:
    os.waitpid(pid, 0)
'"
	local rc=$?
	grep max $t/pids.events
	echo 16 > $t/pids.max
	[ $rc = 0 ] && grep -q "^max [1-9]" $t/pids.events
}

cgroup_kill() {
	sh -c "echo \$\$ > $t/cgroup.procs && exec sleep 1000" &
	local pid=$!
	for _ in $(seq 300); do # up to 30 s: TCG on a busy host is slow
		grep -qx $pid $t/cgroup.procs && break
		sleep 0.1
	done
	grep -qx $pid $t/cgroup.procs || return 1
	echo 1 > $t/cgroup.kill || return 1
	wait $pid
	local rc=$?
	echo "exit $rc"
	cat $t/cgroup.events
	[ $rc = 137 ] && grep -qx "populated 0" $t/cgroup.events
}

remove_cgroup() {
	rmdir $t
}

user_pid_ns() {
	unshare -Urpf --mount-proc true || return 1
	# PID 1 of a new pid namespace, root of a new user namespace.
	[ "$(unshare -Urpf --mount-proc sh -c 'echo $$; id -u')" = "1
0" ]
}

unprivileged_userns() {
	# The daemon may drop privileges first: an ordinary user must be able to
	# create its own user namespace, too.
	setpriv --reuid 65534 --regid 65534 --clear-groups unshare -Ur id -u | grep -qx 0
}

userns_overlay() {
	mkdir -p /tmp/ovl
	unshare -Urm sh -c '
		set -e
		mount -t tmpfs none /tmp/ovl
		cd /tmp/ovl
		mkdir l u w m
		echo lower > l/f
		mount -t overlay overlay -o lowerdir=l,upperdir=u,workdir=w m
		echo upper > m/f
		grep -qx upper u/f'
}

pivot_root_works() {
	mkdir -p /tmp/pr
	unshare -m --propagation private sh -c '
		set -e
		mount -t tmpfs none /tmp/pr
		mkdir /tmp/pr/old
		cd /tmp/pr
		pivot_root . old
		cd /
		# Only shell builtins from here: the new root is an empty tmpfs.
		test -d /old/usr && test ! -e /usr'
}

api_mounts() {
	local m
	for m in "/proc proc" "/sys sysfs" "/dev devtmpfs" "/dev/pts devpts" \
		"/dev/shm tmpfs" "/tmp tmpfs" "/run tmpfs" "/var/tmp tmpfs"; do
		awk '{ print $2, $3 }' /proc/mounts | grep -qx "$m" || { echo "missing $m"; return 1; }
	done
	[ "$(id -u)" = 0 ] && ip link show lo | grep -q "UP"
}

host_python() {
	/usr/bin/python3 -c 'import ssl, sqlite3, ctypes; print("python ok")'
}

kernel_modules() {
	# The guest kernel's module tree is mounted, so modprobe works.
	modprobe veth && grep -q '^veth ' /proc/modules
}

in_guest() {
	local out=$1
	echo "# kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/ { print $2 }' /proc/meminfo) kB"
	check "cgroup2 is the only cgroup file system" only_cgroup2
	check "root cgroup offers and delegates cpu memory pids io" root_controllers
	check "child cgroup with memory/pids/cpu limits" child_cgroup
	check "clone3(CLONE_INTO_CGROUP) starts a child in the cgroup" clone_into_cgroup
	check "memory.max OOM-kills, memory.events and memory.peak report it" memory_limit
	check "pids.max refuses forks, pids.events reports it" pids_limit
	check "cgroup.kill kills the cgroup's processes" cgroup_kill
	check "empty child cgroup can be removed" remove_cgroup
	check "unshare -Urpf --mount-proc (user + pid namespaces)" user_pid_ns
	check "unprivileged user namespaces" unprivileged_userns
	check "overlay mount inside a user namespace" userns_overlay
	check "pivot_root in a new mount namespace" pivot_root_works
	check "proc sysfs devtmpfs devpts tmpfs mounts, uid 0, loopback up" api_mounts
	check "the host's /usr/bin/python3 runs" host_python
	check "modprobe loads the guest kernel's modules" kernel_modules
	check "the --rw output directory is writable" touch "$out/selftest-ok"
	summary
}

# ---------------------------------------------------------------- the host

# Streams and exit status go through vm-run unchanged.
vm_contract() {
	local rc
	"$here/vm-run" "$@" -- /bin/sh -c 'echo to-stdout; echo to-stderr >&2; exit 7' \
		> "$tmp/stdout" 2> "$tmp/stderr"
	rc=$?
	echo "exit $rc"
	cat "$tmp/stdout" "$tmp/stderr"
	[ $rc = 7 ] && [ "$(cat "$tmp/stdout")" = to-stdout ] && [ "$(cat "$tmp/stderr")" = to-stderr ]
}

vm_timeout() {
	local rc
	"$here/vm-run" "$@" --timeout 3 -- /bin/sleep 600
	rc=$?
	echo "exit $rc"
	[ $rc = 124 ]
}

on_host() {
	local systemd=0
	if [ "${1:-}" = --systemd ]; then
		systemd=1
		shift
	fi
	"$here/vm-run" --prepare || exit 1
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	mkdir "$tmp/out"
	# The guest's own checks print their lines straight to our stdout.
	if "$here/vm-run" "$@" --rw "$tmp/out" -- "$here/selftest.sh" --in-guest "$tmp/out" \
		| sed 's/^/    /'; then
		echo "ok - guest checks passed"
		passed=$((passed + 1))
	else
		echo "not ok - guest checks failed"
		failed=$((failed + 1))
	fi
	check "guest output reached the host through --rw" test -f "$tmp/out/selftest-ok"
	check "vm-run passes stdout, stderr and the exit status through" vm_contract "$@"
	check "vm-run exits 124 when the guest does not finish in time" vm_timeout "$@"
	if [ $systemd = 1 ]; then
		if "$here/vm-run" --systemd "$@" -- "$here/systemd-selftest.sh" | sed 's/^/    /'; then
			echo "ok - systemd checks passed"
			passed=$((passed + 1))
		else
			echo "not ok - systemd checks failed"
			failed=$((failed + 1))
		fi
	fi
	summary
}

if [ "${1:-}" = --in-guest ]; then
	# It creates cgroups and mounts: never on the host itself.
	[ "${VM_LANE:-}" = 1 ] || { echo "selftest.sh: --in-guest runs only under vm-run" >&2; exit 2; }
	in_guest "$2"
else
	on_host "$@"
fi
