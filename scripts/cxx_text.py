"""C++ source as the project's checks read it (scripts/count-root-code.sh,
scripts/check-layout.sh, scripts/check-json-rule.sh,
scripts/check-error-idiom.py): comments removed, line breaks kept so that
line numbers hold; and the checkout's own C++ sources."""
import os
import re
import subprocess
import sys


def strip(text, blank_strings=True):
    """`text` without comments. With blank_strings, the contents of string,
    character and raw string literals are blanked too (the quotes stay, a raw
    string becomes ""), so nothing inside one reads as code; without it they
    are kept as written (a line of a raw string counts as a line)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, end) if blank_strings else text[i:end])
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c if blank_strings else text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def code_lines(path):
    """Lines of `path` with code once comments are removed (strings kept)."""
    with open(path, errors="replace") as f:
        return sum(1 for line in strip(f.read(), blank_strings=False).splitlines() if line.strip())


CXX_SUFFIXES = (".cc", ".h", ".cpp", ".hpp", ".cxx", ".hh")


def checkout_sources(src, excluded_dirs=("tests/", "bench/")):
    """The C++ sources of the checkout at `src` (paths relative to it, sorted):
    the files git tracks and the new ones it does not ignore, or every file
    outside build trees and dot-folders without git; `excluded_dirs` left out."""
    try:
        files = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               capture_output=True, check=True).stdout.decode("utf-8", "surrogateescape").split("\0")
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(src):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            files += [os.path.relpath(os.path.join(root, f), src) for f in names]
    return sorted({f for f in files if f.endswith(CXX_SUFFIXES) and not f.startswith(tuple(excluded_dirs))
                   and os.path.isfile(os.path.join(src, f))})


def report_findings(title, findings, hint):
    """A check's failures on stderr: `title`, each finding indented, `hint`."""
    print(title, file=sys.stderr)
    for line in findings:
        print("  " + line, file=sys.stderr)
    print(hint, file=sys.stderr)
