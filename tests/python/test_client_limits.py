"""The client against a daemon that says no: busy beyond its limits, peers
that are not allowed. Needs root (see daemon_fixture.py).

    /usr/bin/python3 -m unittest tests/python/test_client_limits.py -v
"""

import asyncio
import grp
import json
import os
import subprocess
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402
from toolsandbox_client import AsyncClient, BusyError, ToolSandboxError, UnauthorizedError  # noqa: E402

ORG = "org-client-tests"
ADD_TOOL = "def add(a: int, b: int) -> int:\n    return a + b\n"


class Busy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = F.start_daemon(cls, max_concurrent_runs=1, max_queued_runs=0)

    def test_busy_beyond_the_limit(self):
        client = self.daemon.client()
        before = self.daemon.status()
        hold = self.daemon.raw()
        try:
            hold.send(F.sleep_request(50, "holder"))
            self.daemon.wait_for(lambda s: s["runs_in_flight"] == 1, 15, "the holding run to start")
            with self.assertRaises(BusyError) as cm:
                client.run_tool(ADD_TOOL, tool_name="add", args={"a": 1, "b": 2}, organization_id=ORG)
            self.assertEqual(cm.exception.code, "busy")
            self.assertIsInstance(cm.exception, ToolSandboxError)
            self.assertTrue(cm.exception.message)
            with self.assertRaises(BusyError):
                client.execute("print(1)\n", tool_name="t", organization_id=ORG)

            async def async_attempt():
                await AsyncClient(self.daemon.socket_path).run_tool(ADD_TOOL, tool_name="add", args={"a": 1, "b": 2},
                                                                    organization_id=ORG)

            with self.assertRaises(BusyError):
                asyncio.run(async_attempt())
            # status takes no run slot.
            st = client.status()
            self.assertEqual(st["runs_in_flight"], 1)
            self.assertEqual(st["rejected_busy"], before["rejected_busy"] + 3)
        finally:
            hold.close()  # kills the holding run
        self.daemon.wait_for(lambda s: s["runs_in_flight"] == 0, 5, "the holding run to be killed")
        r = client.run_tool(ADD_TOOL, tool_name="add", args={"a": 1, "b": 2}, organization_id=ORG)
        self.assertEqual(r.func_return, 3)


class UnauthorizedRoot(unittest.TestCase):
    """allowed_uids without 0: this (root) process is refused."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = F.start_daemon(cls, allowed_uids=[12345])

    def test_refused(self):
        client = F.Client(self.daemon.socket_path, timeout=30)
        with self.assertRaises(UnauthorizedError) as cm:
            client.status()
        self.assertEqual(cm.exception.code, "unauthorized")
        self.assertIn("uid 0", cm.exception.message)
        with self.assertRaises(UnauthorizedError):
            client.run_tool(ADD_TOOL, tool_name="add", args={"a": 1, "b": 2}, organization_id=ORG)
        with self.assertRaises(UnauthorizedError):
            # A large request: the daemon refuses before reading it.
            client.execute("#" * (4 << 20) + "\n", tool_name="t", organization_id=ORG)
        with self.assertRaises(UnauthorizedError):
            F.Client(self.daemon.socket_path, persistent=True).status()

        async def main():
            await AsyncClient(self.daemon.socket_path).status()

        with self.assertRaises(UnauthorizedError):
            asyncio.run(main())
        self.assertIn("refused peer uid=0", self.daemon.log())


# Runs as nobody: prints the status, or the error code.
CHILD = textwrap.dedent("""
    import json, sys
    from toolsandbox_client import Client, ToolSandboxError
    try:
        st = Client(sys.argv[1], timeout=30).status()
        print(json.dumps({"ok": True, "uid": __import__("os").getuid(), "runs_in_flight": st["runs_in_flight"]}))
    except ToolSandboxError as e:
        print(json.dumps({"ok": False, "code": e.code, "message": e.message}))
""")


def _others_can_run(path):
    """Whether a uid with no special rights can execute `path`."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & 0o001:
            return False
        d = os.path.dirname(path)
        while True:
            if not os.stat(d).st_mode & 0o001:
                return False
            if d == "/":
                return True
            d = os.path.dirname(d)
    except OSError:
        return False


def _python_for_nobody():
    for cand in (sys.executable, "/usr/bin/python3"):
        if cand and _others_can_run(cand):
            return cand
    return None


def _nogroup():
    try:
        return grp.getgrgid(65534).gr_name
    except KeyError:
        return None


@unittest.skipUnless(_nogroup(), "no group with gid 65534 on this host")
class OtherUidPeer(unittest.TestCase):
    """A real peer of another uid (nobody), which can reach the socket through
    its group (socket mode 0660, group nogroup)."""

    def as_nobody(self, daemon):
        python = _python_for_nobody()
        if python is None:
            self.skipTest("no Python interpreter that uid 65534 may execute")
        p = subprocess.run([python, "-c", CHILD, daemon.socket_path], user=65534, group=65534, extra_groups=[],
                           env={"PYTHONPATH": F.CLIENT_DIR, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                           timeout=60, cwd="/")
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def daemon(self, **overrides):
        F.require_daemon()
        d = F.Daemon(socket={"group": _nogroup(), "mode": "0660"}, **overrides)
        self.addCleanup(d.stop)
        return d.start()

    def test_refused_uid(self):
        out = self.as_nobody(self.daemon())  # allowed_uids defaults to [0]
        self.assertEqual(out["ok"], False, out)
        self.assertEqual(out["code"], "unauthorized")
        self.assertIn("uid 65534", out["message"])

    def test_allowed_by_group(self):
        out = self.as_nobody(self.daemon(allowed_groups=[_nogroup()]))
        self.assertEqual(out, {"ok": True, "uid": 65534, "runs_in_flight": 0})


if __name__ == "__main__":
    unittest.main()
