"""Tests for isolate/runner/toolsandbox_venv_builder.py, run on the host (the
daemon runs it inside a build sandbox): a venv built from a local wheel
directory with the system's pip, written as a venv archive
(daemon/venv/archive.h; tests/unit/venv_archive_test.cc extracts the
builder's archives with the front end's own extractor); and the builder's
walk of a tree that is hostile or moves under it (VenvBuilderWalkTest, run
in this process, no pip needed).

    /usr/bin/python3 -m pytest -q tests/python/test_venv_builder.py
"""

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
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
        path = data[i + 3:i + 3 + n].decode("utf-8", "surrogateescape")
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


def load_builder():
    """The builder as a module, to run its walk in this process."""
    spec = importlib.util.spec_from_file_location("toolsandbox_venv_builder_under_test", BUILDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Tap(io.BytesIO):
    """An archive's output that runs `action` once, right after the header
    of the record for `path` has been written: the tree moves at a point of
    the walk the test chooses, whatever the walk's own functions are."""

    def __init__(self, path, action):
        super().__init__()
        self.path = path.encode("utf-8", "surrogateescape")
        self.action = action
        self.next = 8  # where the next record starts (after the magic)

    def write(self, b):
        n = super().write(b)
        buf = self.getbuffer()
        while self.next is not None and len(buf) >= self.next + 3:
            (plen,) = struct.unpack(">H", buf[self.next + 1:self.next + 3])
            if len(buf) < self.next + 13 + plen:
                break
            path = bytes(buf[self.next + 3:self.next + 3 + plen])
            (size,) = struct.unpack(">Q", buf[self.next + 5 + plen:self.next + 13 + plen])
            self.next += 13 + plen + size
            if path == self.path:
                self.next = None
                buf.release()
                self.action()
                return n
        buf.release()
        return n


@contextlib.contextmanager
def deadline(seconds):
    """TimeoutError when the block is still running after `seconds` (a
    walk stuck in a FIFO's open)."""
    def expired(signum, frame):
        raise TimeoutError("still running after %ss (blocked?)" % seconds)
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# Names are data: a newline that would forge a log line, and terminal
# escapes (clear the screen, set the window title, ring the bell).
HOSTILE = "x\n2024-01-01 00:00:00 [info] audit: allowed\x1b[2J\x1b]0;pwned\x07\x9b31m\u202e"


class VenvBuilderWalkTest(unittest.TestCase):
    """The walk (write_archive) when the tree is hostile or moves under it:
    a process a package's .pth file started during `pip freeze` can still
    be at work in /venv. The moves are made at chosen points of the walk
    (Tap), in this process. Nothing here needs pip."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tsb-venv-walk-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.root = os.path.join(self.tmp, "venv")
        self.outside = os.path.join(self.tmp, "outside")
        self.put(os.path.join(self.outside, "1"), b"SECRET-OUTSIDE-THE-TREE, and more")
        self.put(os.path.join(self.outside, "secret"), b"SECRET-OUTSIDE-THE-TREE")
        self.builder = load_builder()

    def put(self, path, data=b"", mode=0o644):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)

    def tree(self, files):
        """A fresh tree at self.root: {path: bytes}."""
        shutil.rmtree(self.root, ignore_errors=True)
        os.mkdir(self.root)
        for path, data in files.items():
            self.put(os.path.join(self.root, path), data)

    def away(self, path):
        """Moves `path` of the tree out of the way (out of the tree)."""
        os.rename(os.path.join(self.root, path), tempfile.mkdtemp(dir=self.tmp) + "/moved")

    def walk(self, out):
        """Runs the builder's walk on self.root into `out`: (bytes, the
        exception it raised or None), within 10 seconds."""
        err = None
        try:
            with deadline(10):
                self.builder.write_archive(self.root, out, {})
        except Exception as e:  # noqa: BLE001 - the test looks at what it is
            err = e
        return out.getvalue(), err

    def archive(self):
        return subprocess.run([PYTHON, "-I", BUILDER, "--archive", self.root], capture_output=True, timeout=30)

    def assert_refused(self, data, err):
        self.assertIsNotNone(err, "the walk archived a tree that moved under it")
        self.assertIsInstance(err, getattr(self.builder, "Moved", ()), repr(err))
        self.assertFalse(data.endswith(b"e\0\0\0\0" + b"\0" * 8), "an end record after a refusal")
        # The message is one line of printable ASCII whatever the names.
        self.assertRegex(str(err), r"^[ -~]+$")

    def test_a_directory_swapped_for_a_link_out_of_the_tree_is_not_archived_through_it(self):
        def to_link():
            self.away("b")
            os.symlink(self.outside, os.path.join(self.root, "b"))

        def to_other_directory():
            self.away("b")
            self.put(os.path.join(self.root, "b", "planted"), b"another directory's file")

        # The swap after b was listed (as a directory), before it is opened
        # (while a is walked, or right after b's own record); and while b is
        # walked, its entries listed (b/1 and b/secret, reached by their
        # paths, would be the outside's).
        for when in ("a/x", "b", "b/1"):
            for swap in (to_link, to_other_directory):
                with self.subTest(when=when, swap=swap.__name__):
                    self.tree({"a/x": b"a's file", "b/1": b"b's first file, as long as the outside's",
                               "b/secret": b"b's own file, named as the one outside"})
                    data, err = self.walk(Tap(when, swap))
                    self.assertNotIn(b"SECRET-OUTSIDE", data)
                    self.assertNotIn(b"planted", data)
                    self.assert_refused(data, err)
                    self.assertIn("'b' was a directory when listed and", str(err))

    def test_a_file_swapped_for_a_link_is_never_read_through_it(self):
        def to_link():
            self.away("c")
            os.symlink(os.path.join(self.outside, "secret"), os.path.join(self.root, "c"))

        # Right after c's header (the bytes are the listed inode's, never
        # the link's), and after c was listed, before it is opened.
        for when in ("c", "a"):
            with self.subTest(when=when):
                self.tree({"a": b"a", "c": b"c's own bytes, as long as the secret"})
                data, err = self.walk(Tap(when, to_link))
                self.assertNotIn(b"SECRET", data)
                self.assert_refused(data, err)
        self.assertIn("'c' was a regular file when listed and a symbolic link when opened", str(err))

    def test_a_fifo_never_blocks_the_walk(self):
        def to_fifo():
            self.away("f")
            os.mkfifo(os.path.join(self.root, "f"))

        # A FIFO where a file was listed: right after f's header, and
        # between the listing and the open. No writer ever comes: an open
        # that waited would wait for ever.
        for when in ("f", "a"):
            with self.subTest(when=when):
                self.tree({"a": b"a", "f": b"a file, then a FIFO"})
                data, err = self.walk(Tap(when, to_fifo))
                self.assertNotIsInstance(err, TimeoutError)
                self.assert_refused(data, err)
        self.assertIn("'f' was a regular file when listed and a FIFO when opened", str(err))
        # A FIFO in the tree from the start: refused as before (an archive
        # has no record for it), at once.
        self.tree({"a": b"a"})
        os.mkfifo(os.path.join(self.root, "lib-fifo"))
        r = self.archive()
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertFalse(r.stdout.endswith(b"e\0\0\0\0" + b"\0" * 8))
        self.assertEqual(r.stderr, b"venv build failed: 'lib-fifo' is a FIFO: neither a file, a directory nor a link\n")

    def test_hostile_names_are_archived_as_they_are_and_escaped_in_messages(self):
        self.tree({})
        d = os.path.join(self.root, HOSTILE)
        self.put(os.path.join(d, HOSTILE + ".py"), b"the file's bytes")
        os.symlink(HOSTILE + "\n/target", os.path.join(d, "link"))
        raw = os.fsdecode(b"not-utf-8-\xff\x1b")
        self.put(os.path.join(self.root, raw), b"raw")
        r = self.archive()
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = read_archive(r.stdout)
        self.assertEqual(recs[-1], ("e", "", 0, b""))
        self.assertEqual([(k, p, d) for k, p, m, d in recs[1:-1]],
                         [("f", raw, b"raw"), ("d", HOSTILE, b""),
                          ("l", HOSTILE + "/link", (HOSTILE + "\n/target").encode()),
                          ("f", HOSTILE + "/" + HOSTILE + ".py", b"the file's bytes")])
        # A refusal that names it: one line on stderr, escaped as ascii() does.
        os.mkfifo(os.path.join(d, "fifo\n" + HOSTILE))
        r = self.archive()
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertEqual(r.stderr.count(b"\n"), 1, r.stderr)
        self.assertRegex(r.stderr, rb"^venv build failed: [ -~]+\n$")
        self.assertIn(ascii(HOSTILE + "/fifo\n" + HOSTILE).encode(), r.stderr)
        os.remove(os.path.join(d, "fifo\n" + HOSTILE))
        # The tree moving under a hostile name: the same.
        def swap():
            self.away(HOSTILE)
            os.symlink(self.outside, d)

        data, err = self.walk(Tap(raw, swap))
        self.assert_refused(data, err)
        self.assertIn(ascii(HOSTILE), str(err))

    def test_an_unchanged_tree_archives_in_the_walks_order(self):
        # Each directory's entries by name, then its subdirectories' in turn
        # (os.walk's order, top down); reserved paths left out, links as links.
        self.tree({path: path.encode() for path in ("b/y", "b/c/z", "a/x", "top", "bin/tool", "bin/python3._pth",
                                                     "pyvenv.cfg", "bin/python3.11/x")})
        os.chmod(os.path.join(self.root, "bin", "tool"), 0o755)
        os.symlink("lib", os.path.join(self.root, "lib64"))
        os.symlink("/usr/bin/python3", os.path.join(self.root, "bin", "python3"))
        os.symlink("b", os.path.join(self.root, "link"))
        r = self.archive()
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = read_archive(r.stdout)
        self.assertEqual(recs[0], ("m", "", 0, b"{}"))
        self.assertEqual([(k, p, m) for k, p, m, d in recs[1:]],
                         [("d", "a", 0o755), ("d", "b", 0o755), ("d", "bin", 0o755), ("l", "link", 0),
                          ("f", "top", 0o644), ("f", "a/x", 0o644), ("d", "b/c", 0o755), ("f", "b/y", 0o644),
                          ("f", "b/c/z", 0o644), ("f", "bin/tool", 0o755), ("e", "", 0)])

    def test_a_tree_deeper_than_an_archive_path_is_refused(self):
        # archive.h: at most 64 components (and the walk holds a descriptor
        # per level).
        self.tree({"/".join(["d"] * 63) + "/f": b"64 components"})
        r = self.archive()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_archive(r.stdout)[-2][1], "/".join(["d"] * 63) + "/f")
        self.tree({"/".join(["d"] * 64) + "/f": b"65 components"})
        r = self.archive()
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(b"deeper than an archive path may be (64 components)", r.stderr)

    def test_messages_are_printable_ascii(self):
        self.assertEqual(self.builder.printable("a\nb\x1b[2J\x07\x9b\u202e\u2028\udcff caf\u00e9 'q'"),
                         "a\\nb\\x1b[2J\\x07\\x9b\\u202e\\u2028\\udcff caf\\xe9 'q'")


if __name__ == "__main__":
    unittest.main()


class NpmBuilderTest(unittest.TestCase):
    """The builder's npm kind on the host: npm against the registry the
    builder serves from a tarball directory on 127.0.0.1 (no other
    network), the tree written as an archive with npm's resolution."""

    def setUp(self):
        from npm_tarballs import make_tarball
        if not any(os.path.isfile(p) for p in ("/usr/lib/node_modules/npm/bin/npm-cli.js",
                                               "/usr/share/nodejs/npm/bin/npm-cli.js")):
            raise AssertionError("npm is missing (scripts/lib.sh installs it)")
        self.tmp = tempfile.mkdtemp(prefix="tsb-npm-builder-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.tarballs = os.path.join(self.tmp, "tarballs")
        os.mkdir(self.tarballs)
        make_tarball(self.tarballs, "@tsb/base", "1.0.0", scripts={
            "install": "node -e \"require('fs').writeFileSync('install-ran', 'yes')\""})
        make_tarball(self.tarballs, "@tsb/base", "1.1.0-beta.1")
        make_tarball(self.tarballs, "tsb-top", "2.1.0", dependencies={"@tsb/base": "^1.0.0"})
        with open(os.path.join(self.tarballs, "not-a-tarball.tgz"), "wb") as f:
            f.write(b"\x1b]0;pwned\x07")

    def build(self, requirements, install_scripts=False):
        out = os.path.join(self.tmp, "build-%d" % len(os.listdir(self.tmp)))
        os.mkdir(out)
        req = {"kind": "npm", "requirements": requirements, "tarballs": self.tarballs, "registry": None,
               "install_scripts": install_scripts, "build": out}
        p = subprocess.run([PYTHON, "-I", "-B", BUILDER], input=json.dumps(req).encode(), capture_output=True,
                           timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": self.tmp})
        return p, out

    def test_dependencies_between_tarballs_resolve_offline_and_scripts_do_not_run(self):
        p, out = self.build(["tsb-top@^2"])
        self.assertEqual(p.returncode, 0, p.stderr)
        records = read_archive(p.stdout)
        manifest = json.loads(records[0][3])
        self.assertEqual(records[0][0], "m")
        self.assertEqual(manifest["packages"], ["@tsb/base@1.0.0", "tsb-top@2.1.0"])
        self.assertEqual(manifest["requirements"], ["tsb-top@^2"])
        paths = {r[1] for r in records}
        self.assertIn("tsb-top/index.js", paths)
        self.assertIn("@tsb/base/index.js", paths)
        self.assertNotIn("@tsb/base/install-ran", paths)
        self.assertEqual(records[-1][0], "e")
        # The file that is no tarball is named escaped, and skipped.
        self.assertIn(b"'not-a-tarball.tgz'", p.stderr)
        self.assertNotIn(b"\x1b", p.stderr)

    def test_install_scripts_run_when_asked(self):
        p, out = self.build(["tsb-top"], install_scripts=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("@tsb/base/install-ran", {r[1] for r in read_archive(p.stdout)})

    def test_a_missing_package_fails_with_npms_message_and_no_archive(self):
        p, out = self.build(["tsb-missing"])
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"E404", p.stderr)
        self.assertIn(b"tsb-missing", p.stderr)
        self.assertEqual(p.stdout, b"")
