#!/usr/bin/python3
"""check-error-idiom.py: every error passed up carries context.

  scripts/check-error-idiom.py [--list]

docs/ERRORS.md, section 1: a function that passes a callee's Error up adds
what it was doing (`.wrap("context")`, or TSB_TRY(expr, "context")), so a
message reads outermost first. This check fails on a bare propagation in
the project's C++ outside tests/, bench/ and tests' fuzz targets:

  return X.error();   return std::move(X).error();   (and co_return)

Two kinds of site may pass an error up unchanged, each said where it is:
  - the steps of a READER below, whose every message already begins with
    its place in the document (a policy's file:line:col and JSON pointer,
    a request head's part), so a step adds nothing a reader of the
    message lacks; the reader's caller wraps once;
  - a site whose line, or the comment line right above it, says
    `// context: <why>` (the callee names the operation and its subject).

Before looking at the tree the check runs itself on known lines, so a
broken pattern fails loudly. --list prints every bare site found.
Exit status: 0 clean, 1 a bare propagation (or a stale reader entry), 2
bad usage or a broken self-check.
"""
import os
import re
import sys

src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(src, "scripts"))
from cxx_text import checkout_sources, report_findings, strip  # noqa: E402

if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] != "--list"):
    print(__doc__ if sys.argv[1] in ("-h", "--help") else "check-error-idiom.py: unknown argument '%s'" % sys.argv[1], file=sys.stderr)
    sys.exit(2)
show = len(sys.argv) == 2

# file (path in the checkout), why its steps pass errors up unchanged
READERS = [
    ("daemon/policy/policy.cc", "the policy reader: messages begin with file:line:col and the JSON pointer"),
    ("daemon/policy/registry.cc", "the organizations reader: messages begin with file:line:col and the JSON pointer"),
    ("daemon/policy/config.cc", "the daemon configuration's reader: messages begin with file:line:col and the key"),
    ("daemon/policy/seccomp_profile.cc", "the seccomp profile reader: messages begin with file:line:col and the JSON pointer"),
    ("daemon/frontend/egress/request.cc", "the egress proxy's request-head parser: each message names the part of the head "
     "it refuses, and the proxy sends it to the tool as the refusal's reason"),
]
EXCLUDED_DIRS = ("tests/", "bench/")
BARE = re.compile(r"\b(?:co_)?return\s+(?:std::move\s*\(\s*[\w.\->*]+\s*\)|[\w.\->*]+)\s*\.\s*error\s*\(\s*\)\s*;")
MARK = re.compile(r"//\s*context:\s*\S")


def sites(text):
    """(line number, line) of each bare propagation in C++ `text` not marked."""
    code = strip(text).split("\n")
    raw = text.split("\n")
    found = []
    for i, line in enumerate(code):
        if not BARE.search(line):
            continue
        if MARK.search(raw[i]) or (i > 0 and MARK.search(raw[i - 1]) and not code[i - 1].strip()):
            continue
        found.append((i + 1, raw[i].strip()))
    return found


MUST_FIND = [
    "if (!r.ok()) return r.error();",
    "if (!r.ok()) return std::move(r).error();",
    "if (!r.ok()) co_return std::move(r).error();",
    "if (!r) return std::move(*idoc).error();",
    "if (!r) return std::move( st ) . error ( );",
    "// context: a comment that is not right above\nint x = 1;\nreturn r.error();",
]
MUST_PASS = [
    "if (!r.ok()) return std::move(r).error().wrap(\"reading\");",
    "TSB_TRY(step(), \"mounting /proc\");",
    "if (!r.ok()) return r.error().wrap(\"x\");",
    "return Error::invalid(\"x\");",
    "// return r.error();",
    "const Error& e = r.error();",
    "if (!v.ok()) return std::move(v).error();  // context: open_view names the path",
    "// context: open_view names the path\nif (!v.ok()) return std::move(v).error();",
]
broken = [("not found: " + t) for t in MUST_FIND if not sites(t)]
broken += [("found in: " + t) for t in MUST_PASS if sites(t)]
if broken:
    print("check-error-idiom.py: the check is broken:\n  " + "\n  ".join(broken), file=sys.stderr)
    sys.exit(2)

files = checkout_sources(src, EXCLUDED_DIRS)

readers = {f for f, _ in READERS}
status = 0
for f, _ in READERS:
    if f not in files:
        print("check-error-idiom.py: the reader %s is not in the tree (stale entry)" % f, file=sys.stderr)
        status = 1
bare = []
passed = 0
for f in files:
    with open(os.path.join(src, f), encoding="utf-8", errors="surrogateescape") as fh:
        text = fh.read()
    for no, line in sites(text):
        if f in readers:
            passed += 1
            if show:
                print("%s:%d: reader: %s" % (f, no, line))
            continue
        bare.append("%s:%d: %s" % (f, no, line))
        if show:
            print(bare[-1])
if bare:
    report_findings("check-error-idiom.py: an error passed up without context (docs/ERRORS.md, section 1):", bare,
                    "  Add what the caller was doing: std::move(r).error().wrap(\"...\"), or TSB_TRY(expr, \"...\").\n"
                    "  When the callee's message already names the operation and its subject, say so on the line\n"
                    "  or the line above: // context: <why>.")
    status = 1
if status == 0 and not show:
    print("check-error-idiom.py: %d files, every error passed up with context (%d reader steps in %d readers)"
          % (len(files), passed, len(READERS)))
sys.exit(status)
