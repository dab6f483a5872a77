#!/usr/bin/env bash
# Installs what is missing, builds, and starts toolsandboxd in the
# foreground on its embedded defaults (policies compiled into the binary,
# socket /run/toolsandboxd/toolsandboxd.sock, root may connect). Stop it
# with Ctrl-C (SIGTERM/SIGINT: in-flight runs get 30 s to finish).
#
# Try it from another terminal:
#   build/bin/toolsandbox status
#   build/bin/toolsandbox call examples/add.py --args '{"a": 2, "b": 3}'
source "$(dirname "$0")/lib.sh"
setup_all "${TSB_PROGRAMS[@]}"
log "starting toolsandboxd (embedded defaults); socket /run/toolsandboxd/toolsandboxd.sock"
exec "$TSB_BUILD/bin/toolsandboxd" "$@"
