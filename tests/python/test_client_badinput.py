"""Bad input on a raw socket: every case gets the right error code, and the
daemon keeps serving normal requests afterwards. Needs root (see
daemon_fixture.py).

    /usr/bin/python3 -m unittest tests/python/test_client_badinput.py -v
"""

import asyncio
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402
from toolsandbox_client import AsyncClient, BadRequestError, TooLargeError  # noqa: E402

ORG = "org-client-tests"
ADD_TOOL = "def add(a: int, b: int) -> int:\n    return a + b\n"


def run_tool(**over):
    req = {"v": 1, "id": "r1", "type": "run_tool", "tool_name": "add", "organization_id": ORG,
           "source_code": ADD_TOOL, "args": {"a": 1, "b": 2}}
    req.update(over)
    return req


def execute(**over):
    req = {"v": 1, "id": "e1", "type": "execute", "tool_name": "t", "organization_id": ORG, "script": "print(1)"}
    req.update(over)
    return req


class BadInput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = F.start_daemon(cls, max_frame_bytes="64KiB", request_timeout="1s")

    def tearDown(self):
        self.assert_serving()

    def assert_serving(self):
        """A normal status and a normal run, on fresh connections."""
        client = self.daemon.client()
        self.assertFalse(client.status()["shutting_down"])
        r = client.run_tool(ADD_TOOL, tool_name="add", args={"a": 2, "b": 3}, organization_id=ORG)
        self.assertEqual((r.status, r.func_return), ("success", 5))

    def assert_error(self, answer, code, request_id=None, message_part=None):
        self.assertIsNotNone(answer, "no answer (connection closed)")
        self.assertEqual(answer.get("v"), 1, answer)
        self.assertIs(answer.get("ok"), False, answer)
        self.assertEqual(answer["error"]["code"], code, answer)
        self.assertIsInstance(answer["error"]["message"], str)
        self.assertEqual(answer.get("id"), request_id, answer)
        if message_part:
            self.assertIn(message_part, answer["error"]["message"])

    def assert_status_ok(self, raw, request_id="after"):
        answer = raw.request({"v": 1, "id": request_id, "type": "status"})
        self.assertIsNotNone(answer)
        self.assertIs(answer["ok"], True, answer)
        self.assertEqual(answer["id"], request_id)

    # --- malformed lines: an error, and the connection goes on -----------------------

    def test_invalid_json(self):
        with self.daemon.raw() as raw:
            for bad in (b'{"v":1,"id":"x",\n', b"not json at all\n", b"\n", b"[1, 2, 3]\n", b'"just a string"\n',
                        b"{}\n"):
                answer = raw.request(bad)
                self.assertEqual(answer["error"]["code"], "bad_request", (bad, answer))
            self.assert_status_ok(raw)

    def test_binary_garbage(self):
        garbage = bytes(b for b in range(256) if b != 0x0A) * 4
        with self.daemon.raw() as raw:
            self.assert_error(raw.request(garbage + b"\n"), "bad_request")
            self.assert_error(raw.request(b'{"v":1,"id":"\xff\xfe","type":"status"}\n'), "bad_request")
            self.assert_status_ok(raw)

    def test_wrong_types(self):
        cases = [
            (run_tool(tool_name=5), "tool_name"),
            (run_tool(organization_id=["org"]), "organization_id"),
            (run_tool(args=[1, 2]), "args"),
            (run_tool(json_schema="schema"), "json_schema"),
            (run_tool(agent_state=[]), "agent_state"),
            (run_tool(pip_requirements=[1]), "pip_requirements"),
            (run_tool(pip_requirements="requests"), "pip_requirements"),
            (run_tool(source_code=None), "source_code"),
            (execute(env={"A": 1}), "env"),
            (execute(env=["A=1"]), "env"),
            (execute(timeout="5"), "timeout"),
            (execute(timeout=-1), "timeout"),
            (execute(timeout=True), "timeout"),
            (execute(script=42), "script"),
            (execute(policy=1), "policy"),
            (execute(sandbox_config={"type": "local"}), "config"),
            (execute(sandbox_config={"type": "local", "config": {}, "id": "x"}), "id"),
            (execute(agent_id=7), "agent_id"),
            (execute(tool_name="has space"), "tool_name"),
        ]
        with self.daemon.raw() as raw:
            for req, field in cases:
                answer = raw.request(req)
                self.assert_error(answer, "bad_request", req["id"])
                self.assertIn(field, answer["error"]["message"], (req, answer))
            # The envelope itself.
            for req in ({"v": "1", "id": "v1", "type": "status"}, {"v": 2, "id": "v2", "type": "status"},
                        {"id": "v3", "type": "status"}, {"v": 1, "id": "v4"}, {"v": 1, "id": 5, "type": "status"},
                        {"v": 1, "id": "x" * 129, "type": "status"}, {"v": 1.5, "id": "v6", "type": "status"}):
                answer = raw.request(req)
                self.assertEqual(answer["error"]["code"], "bad_request", (req, answer))
            self.assert_status_ok(raw)

    def test_unknown_type_and_field(self):
        with self.daemon.raw() as raw:
            self.assert_error(raw.request({"v": 1, "id": "u1", "type": "frobnicate"}), "bad_request", "u1",
                              "unknown request type")
            self.assert_error(raw.request({"v": 1, "id": "u2", "type": "status", "extra": 1}), "bad_request", "u2",
                              "unknown field")
            self.assert_error(raw.request(run_tool(id="u3", script="x")), "bad_request", "u3", "unknown field")
            self.assert_error(raw.request(b'{"v":1,"id":"u4","type":"status","v":1}\n'), "bad_request", None,
                              "duplicate")
            self.assert_status_ok(raw)

    def test_policy_denied_and_unknown_org_policy(self):
        with self.daemon.raw() as raw:
            self.assert_error(raw.request(run_tool(id="p1", policy="privileged")), "policy_denied", "p1")
            self.assert_status_ok(raw)

    # --- oversized frames: too_large, then the connection is closed ---------------------

    def test_oversized_frame(self):
        big = run_tool(id="big", source_code="# " + "x" * (100 << 10) + "\n" + ADD_TOOL)
        with self.daemon.raw() as raw:
            try:
                raw.send(big)
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.assert_error(raw.readline(), "too_large", None, "64")
            self.assertIsNone(raw.readline())  # closed

    def test_oversized_without_newline(self):
        with self.daemon.raw() as raw:
            try:
                raw.send(b"{" + b" " * (200 << 10))
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.assert_error(raw.readline(), "too_large")
            self.assertIsNone(raw.readline())

    def test_frame_just_under_the_limit(self):
        req = run_tool(id="fits")
        room = (64 << 10) - len(json.dumps(req)) - 100
        req["source_code"] = "# " + "y" * room + "\n" + ADD_TOOL
        with self.daemon.raw() as raw:
            answer = raw.request(req)
            self.assertIs(answer["ok"], True, answer)
            self.assertEqual(answer["result"]["func_return"], 3)

    def test_too_large_through_the_clients(self):
        script = "# " + "z" * (100 << 10) + "\nprint(1)\n"
        with self.assertRaises(TooLargeError) as cm:
            self.daemon.client().execute(script, tool_name="t", organization_id=ORG)
        self.assertEqual(cm.exception.code, "too_large")

        async def main():
            await AsyncClient(self.daemon.socket_path).execute(script, tool_name="t", organization_id=ORG)

        with self.assertRaises(TooLargeError):
            asyncio.run(main())
        # The local cap refuses before sending anything.
        with self.assertRaises(TooLargeError):
            self.daemon.client(max_request_bytes=1024).execute(script, tool_name="t", organization_id=ORG)

    # --- truncated lines -----------------------------------------------------------------

    def test_truncated_line_then_half_close(self):
        with self.daemon.raw() as raw:
            raw.send(b'{"v":1,"id":"t1","type":"sta')
            raw.shutdown_write()
            self.assert_error(raw.readline(), "bad_request", None, "middle of a request")
            self.assertIsNone(raw.readline())

    def test_truncated_line_then_close(self):
        for _ in range(5):
            raw = self.daemon.raw()
            raw.send(b'{"v":1,"id":"t2","type":"run_tool","source_code":"def f(')
            raw.close()
        time.sleep(0.2)

    def test_complete_request_then_half_close(self):
        # A full line followed by EOF is a normal last request.
        with self.daemon.raw() as raw:
            raw.send({"v": 1, "id": "last", "type": "status"})
            raw.shutdown_write()
            answer = raw.readline()
            self.assertIs(answer["ok"], True, answer)
            self.assertIsNone(raw.readline())

    def test_crlf_line(self):
        with self.daemon.raw() as raw:
            raw.send(b'{"v":1,"id":"crlf","type":"status"}\r\n')
            self.assertIs(raw.readline()["ok"], True)

    # --- silence: request_timeout ---------------------------------------------------------

    def test_connection_that_sends_nothing(self):
        with self.daemon.raw() as raw:
            t0 = time.monotonic()
            answer = raw.readline(timeout=15)
            elapsed = time.monotonic() - t0
            self.assert_error(answer, "timeout", None)
            self.assertGreaterEqual(elapsed, 0.8)
            self.assertLess(elapsed, 10)
            self.assertIsNone(raw.readline())

    def test_connection_that_stalls_mid_line(self):
        with self.daemon.raw() as raw:
            raw.send(b'{"v":1,"id":"slow",')
            self.assert_error(raw.readline(timeout=15), "timeout", None)
            self.assertIsNone(raw.readline())

    def test_persistent_client_survives_idle_timeout(self):
        # The daemon closes idle connections after request_timeout (1s here):
        # a persistent client notices and reconnects.
        for persistent_async in (False, True):
            if persistent_async:
                async def main():
                    async with AsyncClient(self.daemon.socket_path, persistent=True) as ac:
                        await ac.status()
                        await asyncio.sleep(1.5)
                        r = await ac.run_tool(ADD_TOOL, tool_name="add", args={"a": 1, "b": 1}, organization_id=ORG)
                        await ac.status()
                        return r

                self.assertEqual(asyncio.run(main()).func_return, 2)
            else:
                with self.daemon.client(persistent=True) as c:
                    c.status()
                    time.sleep(1.5)
                    self.assertEqual(c.run_tool(ADD_TOOL, tool_name="add", args={"a": 1, "b": 1},
                                                organization_id=ORG).func_return, 2)
                    c.status()

    def test_many_bad_connections_at_once(self):
        conns = []
        try:
            for i in range(50):
                raw = self.daemon.raw()
                raw.send(b"\x00\x01garbage %d\n" % i if i % 2 else b'{"v":1,"id":"half')
                conns.append(raw)
            for i, raw in enumerate(conns):
                if i % 2:
                    self.assertEqual(raw.readline()["error"]["code"], "bad_request")
        finally:
            for raw in conns:
                raw.close()

    def test_bad_request_error_class(self):
        with self.assertRaises(BadRequestError):
            self.daemon.client().run_tool(ADD_TOOL, tool_name="1bad", args={}, organization_id=ORG)


if __name__ == "__main__":
    unittest.main()
