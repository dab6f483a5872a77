#!/bin/bash
# systemd-selftest.sh: checks the --systemd mode of the VM lane, where the
# host's systemd is PID 1 and this script runs as vm-lane.service
# (Delegate=yes).  It is what a later test of the daemon's own unit needs:
# a booted systemd, a delegated cgroup subtree, Type=notify and socket
# activation; and the OOMPolicy= defaults the daemon's unit is written
# against.  Run by "selftest.sh --systemd", or directly:
#
#   tests/vm/vm-run --systemd -- tests/vm/systemd-selftest.sh
#
# Prints "ok"/"not ok" lines and ends with "N passed, N failed".

set -u -o pipefail

passed=0 failed=0
units=/run/systemd/system

check() { # check DESCRIPTION COMMAND...
	local what=$1 out
	shift
	if out=$("$@" 2>&1); then
		echo "ok - $what"
		passed=$((passed + 1))
	else
		echo "not ok - $what"
		printf '%s\n' "$out" | sed 's/^/    # /'
		failed=$((failed + 1))
	fi
}

booted() {
	[ "$(cat /proc/1/comm)" = systemd ] || return 1
	# "degraded" still means booted; the failed units are listed then.
	local state
	state=$(timeout 120 systemctl is-system-running --wait)
	echo "state $state"
	systemctl --failed --no-legend
	[ "$state" = running ] || [ "$state" = degraded ]
}

only_cgroup2() {
	[ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ] \
		&& [ "$(awk '$3 ~ /^cgroup/' /proc/mounts | wc -l)" = 1 ]
}

# Delegate=yes hands our unit's cgroup to us.  As the daemon will do, move
# the unit's processes into a leaf first (no processes in inner cgroups),
# then enable controllers for a payload cgroup.
delegated_cgroup() {
	local own
	own=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)
	echo "own cgroup $own"
	[ "$own" = /sys/fs/cgroup/system.slice/vm-lane.service ] || return 1
	mkdir "$own/supervisor" "$own/payload" || return 1
	# Every process of the unit: vm-lane's runner, this shell, its subshells.
	local pid
	for pid in $(cat "$own/cgroup.procs"); do
		echo "$pid" > "$own/supervisor/cgroup.procs" 2>/dev/null
	done
	[ -z "$(cat "$own/cgroup.procs")" ] || return 1
	echo "+memory +pids" > "$own/cgroup.subtree_control" || return 1
	echo 32M > "$own/payload/memory.max" || return 1
	echo 10 > "$own/payload/pids.max"
}

# A transient unit with systemd's own resource settings.
transient_unit() {
	local max
	max=$(systemd-run --quiet --wait --pipe -p MemoryMax=64M -p TasksMax=20 \
		/bin/sh -c 'cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/memory.max')
	echo "memory.max $max"
	[ "$max" = 67108864 ]
}

# What OOMPolicy= a unit gets when it sets none: DefaultOOMPolicy= (stop)
# unless Delegate=yes, then continue (service_add_extras, src/core/service.c).
# A delegated unit's memory.events counts OOM kills in its sub-cgroups too,
# so under "stop" any OOM kill below it would stop the whole unit.
oom_policy_defaults() {
	local plain deleg
	systemd-run --quiet --unit vmlane-oom-plain /bin/sleep 60 || return 1
	systemd-run --quiet --unit vmlane-oom-deleg -p Delegate=yes /bin/sleep 60 || return 1
	plain=$(systemctl show -P OOMPolicy vmlane-oom-plain.service)
	deleg=$(systemctl show -P OOMPolicy vmlane-oom-deleg.service)
	echo "OOMPolicy: without Delegate= $plain, with Delegate=yes $deleg"
	systemctl stop vmlane-oom-plain.service vmlane-oom-deleg.service
	[ "$plain" = stop ] && [ "$deleg" = continue ]
}

# The notify helper both services use: tell systemd we are ready.
notify_py='
import os, socket
def notify(state):
    addr = os.environ["NOTIFY_SOCKET"]
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.sendall(state.encode())
'

# Type=notify: "systemctl start" returns only once the service says READY=1,
# so what it did before that is visible right after.
notify_service() {
	{
		echo "$notify_py"
		cat <<-'EOF'
		import time
		time.sleep(1)
		open("/run/vmlane-notify.ready", "w").close()
		notify("READY=1")
		time.sleep(3600)
		EOF
	} > /run/vmlane-notify.py
	cat > $units/vmlane-notify.service <<-EOF
	[Service]
	Type=notify
	ExecStart=/usr/bin/python3 /run/vmlane-notify.py
	EOF
	systemctl daemon-reload || return 1
	timeout 60 systemctl start vmlane-notify.service || return 1
	systemctl show -p Type -p ActiveState -p SubState vmlane-notify.service
	[ -e /run/vmlane-notify.ready ] || return 1
	[ "$(systemctl show -P ActiveState vmlane-notify.service)" = active ] || return 1
	systemctl stop vmlane-notify.service
}

# Socket activation: systemd owns the listening socket, starts the service
# on the first connection and passes the socket as fd 3 (LISTEN_FDS).
socket_activation() {
	cat > $units/vmlane-echo.socket <<-EOF
	[Socket]
	ListenStream=/run/vmlane-echo.sock
	EOF
	{
		echo "$notify_py"
		cat <<-'EOF'
		assert os.environ["LISTEN_FDS"] == "1"
		assert os.environ["LISTEN_PID"] == str(os.getpid())
		listener = socket.socket(fileno=3)
		notify("READY=1")
		while True:
		    conn, _ = listener.accept()
		    conn.sendall(b"echo " + conn.recv(100))
		    conn.close()
		EOF
	} > /run/vmlane-echo.py
	cat > $units/vmlane-echo.service <<-EOF
	[Service]
	Type=notify
	ExecStart=/usr/bin/python3 /run/vmlane-echo.py
	EOF
	systemctl daemon-reload || return 1
	systemctl start vmlane-echo.socket || return 1
	[ "$(systemctl show -P ActiveState vmlane-echo.service)" = inactive ] || return 1
	local reply
	reply=$(timeout 60 python3 -c '
import socket
s = socket.socket(socket.AF_UNIX)
s.connect("/run/vmlane-echo.sock")
s.sendall(b"ping")
print(s.recv(100).decode())')
	echo "reply: $reply"
	systemctl show -p ActiveState -p SubState vmlane-echo.service
	[ "$reply" = "echo ping" ] || return 1
	[ "$(systemctl show -P ActiveState vmlane-echo.service)" = active ] || return 1
	systemctl stop vmlane-echo.socket vmlane-echo.service
}

# It writes units and cgroups: never on the host itself.
[ "${VM_LANE:-}" = 1 ] || { echo "systemd-selftest.sh: runs only under vm-run --systemd" >&2; exit 2; }

echo "# systemd $(systemctl --version | awk 'NR == 1 { print $2 }'), kernel $(uname -r)"
check "systemd is PID 1 and the boot finished" booted
check "cgroup2 is the only cgroup file system" only_cgroup2
check "Delegate=yes gives the unit its own cgroup subtree" delegated_cgroup
check "transient unit with MemoryMax= (systemd-run)" transient_unit
check "OOMPolicy= defaults to stop, and to continue with Delegate=yes" oom_policy_defaults
check "Type=notify service becomes active on READY=1" notify_service
check "socket activation passes the listening socket" socket_activation
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
