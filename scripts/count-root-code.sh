#!/bin/bash
# count-root-code.sh: how much of the project's own code runs as root.
#
#   scripts/count-root-code.sh [--build DIR] [--binary NAME] [--max N] [--files]
#
# Counts the lines, without comments and blank lines, of every first-party
# source file compiled into the binary NAME (default toolsandboxd, the
# process that stays root) of the build tree DIR (default $TSB_BUILD, else
# build/), and of every header of this checkout those files include.
#
# "Compiled into" is read from the binary itself: the compile units of its
# DWARF debug information (the tree is built with -g), so an object a static
# library holds but the link left out is not counted. Headers come from each
# unit's dependency file (.o.d); a header counts once, even when many units
# include it, and counts whole (an upper bound: it may declare more than the
# binary uses). Third-party code (Asio, nlohmann, spdlog, libc) and files
# generated into the build tree (the embedded policies) are not counted.
#
# --files prints each file with its count. --max N exits 1 when the total is
# above N. Exit status 2: bad usage or a tree without debug information.

set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/.." && pwd)
build=${TSB_BUILD:-$src/build}
binary=toolsandboxd
max=""
files=0
usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2
  exit 2
}
while (($#)); do
  case $1 in
    --build) build=${2:-}; shift 2 ;;
    --binary) binary=${2:-}; shift 2 ;;
    --max) max=${2:-}; shift 2 ;;
    --files) files=1; shift ;;
    -h | --help) usage ;;
    *) echo "count-root-code.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -z "$max" ] || [[ $max =~ ^[0-9]+$ ]] || { echo "count-root-code.sh: --max takes a number, not '$max'" >&2; exit 2; }
exe="$build/bin/$binary"
[ -x "$exe" ] || { echo "count-root-code.sh: no program '$exe' (build the tree first)" >&2; exit 2; }

exec /usr/bin/python3 - "$src" "$build" "$exe" "$max" "$files" <<'PY'
import os, re, subprocess, sys

sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
from cxx_text import code_lines  # noqa: E402

src, build, exe, max_lines, show_files = sys.argv[1:6]
src = os.path.realpath(src)
build = os.path.realpath(build)

def first_party(path):
    p = os.path.realpath(path)
    return p.startswith(src + os.sep) and not p.startswith(build + os.sep) and "/tests/vm/.cache/" not in p

# Compile units of the binary: DW_TAG_compile_unit's DW_AT_name, resolved
# against its DW_AT_comp_dir.
info = subprocess.run(["readelf", "--debug-dump=info", "--dwarf-depth=1", exe],
                      capture_output=True, text=True, check=True).stdout
units, name, comp_dir = set(), None, None
for line in info.splitlines():
    if "DW_TAG_compile_unit" in line:
        if name:
            units.add(os.path.join(comp_dir or "", name))
        name, comp_dir = None, None
        continue
    m = re.search(r"DW_AT_(name|comp_dir)\s*:\s*(?:\([^)]*\):\s*)?(.+)$", line)
    if m:
        if m.group(1) == "name" and name is None:
            name = m.group(2).strip()
        elif m.group(1) == "comp_dir":
            comp_dir = m.group(2).strip()
if name:
    units.add(os.path.join(comp_dir or "", name))
sources = {os.path.realpath(u) for u in units if first_party(u)}
if not sources:
    sys.exit(f"count-root-code.sh: {exe} has no compile units of this checkout (no -g?)")

# Headers: from the dependency file of each source's object.
deps = {}
for root, _, names in os.walk(build):
    for n in names:
        if not n.endswith(".o.d"):
            continue
        with open(os.path.join(root, n), errors="replace") as f:
            text = f.read().replace("\\\n", " ")
        items = text.split(":", 1)[1].split() if ":" in text else []
        # Relative names are relative to where the compiler ran: the target's
        # own build directory (Makefiles: the one above CMakeFiles/) or the
        # build tree's top (Ninja).
        cwd = root.split(os.sep + "CMakeFiles" + os.sep)[0]
        def resolve(i):
            if os.path.isabs(i):
                return os.path.realpath(i)
            for base in (cwd, build):
                if os.path.exists(os.path.join(base, i)):
                    return os.path.realpath(os.path.join(base, i))
            return os.path.realpath(os.path.join(cwd, i))
        # A tree reconfigured after a move may keep an older object of the
        # same source elsewhere: the newest dependency file wins.
        mtime = os.path.getmtime(os.path.join(root, n))
        if items and mtime >= deps.get(resolve(items[0]), (0, None))[0]:
            deps[resolve(items[0])] = (mtime, {resolve(i) for i in items[1:]})
counted = set(sources)
for s in sources:
    if s not in deps:
        sys.exit(f"count-root-code.sh: no dependency file for {os.path.relpath(s, src)} in {build}")
    counted.update(h for h in deps[s][1] if first_party(h))

rows = sorted((code_lines(p), os.path.relpath(p, src)) for p in counted)
total = sum(r[0] for r in rows)
if show_files == "1":
    for lines, path in rows:
        print(f"{lines:6d}  {path}")
print(f"{total} lines of first-party code (no comments, no blank lines) in {len(rows)} files "
      f"compiled into {os.path.relpath(exe, src) if exe.startswith(src) else exe}")
if max_lines and total > int(max_lines):
    print(f"count-root-code.sh: {total} lines, over the limit of {max_lines} (--max)", file=sys.stderr)
    sys.exit(1)
PY
