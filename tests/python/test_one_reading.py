"""One reading of the configuration and policies (docs/ARCHITECTURE.md,
"Privilege separation").

    /usr/bin/python3 -m unittest tests/python/test_one_reading.py -v

The compile helper (uid 0, no capability) reads the configuration and the
policy files; the front end loads the record of what it read and opens none
of them, at its start and at a reload. The front end here runs under
strace (a wrapper in place of toolsandboxd-frontend, beside a copy of
toolsandboxd, which looks for its front end next to itself): every file
system call it makes is in its trace, and the compile helper's traces, which
must name the files, show that the trace sees them.

A reload that changes a policy is then seen the same by both halves: the
front end places a run under the new policy's fingerprint and the spawner,
which checks it against its own copy, runs it with the new rules.

Needs root and strace (see daemon_fixture.py): skipped otherwise, failed
under CI=true.
"""

import glob
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402

HOSTNAME_SCRIPT = "import socket\nprint(socket.gethostname())\n"


def traces(prefix):
    """{pid: text} of strace -ff's files."""
    out = {}
    for path in glob.glob(prefix + ".*"):
        with open(path, errors="replace") as f:
            out[int(path.rsplit(".", 1)[1])] = f.read()
    return out


def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(x) for x in f.read().split()]


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def role(text):
    """'front end', 'compile helper' or None, from the trace's execve line."""
    for line in text.splitlines():
        if line.startswith("execve(") and "toolsandboxd-frontend" in line:
            if '"--serve"' in line:
                return "front end"
            if '"--compile"' in line:
                return "compile helper"
    return None


def touched(text, paths):
    """The lines of a trace, other than execve, that name one of `paths`."""
    return [line for line in text.splitlines()
            if not line.startswith("execve(") and any(p in line for p in paths)]


class OneReading(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        F.require_daemon()
        if not shutil.which("strace"):
            reason = "strace is not installed (scripts/lib.sh installs it)"
            if F.must_run():
                raise AssertionError(reason)
            raise unittest.SkipTest(reason)
        cls.tmp = tempfile.mkdtemp(prefix="tsb-one-reading-")
        os.chmod(cls.tmp, 0o755)
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        build_bin = os.path.dirname(os.path.abspath(F.daemon_binary()))
        # The daemon's copy, and its front end: strace around the real one.
        cls.bin = os.path.join(cls.tmp, "bin")
        os.mkdir(cls.bin, 0o755)
        shutil.copy2(F.daemon_binary(), os.path.join(cls.bin, "toolsandboxd"))
        cls.trace_dir = os.path.join(cls.tmp, "trace")
        os.mkdir(cls.trace_dir)
        # Written by the front end's user and by uid 0 without capabilities.
        os.chmod(cls.trace_dir, 0o1777)
        cls.prefix = os.path.join(cls.trace_dir, "t")
        wrapper = os.path.join(cls.bin, "toolsandboxd-frontend")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec /usr/bin/strace -f -qq -e trace=%%file -o %s -ff -- %s \"$@\"\n"
                    % (cls.prefix, os.path.join(build_bin, "toolsandboxd-frontend")))
        os.chmod(wrapper, 0o755)
        # The policies, in a directory of the test's.
        cls.policies = os.path.join(cls.tmp, "policies")
        shutil.copytree(os.path.join(F.REPO, "policies"), cls.policies,
                        ignore=shutil.ignore_patterns("README.md", "schema"))
        for root, dirs, files in os.walk(cls.policies):
            for n in dirs + files:
                os.chmod(os.path.join(root, n), 0o755 if n in dirs else 0o644)
        cls.orgs = os.path.join(cls.policies, "organizations.json")
        cls.daemon = F.Daemon(binary=os.path.join(cls.bin, "toolsandboxd"), policies_dir=cls.policies,
                              organizations=cls.orgs,
                              engine={"init": os.path.join(build_bin, "toolsandbox-init")})
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start(ready_timeout=60)

    def run_hostname(self):
        r = self.daemon.client().execute(HOSTNAME_SCRIPT, tool_name="hostname", organization_id="org-one-reading")
        self.assertEqual(r.status, "success", r)
        return r

    def test_the_front_end_opens_no_configuration_or_policy_file(self):
        d = self.daemon
        r = self.run_hostname()
        self.assertEqual(r.stdout, ["sandbox\n"])
        fp = d.status()["policies"]["default"]
        self.assertEqual(r.record["policy_fingerprint"], fp)

        # A reload that changes a policy: the hostname its sandboxes get.
        path = os.path.join(self.policies, "default.json")
        with open(path) as f:
            text = f.read()
        self.assertIn('"hostname": "sandbox"', text)
        with open(path + ".new", "w") as f:
            f.write(text.replace('"hostname": "sandbox"', '"hostname": "reloaded"'))
        os.chmod(path + ".new", 0o644)
        os.rename(path + ".new", path)
        spawner = d.proc.pid
        os.kill(spawner, signal.SIGHUP)
        st = d.wait_for(lambda s: s["policies"]["default"] != fp, 60, "the reload")
        r2 = self.run_hostname()
        # Placed by the front end under the new fingerprint, run by the
        # spawner with the new rules: both halves hold the same set.
        self.assertEqual(r2.stdout, ["reloaded\n"])
        self.assertEqual(r2.record["policy_fingerprint"], st["policies"]["default"])
        self.assertIn("reloaded configuration", d.log())

        # A front end that dies is started again, with the record in force:
        # the reloaded one, still read by no one but the helper.
        front = [pid for pid in children(spawner) if b"--serve" in cmdline(pid)]
        self.assertEqual(len(front), 1)
        real = [pid for pid in children(front[0]) if b"--serve" in cmdline(pid)]  # strace's tracee
        self.assertEqual(len(real), 1)
        os.kill(real[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            again = [pid for pid in children(spawner) if b"--serve" in cmdline(pid) and pid != front[0]]
            if again:
                break
            time.sleep(0.05)
        self.assertTrue(again, "no new front end:\n" + d.log())
        st2 = d.wait_for(lambda s: True, 60, "the new front end")
        self.assertEqual(st2["policies"]["default"], st["policies"]["default"])
        self.assertEqual(self.run_hostname().stdout, ["reloaded\n"])

        names = [os.path.join(d.tmp, "toolsandboxd.json"), self.policies]
        # A file opened by a name relative to a directory descriptor shows
        # only its own name.
        names += ["toolsandboxd.json", "default.json", "privileged.json", "organizations.json"]
        d.stop()
        t = traces(self.prefix)
        roles = {pid: role(text) for pid, text in t.items()}
        fronts = [pid for pid, r in roles.items() if r == "front end"]
        helpers = [pid for pid, r in roles.items() if r == "compile helper"]
        self.assertEqual(len(fronts), 2, "the first and the restarted one: %s" % roles)
        self.assertEqual(len(helpers), 2, "the start's and the reload's: %s" % roles)
        # The helpers read them: the trace would show the front end's reads.
        for pid in helpers:
            self.assertTrue(touched(t[pid], names[:2]), "the compile helper's trace names no file:\n" + t[pid][:4000])
        # The front end: nothing of them (nor its threads, whose traces
        # have no execve of their own).
        for pid in set(t) - set(helpers):
            self.assertEqual(touched(t[pid], names), [], "pid %d (%s) named a configuration or policy file"
                             % (pid, roles[pid] or "a thread"))


if __name__ == "__main__":
    unittest.main()
