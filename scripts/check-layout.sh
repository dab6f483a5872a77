#!/bin/bash
# check-layout.sh: the tree is the trust map, and it stays one.
#
#   scripts/check-layout.sh [--build DIR] [--sizes]
#
# Checks, in a built tree DIR (default $TSB_BUILD, else build/):
#   1. The root's folders hold the root's code and nothing else: every
#      first-party file compiled into toolsandboxd (the list of
#      scripts/count-root-code.sh) lives in one of ROOT_FOLDERS below, and
#      every source file in those folders is on that list.
#   2. Each folder of the unprivileged side stays within its line budget
#      (code lines: no comments, no blank lines), the table BUDGETS below.
#      A budget is raised only in a change that says why.
#   3. No function in daemon/, isolate/ or protocol/ is longer than 150
#      lines (a reviewer must be able to hold one).
# --sizes prints each folder's code lines and budget. Exit status 1: a
# check failed (each failure is said); 2: bad usage.

set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/.." && pwd)
build=${TSB_BUILD:-$src/build}
sizes=0
while (($#)); do
  case $1 in
    --build) build=${2:-}; shift 2 ;;
    --sizes) sizes=1; shift ;;
    -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
    *) echo "check-layout.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
root_files=$("$here/count-root-code.sh" --build "$build" --files) || exit 2

exec /usr/bin/python3 - "$src" "$sizes" "$root_files" <<'PY'
import os, re, sys

src, sizes, root_list = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
sys.path.insert(0, os.path.join(src, "scripts"))
from cxx_text import code_lines as file_code_lines, strip  # noqa: E402

# The folders of the root process (toolsandboxd), and only they.
ROOT_FOLDERS = ["isolate/base", "isolate/engine", "daemon/spawner", "daemon/wire"]

# Code lines per folder of the unprivileged side: folder, budget. Raise a
# budget only in a change that says why.
BUDGETS = {
    # Set at the restructuring that made the tree the trust map, about 3 %
    # above each folder's size then.
    "isolate/supervise": 400,
    # Raised from 800: the tool's Landlock ruleset, made from the plan's
    # steps (landlock.h), and the kernel's interface up to ABI 7; the mask
    # objects init makes itself and the move aside of what a tool left at a
    # file's mount point. Then from 1000: the end note of warm sandboxes
    # (its pipe, its place among the tool's descriptors, pid 1's read of it).
    "isolate/init": 1020,
    # Raised from 125: the log lines' formatter and escaped() (log.h,
    # quote.h), the one place every log line and terminal text is escaped;
    # then from 150: print_line() and print_block(), the command line's one
    # way to write text for a person.
    "daemon/common": 170,
    # Raised from 850: the npm build policy of TypeScript tools' node_modules;
    # then from 950: the session policy and its launcher (sessions); then
    # from 1020: the session policy's keyed /venv and /node_modules rows
    # (a command's own packages), one helper for them with the run policy.
    "daemon/compile": 1035,
    # Raised from 5000: the egress proxy's reading of a host and its deny
    # list moved here (egress_host.cc, from daemon/frontend/egress, whose
    # budget went down as much), so a policy is checked against them; then
    # from 5200: a policy's network as E2B takes it (e2b_network.cc), so
    # what E2B cannot run as written is refused when a policy is read, and
    # the delegated organizations' check (registry.cc); limits.result, the
    # result channel's own limit; and typescript.packages (npm_packages.cc).
    # Then from 5550: a policy's "sessions" (sessions.cc) and its explain;
    # then from 5700: the sessions' "workspace" and its explain.
    "daemon/policy": 5740,
    # Raised from 1100: npm requirements of TypeScript tools (npm_requirements.cc);
    # then from 1250: a node_modules' key, and trees in the cache.
    "daemon/venv": 1300,
    # Raised from 1250: `toolsandbox venv` shows and builds node_modules too;
    # then from 1280: `toolsandbox session`, the stdio bridge to a session,
    # and its operator's verbs (list, kill); then from 1570: signals
    # forwarded by the bridge, and `session kill --signal`.
    "daemon/cli": 1600,
    # Raised from 950: a session request's placement and checks; then from
    # 1010: a workspace's check and the operator's list of workspaces.
    "daemon/frontend": 1030,
    # Set with the folder: per-peer fairness, about 10 % above its size (346).
    "daemon/frontend/admission": 380,
    # Raised from 350: a TypeScript run's checks (prepare_typescript); then
    # from 400: those checks as checked_pip_set and checked_npm_set, which a
    # session's own packages share (daemon/frontend/session went down more).
    "daemon/frontend/pipeline": 410,
    # Raised from 1400: TypeScript rules of the local backend; then from
    # 1420: a TypeScript run's order (the policy's TypeScript policy, its
    # channel in both modes), the check of its runtime on this host, and a
    # TypeScript tool's node_modules, found or built like a venv; then from
    # 1640: a session's stdio handed over (SpawnerLink::run's take_stdio);
    # then from 1660: venv_for for a session's packages too (BuildFor, the
    # cache's keys, the installer's own refusal told apart).
    "daemon/frontend/local": 1680,
    # Set with the folder: sessions, about 10 % above its size (409); raised
    # from 450: workspaces kept between sessions (workspace.cc: the keeper's
    # sandbox, its messages, its TTL; a session's relay on pipes made here);
    # then from 920: a command's own packages (packages.cc: npx's and uvx's
    # words read, the set checked and built as a tool's, the program found
    # beneath its built tree); then from 1290: every session under a keeper
    # (a one-shot's end merged with its command's), signals for a
    # session's command, and the slots of sessions whose packages are made.
    "daemon/frontend/session": 1310,
    # Lowered from 1700: its steps return Result<T, Fail>. Raised from 1630:
    # TypeScript tools (npm installs, the source handling, the tool-mode cells).
    "daemon/frontend/e2b": 1850,
    # Lowered from 1275: its pure address code moved to daemon/policy.
    "daemon/frontend/egress": 1125,
    # Raised from 1800: Letta's last edge cases (a pickle's types checked,
    # tool mode's output decoded up front, the seed's strict decode).
    "daemon/frontend/letta": 1860,
    # Raised from 1350: the session request and its frames; then from 1400:
    # session_kill's signal (the names a command may be sent).
    "protocol": 1425,
}

MAX_FUNCTION_LINES = 150
failures = []

def sources(folder):
    d = os.path.join(src, folder)
    return sorted(os.path.join(folder, f) for f in os.listdir(d)
                  if f.endswith((".cc", ".h", ".c")) and os.path.isfile(os.path.join(d, f)))

# 1. The root's folders.
root_files = set()
for line in root_list.splitlines():
    m = re.match(r"\s*\d+\s+(\S+)$", line)
    if m:
        root_files.add(m.group(1))
for f in sorted(root_files):
    if os.path.dirname(f) not in ROOT_FOLDERS:
        failures.append(f"{f} is compiled into the root process but lives outside the root's folders ({', '.join(ROOT_FOLDERS)})")
for folder in ROOT_FOLDERS:
    for f in sources(folder):
        if f not in root_files:
            failures.append(f"{f} is in a root folder but the root process does not run it: move it out of {folder}/")

# 2. Budgets.
def code_lines(path):
    return file_code_lines(os.path.join(src, path))
for folder, budget in BUDGETS.items():
    n = sum(code_lines(f) for f in sources(folder))
    if sizes:
        print(f"{n:6d} / {budget:6d}  {folder}")
    if n > budget:
        failures.append(f"{folder}/ has {n} code lines, over its budget of {budget} (scripts/check-layout.sh, BUDGETS)")

# 3. Function length: a definition starts at a line that ends a signature
# with "{" at namespace or class level and ends at its matching brace.
head = re.compile(r"^\s*[A-Za-z_~][^;=]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:->\s*[\w:<>,\s*&]+)?\{\s*$")
keyword = re.compile(r"^\s*(?:if|for|while|switch|else|do|namespace|struct|class|enum|return|catch|try)\b")
for top in ("daemon", "isolate", "protocol"):
    for d, _, names in os.walk(os.path.join(src, top)):
        for name in sorted(names):
            if not name.endswith((".cc", ".h")):
                continue
            path = os.path.join(d, name)
            lines = strip(open(path, errors="replace").read()).split("\n")
            for i, line in enumerate(lines):
                if not head.match(line) or keyword.match(line):
                    continue
                depth = 0
                for j in range(i, len(lines)):
                    depth += lines[j].count("{") - lines[j].count("}")
                    if depth <= 0:
                        break
                if j - i + 1 > MAX_FUNCTION_LINES:
                    failures.append(f"{os.path.relpath(path, src)}:{i + 1}: a function of {j - i + 1} lines "
                                    f"(at most {MAX_FUNCTION_LINES}): split it into named steps")

for f in failures:
    print(f"check-layout.sh: {f}", file=sys.stderr)
sys.exit(1 if failures else 0)
PY
