"""Escaping of policy names and policy text (docs/SECURITY.md, "Escaping:
logs, terminals, messages"): bytes in a policy file's name or content reach
the command line's output (`toolsandbox policy check/explain/lint/
fingerprint`) and the daemon's log and errors escaped, never as a second
line or a terminal sequence; a policy whose name (its file's stem) is not a
plain word is refused. The other paths are tested where they live: build
logs and package bytes in tests/python/test_venvs.py, archive paths in
tests/unit/venv_archive_test.cc and tests/python/test_venv_builder.py, E2B
messages in tests/integration/e2b_e2e_test.cc, egress host names in
tests/unit/egress_request_test.cc and tests/egress/test_egress.py.

The policy verbs run anywhere; the daemon test needs root (it skips, loudly,
without it; under CI=true it fails).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_fixture as F  # noqa: E402

# A forged log line, OSC (retitle) and CSI (clear) sequences, BEL, CR, a
# C1 CSI (U+009B) and bytes that are not UTF-8.
HOSTILE = b"x\n2024-01-01T00:00:00.000 info audit run_id=forged\x1b]0;pwned\x07\x1b[2J\r\xc2\x9b31m\xff"
# What a terminal would take as a control: C0 but newline, DEL, ESC of
# any sequence, the C1 CSI, invalid UTF-8.
RAW = [bytes([c]) for c in range(0x20) if c != 0x0A] + [b"\x7f", b"\xc2\x9b", b"\xff"]


def command():
    return os.path.join(os.path.dirname(F.daemon_binary()), "toolsandbox")


def run(*args):
    return subprocess.run([command(), *args], capture_output=True, timeout=120)


def raw_bytes(out):
    return [r for r in RAW if r in out]


class PolicyVerbs(unittest.TestCase):
    """`toolsandbox policy ...` on hostile file names and hostile text."""

    @classmethod
    def setUpClass(cls):
        if not os.access(command(), os.X_OK):
            raise unittest.SkipTest("no toolsandbox binary at %s" % command())
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        d = os.fsencode(cls.tmp.name)
        # A valid policy whose file name is hostile (a file name may hold
        # any byte but '/' and NUL).
        cls.named = os.path.join(d, HOSTILE + b".json")
        with open(cls.named, "wb") as f:
            f.write(b'{"version": 1}\n')
        # Policies whose text is hostile: an unknown key written with JSON's
        # escapes, and the raw bytes in a key (not JSON at all).
        text = HOSTILE.decode("utf-8", "surrogateescape").replace("\udcff", "\u202e")
        cls.key = os.path.join(d, b"key.json")
        with open(cls.key, "w") as f:
            json.dump({"version": 1, text: 1}, f)
        cls.raw = os.path.join(d, b"raw.json")
        with open(cls.raw, "wb") as f:
            f.write(b'{"version": 1, "' + HOSTILE + b'": 1}\n')
        # An organizations file with a hostile name.
        cls.orgs = os.path.join(d, HOSTILE + b"-orgs.json")
        with open(cls.orgs, "w") as f:
            json.dump({"version": 1, "default": {"policy": "default", "allowed_policies": ["default"]}}, f)

    def assert_escaped(self, p, *words):
        out = p.stdout + p.stderr
        self.assertEqual(raw_bytes(out), [], out)
        self.assertNotIn(b"\n2024-01-01T00:00:00.000 info audit", out)
        for w in words:
            self.assertIn(w, out)

    def test_a_policy_named_with_hostile_bytes_is_refused_escaped(self):
        for verb in ("check", "lint", "fingerprint", "explain"):
            with self.subTest(verb=verb):
                p = run("policy", verb, self.named)
                self.assertNotEqual(p.returncode, 0, p.stdout)
                self.assert_escaped(p, b"a policy's name is its file's stem", b"\\u001B]0;pwned\\u0007\\u001B[2J\\r")

    def test_hostile_policy_text_is_shown_escaped(self):
        for verb in ("check", "lint", "explain"):
            for f, words in ((self.key, b"x\\n2024-01-01T00:00:00.000 info audit run_id=forged\\u001B]0;pwned"),
                             (self.raw, b"raw.json")):
                with self.subTest(verb=verb, file=f):
                    p = run("policy", verb, f)
                    self.assertNotEqual(p.returncode, 0, p.stdout)
                    self.assert_escaped(p, words)

    def test_an_organizations_file_named_with_hostile_bytes_is_named_escaped(self):
        for verb in ("explain", "lint", "fingerprint", "check"):
            with self.subTest(verb=verb):
                p = run("policy", verb, self.orgs)
                self.assert_escaped(p, b"\\u001B]0;pwned\\u0007")


class DaemonPolicyNames(unittest.TestCase):
    """A daemon whose policies directory holds a policy named with hostile
    bytes refuses to start, saying so escaped: the name never reaches a log
    line raw (the root spawner logs every policy's name as it loads the set,
    and escapes nothing it did not make)."""

    def test_the_daemon_refuses_a_hostile_policy_name_and_logs_it_escaped(self):
        F.require_daemon()
        with tempfile.TemporaryDirectory() as d:
            os.chmod(d, 0o755)
            pol = os.path.join(d, "policies")
            os.mkdir(pol)
            base = os.path.join(F.REPO, "policies", "default.json")
            for name in (b"default.json", HOSTILE + b".json"):
                with open(os.path.join(os.fsencode(pol), name), "w") as f:
                    json.dump({"version": 1, "include": base}, f)
            orgs = os.path.join(pol, "organizations.json")
            with open(orgs, "w") as f:
                json.dump({"version": 1, "default": {"policy": "default", "allowed_policies": ["default"]}}, f)
            daemon = F.Daemon(policies_dir=pol, organizations=orgs)
            keep = os.environ.get("TSB_TEST_KEEP")
            os.environ["TSB_TEST_KEEP"] = "1"  # the log outlives a failed start
            started = True
            try:
                try:
                    daemon.start()
                    # Loaded (it must not be): a reload has the spawner log
                    # every policy's name.
                    daemon.proc.send_signal(signal.SIGHUP)
                    time.sleep(3)
                except RuntimeError:
                    started = False
                daemon.stop()
                with open(daemon.log_path, "rb") as f:
                    log = f.read()
            finally:
                if keep is None:
                    os.environ.pop("TSB_TEST_KEEP")
                else:
                    os.environ["TSB_TEST_KEEP"] = keep
                if daemon.tmp:
                    shutil.rmtree(daemon.tmp, ignore_errors=True)
            self.assertEqual(raw_bytes(log), [], log)
            self.assertNotIn(b"\n2024-01-01T00:00:00.000 info audit", log)
            self.assertFalse(started, "a daemon loaded a policy named with control characters:\n%s" % log.decode("utf-8", "replace"))
            self.assertIn(b"a policy's name is its file's stem", log)
            self.assertIn(b"\\u001B]0;pwned\\u0007\\u001B[2J\\r", log)


if __name__ == "__main__":
    unittest.main()
