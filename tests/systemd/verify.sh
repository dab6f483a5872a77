#!/bin/bash
# verify.sh [BUILD_DIR]: the installed systemd units, checked without booting.
#
# Installs the build into a temporary DESTDIR (nothing touches the host's
# root) and checks what a package would ship:
#   1. systemd-analyze verify of toolsandboxd.service and toolsandboxd.socket,
#      with ExecStart= pointed at the DESTDIR binary (verify insists that it
#      exists and is executable); any output at all, warnings included, fails;
#   2. ExecStart's --config file is the configuration the build installed;
#   3. the sysusers.d and tmpfiles.d entries apply cleanly to the DESTDIR
#      root (systemd-sysusers --root, systemd-tmpfiles --root --create);
#   4. toolsandboxd --check accepts the installed configuration, with its
#      absolute paths (policies) mapped into the DESTDIR.
#
# BUILD_DIR defaults to $TSB_BUILD, else build/ of this checkout. Needs
# systemd-analyze, systemd-sysusers, systemd-tmpfiles (Debian: systemd) and
# cmake; root is not needed. About a second once the build exists; run by
# scripts/test.sh. The booted counterpart (socket activation, delegation,
# stop) is tests/vm/systemd-lane.sh in the VM lane.
#
# Exit status: 0 all passed, 1 a check failed, 77 a tool is missing (skip;
# a failure instead when TOOLSANDBOXD_TESTS_MUST_RUN contains "systemd").

set -u -o pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${TSB_BUILD:-$src/build}}
failed=0

say() { echo "verify.sh: $*"; }
fail() {
	say "FAIL: $*"
	failed=1
}

for tool in systemd-analyze systemd-sysusers systemd-tmpfiles cmake; do
	if ! command -v "$tool" >/dev/null; then
		if [[ ${TOOLSANDBOXD_TESTS_MUST_RUN:-} == *systemd* ]]; then
			say "FAIL: $tool is missing"
			exit 1
		fi
		say "SKIP: $tool is missing"
		exit 77
	fi
done
[ -f "$build/CMakeCache.txt" ] || { say "FAIL: $build is not a configured build directory"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/root
if ! DESTDIR=$dest cmake --install "$build" >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	say "FAIL: cmake --install into DESTDIR"
	exit 1
fi

service=$(find "$dest" -path '*/systemd/system/toolsandboxd.service' | head -1)
socket=$(find "$dest" -path '*/systemd/system/toolsandboxd.socket' | head -1)
if [ -z "$service" ] || [ -z "$socket" ]; then
	say "FAIL: the units were not installed"
	exit 1
fi

# 1. systemd-analyze verify. Copies side by side (verify finds the socket the
#    service requires in the same directory), ExecStart= into the DESTDIR.
mkdir "$tmp/units"
exec_start=$(sed -n 's/^ExecStart=//p' "$service")
binary=${exec_start%% *}
[ -x "$dest$binary" ] || fail "ExecStart= names $binary, which the build did not install"
sed "s#^ExecStart=$binary#ExecStart=$dest$binary#" "$service" >"$tmp/units/toolsandboxd.service"
cp "$socket" "$tmp/units/toolsandboxd.socket"
if out=$(cd "$tmp/units" && systemd-analyze verify --man=no toolsandboxd.service toolsandboxd.socket 2>&1) && [ -z "$out" ]; then
	say "ok: systemd-analyze verify (service, socket)"
else
	printf '%s\n' "$out"
	fail "systemd-analyze verify"
fi

# 2. The configuration ExecStart= passes exists in the install.
config=$(sed -n 's/.*--config \([^ ]*\).*/\1/p' <<<"$exec_start")
if [ -n "$config" ] && [ -f "$dest$config" ]; then
	say "ok: ExecStart's --config $config is installed"
else
	fail "ExecStart's --config '$config' is not among the installed files"
fi

# 3. sysusers.d and tmpfiles.d, applied to the DESTDIR root.
sysusers=$(find "$dest" -path '*/sysusers.d/toolsandboxd.conf' | head -1)
tmpfiles=$(find "$dest" -path '*/tmpfiles.d/toolsandboxd.conf' | head -1)
mkdir -p "$dest/etc"
if out=$(systemd-sysusers --root="$dest" "$sysusers" 2>&1) && grep -q '^toolsandbox:' "$dest/etc/group" &&
	grep -q '^toolsandboxd:' "$dest/etc/passwd"; then
	say "ok: sysusers.d creates the toolsandbox group and the toolsandboxd user"
else
	printf '%s\n' "$out"
	fail "systemd-sysusers"
fi
if out=$(systemd-tmpfiles --root="$dest" --create "$tmpfiles" 2>&1) && [ -z "$out" ] &&
	[ "$(stat -c %a "$dest/run/toolsandbox")" = 711 ] &&
	[ "$(stat -c %a "$dest/var/cache/toolsandbox")" = 711 ] &&
	[ "$(stat -c '%a %u' "$dest/var/cache/toolsandbox/venvs")" = "755 $(awk -F: '$1 == "toolsandboxd" { print $3 }' "$dest/etc/passwd")" ]; then
	say "ok: tmpfiles.d creates the runtime and state directories and the front end's venv cache"
else
	printf '%s\n' "$out"
	fail "systemd-tmpfiles"
fi

# 4. toolsandboxd --check on the installed configuration. Its absolute paths
#    (policies, organizations) are rewritten into the DESTDIR; the rest is
#    checked as shipped, engine section included. The configuration names
#    the group sysusers.d creates: as root, the check runs in a private mount
#    namespace whose /etc/group has that group added (the host's is not
#    touched); otherwise the group name is replaced by "root" and said so.
if [ -f "$dest$config" ]; then
	prefix_etc=${config%/toolsandboxd/*}
	sed "s#\"$prefix_etc/#\"$dest$prefix_etc/#g" "$dest$config" >"$tmp/toolsandboxd.json"
	check_cmd=("$dest$binary" --check --config "$tmp/toolsandboxd.json")
	if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
		cat /etc/group >"$tmp/group"
		cat /etc/passwd >"$tmp/passwd"
		grep -q '^toolsandbox:' /etc/group || grep '^toolsandbox:' "$dest/etc/group" >>"$tmp/group"
		grep -q '^toolsandboxd:' /etc/group || grep '^toolsandboxd:' "$dest/etc/group" >>"$tmp/group"
		grep -q '^toolsandboxd:' /etc/passwd || grep '^toolsandboxd:' "$dest/etc/passwd" >>"$tmp/passwd"
		# shellcheck disable=SC2016  # $1, $2 and $@ belong to the inner sh
		check_cmd=(unshare -m sh -c 'mount --bind "$1" /etc/group && mount --bind "$2" /etc/passwd && shift 2 && exec "$@"' \
			sh "$tmp/group" "$tmp/passwd" "${check_cmd[@]}")
	elif ! getent group toolsandbox >/dev/null; then
		say "note: not root, and no toolsandbox group here: --check runs with the group \"root\" instead"
		sed -i 's/"toolsandbox"/"root"/g' "$tmp/toolsandboxd.json"
	fi
	if out=$("${check_cmd[@]}" 2>&1); then
		say "ok: toolsandboxd --check accepts the installed configuration"
	else
		printf '%s\n' "$out" | tail -5
		fail "toolsandboxd --check rejects the installed configuration"
	fi
fi

exit "$failed"
