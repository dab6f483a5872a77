"""Tests for isolate/runner/toolsandbox_venv_builder.py, run on the host (the
daemon runs it inside a build sandbox): a venv built from a local wheel
directory with the system's pip, written as a venv archive
(daemon/venv/archive.h; tests/unit/venv_archive_test.cc extracts the
builder's archives with the front end's own extractor).

    /usr/bin/python3 -m pytest -q tests/python/test_venv_builder.py
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILDER = os.path.normpath(os.path.join(HERE, "..", "..", "isolate", "runner", "toolsandbox_venv_builder.py"))
PYTHON = "/usr/bin/python3"
sys.path.insert(0, HERE)

from wheels import make_wheel  # noqa: E402


def read_archive(data):
    """The records of a venv archive: [(kind, path, mode, payload)]; the
    last one is the end record."""
    assert data[:8] == b"TSBVENV1", data[:16]
    out, i = [], 8
    while i < len(data):
        kind = data[i:i + 1].decode()
        (n,) = struct.unpack(">H", data[i + 1:i + 3])
        path = data[i + 3:i + 3 + n].decode()
        mode, size = struct.unpack(">HQ", data[i + 3 + n:i + 13 + n])
        payload = data[i + 13 + n:i + 13 + n + size]
        i += 13 + n + size
        out.append((kind, path, mode, payload))
    return out


def pip_available():
    return subprocess.run([PYTHON, "-m", "pip", "--version"], capture_output=True).returncode == 0


@unittest.skipUnless(pip_available(), "the system's pip is missing (scripts/lib.sh installs python3-pip)")
class VenvBuilderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tsb-venv-builder-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.wheels = os.path.join(self.tmp, "wheels")
        os.mkdir(self.wheels)
        make_wheel(self.wheels, "tsbdep", "2.0")
        make_wheel(self.wheels, "tsbtool", "1.5", requires=["tsbdep>=2"])

    def build(self, requirements, **extra):
        venv = os.path.join(self.tmp, "venv")
        req = {"requirements": requirements, "find_links": self.wheels, "venv": venv, **extra}
        return subprocess.run([PYTHON, "-I", BUILDER], input=json.dumps(req).encode(), capture_output=True, timeout=120)

    def test_builds_with_dependencies_and_archives_the_venv(self):
        r = self.build(["tsbtool==1.5"])
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        recs = read_archive(r.stdout)
        self.assertEqual(recs[-1], ("e", "", 0, b""))
        manifest = json.loads(recs[0][3])
        self.assertEqual(recs[0][0], "m")
        self.assertEqual(manifest["requirements"], ["tsbtool==1.5"])
        self.assertIn("tsbtool==1.5", manifest["freeze"])
        self.assertIn("tsbdep==2.0", manifest["freeze"])
        self.assertEqual(manifest["python"].count("."), 2)
        paths = {p: (k, m, d) for k, p, m, d in recs[1:-1]}
        # What chooses the interpreter is the daemon's to write (archive.h):
        # never in the archive.
        for reserved in ("bin/python3", "bin/python", "pyvenv.cfg", "lib64"):
            self.assertNotIn(reserved, paths)
        self.assertFalse([p for p in paths if p.startswith("bin/python3.") or p.endswith("._pth")])
        self.assertEqual(paths["bin"][0], "d")
        site = [p for p in paths if p.endswith("site-packages/tsbtool/__init__.py")]
        self.assertEqual(len(site), 1, sorted(paths))
        self.assertIn(b"tsbtool-from-the-test-index", paths[site[0]][2])
        self.assertTrue(any(p.endswith("site-packages/tsbdep/__init__.py") for p in paths))
        # Parents before children, every parent a directory record.
        seen = set()
        for k, p, m, d in recs[1:-1]:
            parent = p.rpartition("/")[0]
            self.assertTrue(parent == "" or parent in seen, p)
            if k == "d":
                seen.add(p)
        # The venv works as built.
        out = subprocess.run([os.path.join(self.tmp, "venv", "bin", "python3"), "-c",
                              "import tsbtool, tsbdep; print(tsbtool.VALUE)"], capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "tsbtool-from-the-test-index", out.stderr)

    def test_a_missing_or_conflicting_requirement_fails_with_pips_words_and_no_archive(self):
        for reqs in (["no-such-package"], ["tsbtool==1.5", "tsbdep<2"]):
            shutil.rmtree(os.path.join(self.tmp, "venv"), ignore_errors=True)
            r = self.build(reqs)
            self.assertEqual(r.returncode, 2, r.stderr.decode())
            self.assertEqual(r.stdout, b"")
            self.assertRegex(r.stderr.decode(), r"(No matching distribution|ResolutionImpossible|conflict)")

    def test_source_distributions_need_the_policys_leave(self):
        # An sdist only: refused with binary wheels only (the default).
        os.remove(os.path.join(self.wheels, "tsbdep-2.0-py3-none-any.whl"))
        with open(os.path.join(self.wheels, "tsbdep-2.0.tar.gz"), "wb") as f:
            f.write(b"not really an sdist")
        r = self.build(["tsbdep"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("No matching distribution", r.stderr.decode())

    def test_requests_that_are_not_requirements_are_refused(self):
        for bad in ({"requirements": "tsbdep"}, {"requirements": ["--index-url=http://x"]},
                    {"requirements": ["tsbdep"], "find_links": None}):
            req = {"find_links": self.wheels, "venv": os.path.join(self.tmp, "v"), **bad}
            r = subprocess.run([PYTHON, "-I", BUILDER], input=json.dumps(req).encode(), capture_output=True, timeout=60)
            self.assertEqual(r.returncode, 3, (bad, r.stderr))
            self.assertEqual(r.stdout, b"")
            self.assertIn("venv build failed", r.stderr.decode())


if __name__ == "__main__":
    unittest.main()
