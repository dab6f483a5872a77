#!/bin/bash
# check-json-rule.sh: no bare JSON parse in the project's own code.
#
#   scripts/check-json-rule.sh [--list]
#
# JSON that crosses a trust boundary (client requests, a tool's output, the
# venv build sandbox's manifest, E2B's answers, the cache's files) is read
# through the bounded readers of protocol/json_limits.h (parse_json_bounded,
# parse_json_limited), the request scanner (protocol/json_scan.h) or
# parse_jsonc (daemon/policy/jsonc.h); docs/HACKING.md states the rule. This
# check fails when a C++ source of the checkout outside tests/ and bench/
# (test code parses what it made) calls one of nlohmann's readers directly:
#
#   X::parse(  X::accept(  X::sax_parse(  X::from_cbor(  X::from_msgpack(
#   X::from_ubjson(  X::from_bjdata(  X::from_bson(  "..."_json
#
# where X is json, ordered_json, basic_json<...> (with or without
# nlohmann::) or a type alias of one made in the same file (using J = ...).
# Comments and the contents of string literals are not looked at.
#
# The trusted sites are ALLOWED below: a file's name (not its folder, so
# that moving folders does not break the list), a fragment of the call's
# line, and the reason the site may parse directly. Each entry must match
# exactly one site, so a stale entry fails too. --list prints every site
# found, allowed or not.
#
# Before looking at the tree the check runs itself on known lines (what it
# must find, and what it must not), so a broken pattern fails loudly rather
# than passing everything. Exit status: 0 clean, 1 a bare parse (or a stale
# entry), 2 bad usage or a broken self-check.

set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/.." && pwd)
list=0
case ${1:-} in
  "") ;;
  --list) list=1 ;;
  -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  *) echo "check-json-rule.sh: unknown argument '$1'" >&2; exit 2 ;;
esac

exec /usr/bin/python3 - "$src" "$list" <<'PY'
import os, re, sys

src, show = sys.argv[1], sys.argv[2] == "1"
sys.path.insert(0, os.path.join(src, "scripts"))
from cxx_text import checkout_sources, report_findings, strip  # noqa: E402

# file name, fragment of the line, reason
ALLOWED = [
    ("json_limits.cc", "nlohmann::json::parse(text.begin(), text.end(), nullptr, false)",
     "parse_json_bounded itself: the text was checked for NUL bytes and nesting first"),
    ("json_limits.cc", "json::sax_parse(text.begin(), text.end(), &b)",
     "parse_json_limited itself: scan_json validated the text under the caller's limits, "
     "and the SAX builder stops at the value and string limits"),
]

EXCLUDED_DIRS = ("tests/", "bench/")
READERS = r"(?:parse|accept|sax_parse|from_cbor|from_msgpack|from_ubjson|from_bjdata|from_bson)"
JSON_TYPES = r"(?:json|ordered_json|basic_json)"


def sites(text):
    """(line number, line) of each direct call of a reader in C++ `text`."""
    code = strip(text)
    names = {JSON_TYPES}
    for m in re.finditer(r"\busing\s+(\w+)\s*=\s*[\w:\s<>,]*?\b" + JSON_TYPES + r"\b", code):
        names.add(re.escape(m.group(1)))
    for m in re.finditer(r"\btypedef\s+[\w:\s<>,]*?\b" + JSON_TYPES + r"\b[\w:\s<>,]*?\b(\w+)\s*;", code):
        names.add(re.escape(m.group(1)))
    call = re.compile(r"\b(?:" + "|".join(sorted(names)) + r")\s*(?:<[^;{}()]*?>)?\s*::\s*(?:template\s+)?"
                      + READERS + r"\s*[(<]")
    literal = re.compile(r'""\s*_json\b|\boperator\s*""\s*_json\b')
    using_reader = re.compile(r"\busing\s+[\w:]*" + JSON_TYPES + r"\s*::\s*" + READERS + r"\s*;")
    found = []
    lines = text.split("\n")
    for no, line in enumerate(code.split("\n"), 1):
        if call.search(line) or literal.search(line) or using_reader.search(line):
            found.append((no, lines[no - 1].strip()))
    return found


# The check on itself.
MUST_FIND = [
    "auto j = json::parse(s);",
    "auto j = nlohmann::json::parse(s, nullptr, false);",
    "auto j = nlohmann::ordered_json::parse(s);",
    "auto j = json :: parse (s);",
    "auto j = nlohmann::basic_json<std::map>::parse(s);",
    "bool ok = json::accept(s);",
    "json::sax_parse(s, &handler);",
    "auto j = json::from_cbor(bytes);",
    "auto j = nlohmann::json::from_msgpack(bytes);",
    "auto j = json::from_bson(v); auto k = json::from_ubjson(v); auto l = json::from_bjdata(v);",
    'auto j = R"({"a": 1})"_json;',
    'auto j = "{}"_json;',
    "using J = nlohmann::json;\nauto j = J::parse(s);",
    "typedef nlohmann::json Doc;\nDoc d = Doc::parse(s);",
    "using nlohmann::json::parse;",
]
MUST_PASS = [
    "auto j = protocol::parse_json_bounded(s);",
    "auto j = protocol::parse_json_limited(s, limits);",
    "auto doc = parse_jsonc(text, path);",
    "// never a bare nlohmann::json::parse",
    "/* json::parse(s) */",
    'log("json::parse failed");',
    'auto s = R"(json::parse(x))";',
    "auto r = venv::parse_requirement(s, false);",
    "std::string t = j.dump();",
    "auto p = json::json_pointer(\"/a\");",
    "int n = 1'000'000; auto k = json_parse_count;",
]
broken = []
for t in MUST_FIND:
    if not sites(t):
        broken.append("not found: " + t)
for t in MUST_PASS:
    if sites(t):
        broken.append("found in: " + t)
if broken:
    print("check-json-rule.sh: the check is broken:\n  " + "\n  ".join(broken), file=sys.stderr)
    sys.exit(2)

files = checkout_sources(src, EXCLUDED_DIRS)

used = [0] * len(ALLOWED)
bare = []
for f in files:
    with open(os.path.join(src, f), encoding="utf-8", errors="surrogateescape") as fh:
        text = fh.read()
    for no, line in sites(text):
        hits = [k for k, (name, frag, _) in enumerate(ALLOWED) if os.path.basename(f) == name and frag in line]
        for k in hits:
            used[k] += 1
        if show:
            print("%s:%d: %s%s" % (f, no, "allowed: " if hits else "", line))
        if not hits:
            bare.append("%s:%d: %s" % (f, no, line))

status = 0
if bare:
    report_findings("check-json-rule.sh: a bare JSON parse outside the trusted sites (docs/HACKING.md, Conventions):", bare,
                    "  Read such text with protocol::parse_json_limited (limits that fit the input) or parse_json_bounded;\n"
                    "  a site that only parses the process's own or embedded text may be added to ALLOWED in\n"
                    "  scripts/check-json-rule.sh, with its reason.")
    status = 1
for k, n in enumerate(used):
    if n != 1:
        name, frag, _ = ALLOWED[k]
        print("check-json-rule.sh: the allowed site %s \"%s\" matches %d sites, not one (stale, or too loose)"
              % (name, frag, n), file=sys.stderr)
        status = 1
if status == 0 and not show:
    print("check-json-rule.sh: %d files, no bare JSON parse (%d trusted sites)" % (len(files), len(ALLOWED)))
sys.exit(status)
PY
