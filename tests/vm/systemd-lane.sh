#!/bin/bash
# systemd-lane.sh: the shipped systemd units, end to end, on a cgroup-v2-only
# kernel with systemd as PID 1. Runs INSIDE the VM as vm-lane.service:
#
#   tests/vm/vm-run --systemd --timeout 900 -- tests/vm/systemd-lane.sh [BUILD_DIR]
#
# (tests/vm/run-lane.sh does this.) BUILD_DIR (default build-vm next to this
# checkout) is installed at the prefix it was configured with (/usr for a
# package, /usr/local by default): the unit's ExecStart=, the compiled-in
# configuration, libexec and data paths all come from that prefix, so a build
# must not be installed elsewhere with "cmake --install --prefix". The paths
# used below are read from the installed unit and the install manifest.
#
# The guest's root is a tmpfs overlay over the host's read-only root, so the
# install lands in the guest only. Then, as a package would:
#   systemd-sysusers, systemd-tmpfiles --create, systemctl daemon-reload,
#   systemctl enable --now toolsandboxd.socket
# and checks that:
#   - systemd-analyze verify is silent for both installed units, and
#     "toolsandboxd --check" accepts the installed configuration;
#   - the service is not running until the first connection, and the first
#     client (toolsandbox status) starts it: Type=notify, active/running;
#   - the daemon moved itself into <service cgroup>/supervisor, the service
#     cgroup holds no process and delegates cpu, memory and pids;
#   - toolsandbox call runs a tool; while it runs, its leaf run.<MainPID>.N
#     sits beside the supervisor, with the sandbox's init inside;
#   - the installed Python client (python3 -m toolsandbox_client) answers;
#   - the unit's memory settings are in force (OOMPolicy=continue, the
#     daemon's oom_score_adj, MemoryMax=); a memory bomb run ends as
#     memory_limit, systemd sees the OOM kill in the service's tree, and the
#     same main process stays active and serving; with OOMPolicy=stop (a
#     drop-in) the same bomb stops the service, which is what the setting
#     prevents; below a service-level MemoryMax= the OOM killer takes the
#     run, not the daemon;
#   - systemctl reload keeps the same main process;
#   - after "systemctl stop toolsandboxd.service" the socket still activates
#     a new instance;
#   - after stopping socket and service nothing is left: no daemon, no
#     sandbox process, no service cgroup, no run leaf, no mount under the
#     state directory;
#   - with a configuration the daemon refuses, the unit gives up after its
#     start limit, the socket fails too, and a waiting client is let go.
#
# Prints "ok"/"not ok" lines, ends with "N passed, N failed"; exit status 0
# only when everything passed. On a failure the unit's journal is printed.
#
# The check functions are called through check/need, which SC2317 misses.
# shellcheck disable=SC2317

set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-$src/build-vm}
sock=/run/toolsandboxd/toolsandboxd.sock
work=$(mktemp -d /var/tmp/tsb-lane.XXXXXX)
passed=0 failed=0

check() { # check DESCRIPTION COMMAND...
	local what=$1 out
	shift
	if out=$("$@" 2>&1); then
		echo "ok - $what"
		[ -n "${LANE_VERBOSE:-}" ] && printf '%s\n' "$out" | sed 's/^/    # /'
		passed=$((passed + 1))
	else
		echo "not ok - $what"
		printf '%s\n' "$out" | sed 's/^/    # /'
		failed=$((failed + 1))
	fi
}

# Fatal set-up step: without it nothing below means anything.
need() {
	local before=$failed
	check "$@"
	if [ "$failed" != "$before" ]; then
		echo "# a required step failed: stopping here"
		finish
	fi
}

finish() {
	if [ "$failed" != 0 ]; then
		echo "# journal of toolsandboxd (last 60 lines):"
		journalctl --no-pager -o short-monotonic -u toolsandboxd.service -u toolsandboxd.socket 2>&1 | tail -60 | sed 's/^/#   /'
	fi
	echo "$passed passed, $failed failed"
	rm -rf "$work"
	[ "$failed" = 0 ]
	exit
}

prop() { systemctl show -P "$1" toolsandboxd.service; }

# ---------------------------------------------------------------- install

# Paths of the installed files, found by install_tree (the check functions
# run in subshells, so they are kept in a file).
paths=$work/paths
install_tree() {
	local prefix
	prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
	echo "prefix $prefix"
	cmake --install "$build" >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; return 1; }
	local unit exec daemon config cli pydir f
	unit=$(grep -m1 '/systemd/system/toolsandboxd.service$' "$build/install_manifest.txt")
	exec=$(sed -n 's/^ExecStart=//p' "$unit")
	daemon=${exec%% *}
	config=$(sed -n 's/.*--config \([^ ]*\).*/\1/p' <<<"$exec")
	cli=$(grep -m1 '/bin/toolsandbox$' "$build/install_manifest.txt")
	pydir=$(grep -m1 '/toolsandbox_client/__init__.py$' "$build/install_manifest.txt")
	pydir=${pydir%/toolsandbox_client/__init__.py}
	for f in "$daemon" "$config" "$cli" "$pydir" "${unit%.service}.socket" \
		"$(grep -m1 '/toolsandbox-init$' "$build/install_manifest.txt")"; do
		[ -e "$f" ] || { echo "missing after install: '$f'"; return 1; }
	done
	printf 'unit=%q\ndaemon=%q\nconfig=%q\ncli=%q\npydir=%q\n' "$unit" "$daemon" "$config" "$cli" "$pydir" >"$paths"
	cat "$paths"
}

sysusers() {
	systemd-sysusers /usr/lib/sysusers.d/toolsandboxd.conf && getent group toolsandbox
}

tmpfiles() {
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/toolsandboxd.conf || return 1
	stat -c '%n %a %U:%G' /run/toolsandbox /run/toolsandboxd /var/lib/toolsandbox /var/cache/toolsandbox /var/cache/toolsandbox/venvs
	[ "$(stat -c %a /run/toolsandbox)" = 711 ] && [ "$(stat -c '%a %U' /var/cache/toolsandbox/venvs)" = "755 toolsandboxd" ]
}

# systemd-analyze prints a line for every problem, also for the ones it
# only warns about; silence is the pass mark.
verify_units() {
	local out
	out=$(systemd-analyze verify --man=no "$unit" "${unit%.service}.socket" 2>&1) || { echo "$out"; return 1; }
	[ -z "$out" ] || { echo "$out"; return 1; }
}

config_check() {
	"$daemon" --check --config "$config"
}

enable_socket() {
	systemctl daemon-reload && systemctl enable --now toolsandboxd.socket || return 1
	systemctl is-active toolsandboxd.socket && [ -S "$sock" ]
}

not_started_yet() {
	local s
	s=$(systemctl is-active toolsandboxd.service)
	echo "service: $s"
	[ "$s" = inactive ]
}

# ------------------------------------------------------------- activation

first_client_starts_it() {
	# The first connection makes systemd start the service; the client's
	# request waits in the socket's backlog until the daemon accepts it.
	timeout 120 "$cli" status || return 1
	echo "Type=$(prop Type) ActiveState=$(prop ActiveState) SubState=$(prop SubState) MainPID=$(prop MainPID)"
	[ "$(prop Type)" = notify ] && [ "$(prop ActiveState)" = active ] && [ "$(prop SubState)" = running ]
}

cgroup_layout() {
	local cg pid own procs ctl c
	cg=/sys/fs/cgroup$(prop ControlGroup)
	pid=$(prop MainPID)
	own=$(cut -d: -f3 "/proc/$pid/cgroup")
	echo "service cgroup $cg, main pid $pid in $own"
	[ "/sys/fs/cgroup$own" = "$cg/supervisor" ] || { echo "the daemon is not in the supervisor leaf"; return 1; }
	procs=$(cat "$cg/cgroup.procs")
	[ -z "$procs" ] || { echo "processes in the service cgroup itself: $procs"; return 1; }
	ctl=" $(cat "$cg/cgroup.subtree_control") "
	echo "subtree_control:$ctl"
	for c in cpu memory pids; do
		[[ $ctl == *" $c "* ]] || { echo "$c is not delegated to the runs"; return 1; }
	done
}

call_tool() {
	local cg pid leaf waiting="" now
	cg=/sys/fs/cgroup$(prop ControlGroup)
	pid=$(prop MainPID)
	run_leaves() { find "$cg" -mindepth 1 -maxdepth 1 -type d -name "run.$pid.*" | sort; }
	# The shipped default policy keeps warm sandboxes waiting, each in a
	# leaf of its own beside the supervisor: once the pool is full (the same
	# leaves twice, a second apart), those are the waiting ones.
	for _ in $(seq 1 120); do
		now=$(run_leaves)
		[ -n "$now" ] && [ "$now" = "$waiting" ] && break
		waiting=$now
		sleep 1
	done
	echo "leaves of waiting warm sandboxes: $(echo $waiting)"
	cat >"$work/tool.py" <<-'EOF'
	import time
	def add_slowly(a: int, b: int) -> int:
	    time.sleep(3)
	    return a + b
	EOF
	# A cold run (a request that sets TZ never takes a sandbox started
	# before it): its leaf is the one that appears.
	timeout 300 "$cli" call "$work/tool.py" --args '{"a": 40, "b": 2}' --env TZ=UTC --json >"$work/call.out" 2>&1 &
	local client=$!
	# While the tool sleeps: its leaf beside the supervisor, init inside.
	leaf=""
	for _ in $(seq 1 300); do
		leaf=$(comm -13 <(echo "$waiting") <(run_leaves) | head -1)
		[ -n "$leaf" ] && [ -n "$(cat "$leaf/cgroup.procs")" ] && break
		sleep 0.1
	done
	echo "leaves while running: $(cd "$cg" && find . -mindepth 1 -maxdepth 1 -type d | sort | tr '\n' ' ')"
	local leaf_ok=1
	if [ -z "$leaf" ]; then
		echo "no run.$pid.* leaf beside the supervisor"
		leaf_ok=0
	else
		local first comm
		first=$(head -1 "$leaf/cgroup.procs")
		comm=$(cat "/proc/$first/comm" 2>/dev/null)
		echo "first process in $leaf: $first ($comm)"
		[ "$comm" = toolsandbox-ini ] || [ "$comm" = toolsandbox-init ] || leaf_ok=0
	fi
	wait "$client"
	local rc=$?
	cat "$work/call.out"
	if [ "$rc" != 0 ]; then
		# What was stuck: every process that is not a kernel thread, with
		# where it sleeps, and what the daemon says.
		echo "the client ended with status $rc; processes:"
		ps -eo pid,ppid,stat,wchan:28,etime,args --forest | grep -v ' \[.*\]$'
		echo "leaves: $(cd "$cg" && find . -mindepth 1 -maxdepth 1 -type d | sort | tr '\n' ' ')"
		timeout 60 "$cli" status
	fi
	[ "$rc" = 0 ] && grep -q '"func_return": *42' "$work/call.out" && grep -q '"warm": *false' "$work/call.out" &&
		[ "$leaf_ok" = 1 ] || return 1
	# The finished run's leaf is removed; the supervisor and the waiting
	# warm sandboxes' leaves stay.
	for _ in $(seq 1 100); do
		[ ! -d "$leaf" ] && [ "$(run_leaves)" = "$waiting" ] && [ -d "$cg/supervisor" ] && return 0
		sleep 0.1
	done
	echo "leaves left after the run: $(ls "$cg")"
	return 1
}

python_client() {
	# The package as installed, not the tree. Under /usr it is on Debian's
	# sys.path (/usr/lib/python3/dist-packages); other prefixes need PYTHONPATH.
	cd / || return 1
	if python3 -c 'import sys; sys.exit(sys.argv[1] not in sys.path)' "$pydir"; then
		timeout 60 python3 -m toolsandbox_client status
	else
		echo "PYTHONPATH=$pydir (not on sys.path for this prefix)"
		PYTHONPATH=$pydir timeout 60 python3 -m toolsandbox_client status
	fi
}

# A tool that allocates until something stops it (the default policy's
# memory limit is 512 MiB).
bomb_tool() {
	cat >"$work/bomb.py" <<-'EOF'
	def bomb() -> int:
	    hog = []
	    while True:
	        hog.append(bytearray(32 << 20))
	EOF
}

# Runs the bomb through the installed client; prints its end_reason.
run_bomb() {
	bomb_tool
	timeout 300 "$cli" call "$work/bomb.py" --timeout 120 --json >"$work/bomb.out" 2>&1
	sed -n 's/.*"end_reason": *"\([a-z_]*\)".*/\1/p' "$work/bomb.out" | head -1
}

oom_settings() {
	local pid adj max
	pid=$(prop MainPID)
	adj=$(cat "/proc/$pid/oom_score_adj")
	max=$(cat "/sys/fs/cgroup$(prop ControlGroup)/memory.max")
	echo "OOMPolicy=$(prop OOMPolicy) oom_score_adj=$adj MemoryMax=$(prop MemoryMax) memory.max=$max MemoryHigh=$(prop MemoryHigh)"
	[ "$(prop OOMPolicy)" = continue ] && [ "$adj" = -900 ] && [ "$max" != max ]
}

memory_bomb_keeps_service() {
	local before restarts reason since
	before=$(prop MainPID)
	restarts=$(prop NRestarts)
	since=$(date '+%Y-%m-%d %H:%M:%S')
	reason=$(run_bomb)
	echo "bomb end_reason: ${reason:-none} ($(head -c 300 "$work/bomb.out"))"
	[ "$reason" = memory_limit ] || return 1
	timeout 60 "$cli" status >/dev/null || { echo "the daemon does not answer after the bomb"; return 1; }
	echo "MainPID $before -> $(prop MainPID), $(prop ActiveState)/$(prop SubState), NRestarts $restarts -> $(prop NRestarts), Result $(prop Result)"
	# systemd saw the kill in the service's tree (memory.events is
	# hierarchical) and, as configured, carried on.
	journalctl --no-pager -u toolsandboxd.service --since "$since" | grep 'killed by the OOM killer' || {
		echo "systemd logged no OOM kill for the unit"
		return 1
	}
	[ "$(prop MainPID)" = "$before" ] && [ "$(prop ActiveState)" = active ] && [ "$(prop NRestarts)" = "$restarts" ]
}

# Drop-ins for the two checks below, removed again by drop_in_reset.
dropin=/run/systemd/system/toolsandboxd.service.d
drop_in_set() {
	mkdir -p "$dropin" && printf '[Service]\n%s\n' "$1" >"$dropin/lane.conf" &&
		systemctl daemon-reload && systemctl restart toolsandboxd.service &&
		timeout 120 "$cli" status >/dev/null
}
drop_in_reset() {
	rm -rf "$dropin"
	systemctl daemon-reload
	systemctl reset-failed toolsandboxd.service 2>/dev/null
	systemctl start toolsandboxd.service && timeout 120 "$cli" status >/dev/null
}

# The check above passes because of OOMPolicy=continue: with stop, systemd
# stops the service on the bomb's OOM kill in a run leaf.
# (Restart=on-failure then starts it again, so the journal tells.)
oompolicy_stop_would_stop_it() {
	drop_in_set OOMPolicy=stop || { drop_in_reset; return 1; }
	local reason before since stopped=0
	before=$(prop MainPID)
	since=$(date '+%Y-%m-%d %H:%M:%S')
	reason=$(run_bomb)
	for _ in $(seq 1 60); do
		journalctl --no-pager -u toolsandboxd.service --since "$since" | grep -q "Failed with result 'oom-kill'" && {
			stopped=1
			break
		}
		sleep 0.5
	done
	echo "with OOMPolicy=stop: bomb end_reason ${reason:-none}; MainPID $before -> $(prop MainPID)"
	journalctl --no-pager -u toolsandboxd.service --since "$since" | grep -E 'OOM|oom-kill|Stopp' | head -5
	drop_in_reset || return 1
	[ "$stopped" = 1 ]
}

# MemoryMax= of the service below the policy's limit: the OOM is the
# service's, and the kernel must pick the sandbox (oom_score_adj 1000), not
# the daemon.
service_oom_takes_the_run() {
	drop_in_set MemoryMax=300M || { drop_in_reset; return 1; }
	local before reason after ok=1
	before=$(prop MainPID)
	reason=$(run_bomb)
	after=$(prop MainPID)
	echo "MemoryMax=300M: bomb end_reason ${reason:-none}, MainPID $before -> $after, $(prop ActiveState)"
	[ "$reason" = memory_limit ] && [ "$before" = "$after" ] && [ "$(prop ActiveState)" = active ] || ok=0
	timeout 60 "$cli" status >/dev/null || { echo "the daemon does not answer"; ok=0; }
	drop_in_reset || return 1
	[ "$ok" = 1 ]
}

reload_keeps_main() {
	local before after
	before=$(prop MainPID)
	systemctl reload toolsandboxd.service || return 1
	timeout 60 "$cli" status >/dev/null || return 1
	after=$(prop MainPID)
	echo "MainPID $before -> $after, $(prop ActiveState)/$(prop SubState)"
	[ "$before" = "$after" ] && [ "$(prop ActiveState)" = active ]
}

# A warm pool under the unit (its capabilities, its delegated cgroup): a
# policy with a pool of one, allowed by a replaced organizations.json and
# loaded by a reload; a call gets a warm sandbox (record.warm); then the
# files are put back.
warm_pool_hands_over() {
	local dir=${config%/*}/policies ok=1 ready=0 start=$SECONDS
	cp "$dir/organizations.json" "$work/organizations.json.orig" || return 1
	printf '{"version": 1, "include": "default.json", "warm_pool": {"max": 1, "min": 1}}\n' >"$dir/lanewarm.json"
	printf '{"version": 1, "default": {"privileged": false, "policy": "default", "allowed_policies": ["default", "lanewarm"]}}\n' \
		>"$dir/organizations.json"
	systemctl reload toolsandboxd.service || ok=0
	while [ $((SECONDS - start)) -lt 120 ]; do
		if timeout 30 "$cli" status --json 2>/dev/null | python3 -c '
import json, sys
pools = json.load(sys.stdin)["status"]["warm_pool"]["pools"]
sys.exit(not [p for p in pools if p["policy"] == "lanewarm" and p["mode"] == "run_tool" and p["warm"] >= 1])'; then
			ready=1
			break
		fi
		sleep 0.2
	done
	echo "warm pool ready: $ready"
	printf 'def add(a: int, b: int) -> int:\n    return a + b\n' >"$work/add.py"
	timeout 120 "$cli" call "$work/add.py" --args '{"a": 40, "b": 2}' --policy lanewarm --json >"$work/warm.out" 2>&1 || ok=0
	cat "$work/warm.out"
	grep -q '"warm": *true' "$work/warm.out" && grep -q '"func_return": *42' "$work/warm.out" || ok=0
	cp "$work/organizations.json.orig" "$dir/organizations.json" && rm -f "$dir/lanewarm.json"
	systemctl reload toolsandboxd.service && timeout 60 "$cli" status >/dev/null || ok=0
	[ "$ready" = 1 ] && [ "$ok" = 1 ]
}

socket_survives_service_stop() {
	local before after
	before=$(prop MainPID)
	systemctl stop toolsandboxd.service || return 1
	echo "after stop: service $(systemctl is-active toolsandboxd.service), socket $(systemctl is-active toolsandboxd.socket)"
	[ -S "$sock" ] || { echo "$sock is gone"; ls -la /run/toolsandboxd 2>&1; return 1; }
	timeout 120 "$cli" status >/dev/null || return 1
	after=$(prop MainPID)
	echo "MainPID $before -> $after"
	[ "$after" != 0 ] && [ "$after" != "$before" ]
}

# ------------------------------------------------------------------- stop

nothing_left() {
	local cg=/sys/fs/cgroup/system.slice/toolsandboxd.service
	# Stop with a run in flight: the daemon gives it shutdown_grace (30 s),
	# then cancels it; KillMode=mixed kills whatever is left in the subtree.
	cat >"$work/long.py" <<-'EOF'
	import time
	def long_nap() -> int:
	    time.sleep(600)
	    return 1
	EOF
	"$cli" call "$work/long.py" --timeout 900 >"$work/long.out" 2>&1 &
	local client=$! t0
	for _ in $(seq 1 300); do
		[ -n "$(find "$cg" -mindepth 1 -maxdepth 1 -type d -name 'run.*' 2>/dev/null)" ] && break
		sleep 0.1
	done
	echo "in flight: $(find "$cg" -mindepth 1 -maxdepth 1 -type d -name 'run.*' 2>/dev/null)"
	t0=$(date +%s)
	systemctl stop toolsandboxd.socket toolsandboxd.service || return 1
	echo "stopped after $(($(date +%s) - t0)) s"
	wait "$client"
	echo "the client of the run in flight got (status $?): $(head -c 300 "$work/long.out")"
	local s
	s=$(systemctl is-active toolsandboxd.service)
	echo "service $s, socket $(systemctl is-active toolsandboxd.socket)"
	[ "$s" = inactive ] || return 1
	local bad=0
	if pgrep -x toolsandboxd >/dev/null || pgrep -x toolsandbox-ini >/dev/null; then
		echo "left running:"; pgrep -a 'toolsandbox(d|-ini)'
		bad=1
	fi
	# Sandbox ids start at uid_base (2^30).
	local left
	left=$(ps -eo uid=,pid=,args= | awk '$1 >= 1073741824')
	[ -z "$left" ] || { echo "sandbox processes left: $left"; bad=1; }
	[ ! -e "$cg" ] || { echo "service cgroup left: $(find "$cg" -type d)"; bad=1; }
	left=$(find /sys/fs/cgroup -type d -name 'run.*' 2>/dev/null)
	[ -z "$left" ] || { echo "run leaves left: $left"; bad=1; }
	left=$(grep ' /run/toolsandbox' /proc/self/mountinfo)
	[ -z "$left" ] || { echo "mounts left: $left"; bad=1; }
	[ "$bad" = 0 ]
}

# A configuration the daemon refuses: after StartLimitBurst restarts the
# service and its socket fail, and a waiting client is let go.
broken_config_fails_fast() {
	cp "$config" "$work/config.good"
	echo '{ "version": 1, "no_such_key": true }' >"$config"
	systemctl start toolsandboxd.socket || return 1
	local t0 rc result sock_state
	t0=$(date +%s)
	timeout 150 "$cli" status
	rc=$?
	result=$(systemctl show -P Result toolsandboxd.socket)
	sock_state=$(systemctl is-active toolsandboxd.socket)
	echo "client exit status $rc after $(($(date +%s) - t0)) s; socket $sock_state, result $result"
	cp "$work/config.good" "$config"
	systemctl stop toolsandboxd.socket toolsandboxd.service
	systemctl reset-failed toolsandboxd.service toolsandboxd.socket 2>/dev/null
	[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$result" = service-start-limit-hit ] && [ "$sock_state" != active ]
}

echo "# systemd $(systemctl --version | head -1 | cut -d' ' -f2), kernel $(uname -r), build $build"
need "install into the guest's root (cmake --install)" install_tree
# shellcheck source=/dev/null
. "$paths"
need "systemd-sysusers creates the toolsandbox group" sysusers
need "systemd-tmpfiles creates the runtime and state directories" tmpfiles
check "systemd-analyze verify is silent for both units" verify_units
check "toolsandboxd --check accepts the installed configuration" config_check
need "systemctl enable --now toolsandboxd.socket" enable_socket
check "the service does not run before the first connection" not_started_yet
need "the first client starts the service (socket activation, Type=notify)" first_client_starts_it
check "the daemon runs in <service>/supervisor and delegates cpu, memory, pids" cgroup_layout
check "toolsandbox call runs a tool in a leaf beside the supervisor" call_tool
check "the installed Python client answers (python3 -m toolsandbox_client status)" python_client
check "the unit's memory settings are in force (OOMPolicy, oom_score_adj, MemoryMax)" oom_settings
check "a memory bomb run is OOM-killed; the service stays active and serving" memory_bomb_keeps_service
check "systemctl reload keeps the main process" reload_keeps_main
check "a warm pool fills and hands over under the unit" warm_pool_hands_over
check "after stopping the service the socket activates a new instance" socket_survives_service_stop
check "with OOMPolicy=stop the same bomb stops the service (what continue prevents)" oompolicy_stop_would_stop_it
check "an OOM of the whole service (MemoryMax=) kills the run, not the daemon" service_oom_takes_the_run
check "after stopping socket and service nothing is left" nothing_left
check "with a broken configuration the unit gives up and clients are let go" broken_config_fails_fast
finish
