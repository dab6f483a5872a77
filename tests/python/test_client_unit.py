"""Unit tests of toolsandbox_client against a scripted fake daemon (no root,
no sandboxes): request building, response checking, error mapping,
connection handling.

    /usr/bin/python3 -m unittest tests/python/test_client_unit.py -v
"""

import asyncio
import enum
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, CLIENT_DIR)

import toolsandbox_client as T  # noqa: E402
from toolsandbox_client import protocol as P  # noqa: E402
from toolsandbox_client.__main__ import UsageError, _guess_tool_name  # noqa: E402


class FakeDaemon:
    """Accepts connections; for each request line calls handler(request, conn)
    which returns bytes to send (or None to send nothing)."""

    def __init__(self, handler):
        self.dir = tempfile.mkdtemp(prefix="tsb-fake-")
        self.path = os.path.join(self.dir, "fake.sock")
        self.handler = handler
        self.connections = 0
        self.requests = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(64)
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        with conn:
            while True:
                try:
                    chunk = conn.recv(1 << 16)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    req = json.loads(line)
                    self.requests.append(req)
                    out = self.handler(req, conn)
                    if out is None:
                        continue
                    if out == "close":
                        return
                    try:
                        conn.sendall(out)
                    except OSError:
                        return

    def stop(self):
        self.stopping = True
        self.srv.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def ok(req, key="result", payload=None, rid=None):
    if payload is None:
        payload = {"status": "success", "func_return": 1, "agent_state": None, "stdout": [], "stderr": [],
                   "sandbox_config_fingerprint": None, "record": {"end_reason": "exited"}}
    return json.dumps({"v": 1, "id": req["id"] if rid is None else rid, "ok": True, key: payload}).encode() + b"\n"


def err(req, code, message="m", rid="same"):
    return json.dumps({"v": 1, "id": req["id"] if rid == "same" else rid, "ok": False,
                       "error": {"code": code, "message": message}}).encode() + b"\n"


class Base(unittest.TestCase):
    def fake(self, handler):
        d = FakeDaemon(handler)
        self.addCleanup(d.stop)
        return d

    def run_tool(self, client, **kw):
        kw.setdefault("tool_name", "t")
        kw.setdefault("args", {})
        kw.setdefault("organization_id", "org")
        return client.run_tool("def t():\n    return 1\n", **kw)


class RequestBuilding(unittest.TestCase):
    def test_execute_fields(self):
        r = P.execute_request("print(1)", tool_name="t", organization_id="org")
        self.assertEqual(set(r), {"v", "id", "type", "tool_name", "organization_id", "script", "json_dialect"})
        self.assertEqual(r["json_dialect"], "python")  # json.loads here reads NaN and big ints back exactly
        self.assertEqual((r["v"], r["type"]), (1, "execute"))
        self.assertTrue(r["id"].startswith("py-") and len(r["id"]) <= P.MAX_ID_LENGTH)
        r2 = P.execute_request("x", tool_name="t", organization_id="o", env={"A": "1"}, timeout=5, policy="default",
                               sandbox_config={"type": "local", "config": {"x": 1}}, agent_id="a", project_id="p")
        self.assertEqual(r2["timeout"], 5.0)
        self.assertIsInstance(r2["timeout"], float)
        self.assertEqual(r2["sandbox_config"], {"type": "local", "config": {"x": 1}})
        self.assertEqual((r2["agent_id"], r2["project_id"], r2["policy"]), ("a", "p", "default"))
        self.assertNotEqual(r["id"], r2["id"])

    def test_run_tool_fields(self):
        class PipReq:
            def __init__(self, name, version=None):
                self.name, self.version = name, version

        class Model:
            def model_dump(self, mode="python"):
                return {"id": "agent-1", "mode": mode}

        r = P.run_tool_request("src", tool_name="t", args=None, organization_id="o", agent_state=Model(),
                               json_schema={"parameters": {}},
                               pip_requirements=["a", PipReq("b", "1.0"), PipReq("c"), {"name": "d", "version": "2"}])
        self.assertEqual(r["args"], {})
        self.assertEqual(r["agent_state"], {"id": "agent-1", "mode": "json"})
        self.assertEqual(r["pip_requirements"], ["a", "b==1.0", "c", "d==2"])
        r = P.run_tool_request("src", tool_name="t", args={"x": 1}, organization_id="o")
        self.assertEqual(set(r), {"v", "id", "type", "tool_name", "organization_id", "source_code", "args",
                                  "json_dialect"})

    def test_typescript_fields(self):
        class NpmReq:  # Letta's NpmRequirement
            def __init__(self, name, version=None):
                self.name, self.version = name, version

        class SourceType:  # Letta's ToolSourceType enum member
            value = "typescript"

        r = P.run_tool_request("export function t() { return 1; }", tool_name="t", args={}, organization_id="o",
                               source_type=SourceType(),
                               npm_requirements=["zod", NpmReq("left-pad", "^1.3.0"), NpmReq("@types/node"),
                                                 {"name": "a", "version": "1"}])
        self.assertEqual(r["source_type"], "typescript")
        self.assertEqual(r["npm_requirements"], ["zod", "left-pad@^1.3.0", "@types/node", "a@1"])
        self.assertTrue(P.asks_for_packages(r))
        e = P.execute_request("x", tool_name="t", organization_id="o", source_type="typescript")
        self.assertEqual(e["source_type"], "typescript")
        # Python is the default and is not sent.
        self.assertNotIn("source_type", P.execute_request("x", tool_name="t", organization_id="o", source_type="python"))
        with self.assertRaises(ValueError):
            P.execute_request("x", tool_name="t", organization_id="o", source_type="javascript")
        with self.assertRaises(TypeError):
            P.execute_request("x", tool_name="t", organization_id="o", npm_requirements="zod")

    def test_sandbox_config_forms(self):
        class SandboxType(enum.Enum):
            LOCAL = "local"

        class Cfg:  # like letta's SandboxConfig
            id = "sandbox-1"
            organization_id = "org"
            type = SandboxType.LOCAL
            config = {"sandbox_dir": "/x"}

        # The config's own organization goes along: Letta's fingerprint uses it.
        self.assertEqual(P.sandbox_config_wire(Cfg()),
                         {"type": "local", "config": {"sandbox_dir": "/x"}, "organization_id": "org"})
        self.assertEqual(P.sandbox_config_wire({"id": "s", "type": "e2b", "config": {}, "organization_id": "o"}),
                         {"type": "e2b", "config": {}, "organization_id": "o"})
        self.assertEqual(P.sandbox_config_wire({"type": "e2b", "config": {}}), {"type": "e2b", "config": {}})
        # A config whose organization is None says so: Letta's fingerprint hashes null.
        Cfg.organization_id = None
        self.assertEqual(P.sandbox_config_wire(Cfg()),
                         {"type": "local", "config": {"sandbox_dir": "/x"}, "organization_id": None})
        self.assertEqual(P.sandbox_config_wire({"type": "e2b", "config": {}, "organization_id": None}),
                         {"type": "e2b", "config": {}, "organization_id": None})
        with self.assertRaises(TypeError):
            P.sandbox_config_wire({"type": "e2b", "config": {}, "organization_id": 7})
        with self.assertRaises(TypeError):
            P.sandbox_config_wire({"config": {}})

    def test_e2b_member(self):
        r = P.run_tool_request("src", tool_name="t", args={}, organization_id="o",
                               e2b={"sandbox_config": {"id": "s", "type": "e2b", "config": {"template": "t"}},
                                    "env": {"K": "v"}})
        self.assertEqual(r["e2b"], {"sandbox_config": {"type": "e2b", "config": {"template": "t"}}, "env": {"K": "v"}})
        self.assertEqual(P.execute_request("x", tool_name="t", organization_id="o", e2b={"env": {}})["e2b"],
                         {"env": {}})
        self.assertNotIn("e2b", P.execute_request("x", tool_name="t", organization_id="o"))
        for bad in ([("env", {})], {"sandbox": {}}, {"env": {"K": 1}}, {"sandbox_config": {"config": {}}}):
            with self.assertRaises(TypeError):
                P.execute_request("x", tool_name="t", organization_id="o", e2b=bad)

    def test_local_type_checks(self):
        with self.assertRaises(TypeError) as cm:
            P.execute_request("x", tool_name="t", organization_id="o", env={"SECRET": 12345})
        self.assertNotIn("12345", str(cm.exception))
        for bad in ("5", True, [1]):
            with self.assertRaises(TypeError):
                P.execute_request("x", tool_name="t", organization_id="o", timeout=bad)
        with self.assertRaises(TypeError):
            P.execute_request("x", tool_name=None, organization_id="o")
        with self.assertRaises(TypeError):
            P.run_tool_request("x", tool_name="t", args=[1], organization_id="o")
        with self.assertRaises(ValueError):
            P.encode_request(P.run_tool_request("x", tool_name="t", args={"f": float("inf")}, organization_id="o"))
        with self.assertRaises(ValueError):
            P.status_request(request_id="x" * 129)

    def test_encoding_is_one_compact_line(self):
        line = P.encode_request(P.execute_request("a\nb é", tool_name="t", organization_id="o"))
        self.assertTrue(line.endswith(b"\n"))
        self.assertEqual(line.count(b"\n"), 1)
        self.assertIn("é".encode(), line)
        self.assertEqual(json.loads(line)["script"], "a\nb é")

    def test_describe_request_hides_secrets(self):
        req = P.run_tool_request("SOURCE", tool_name="t", args={"a": "ARGVAL"}, organization_id="o",
                                 env={"K": "ENVVAL"}, agent_state={"s": "STATEVAL"})
        text = P.describe_request(req)
        for secret in ("SOURCE", "ARGVAL", "ENVVAL", "STATEVAL"):
            self.assertNotIn(secret, text)
        self.assertIn("tool_name=t", text)


class ResponseChecking(unittest.TestCase):
    def test_ok(self):
        self.assertEqual(P.decode_response(b'{"v":1,"id":"a","ok":true,"status":{"x":1}}', "a", "status"), {"x": 1})

    def test_errors_map_to_classes(self):
        for code, cls in T.ERROR_CLASSES.items():
            line = json.dumps({"v": 1, "id": "a", "ok": False, "error": {"code": code, "message": "msg"}}).encode()
            with self.assertRaises(cls) as cm:
                P.decode_response(line, "a", "result")
            self.assertEqual((cm.exception.code, cm.exception.message, cm.exception.request_id), (code, "msg", "a"))
            self.assertIsInstance(cm.exception, T.ToolSandboxError)
        expected = {"bad_request": T.BadRequestError, "too_large": T.TooLargeError, "unauthorized": T.UnauthorizedError,
                    "busy": T.BusyError, "policy_denied": T.PolicyDeniedError, "timeout": T.ProtocolTimeoutError,
                    "unavailable": T.UnavailableError, "internal": T.InternalError}
        self.assertEqual(T.ERROR_CLASSES, expected)

    def test_unknown_code_and_null_id(self):
        line = b'{"v":1,"id":null,"ok":false,"error":{"code":"brand_new","message":"m"}}'
        with self.assertRaises(T.InternalError) as cm:  # unknown codes count as internal
            P.decode_response(line, "a", "result")
        self.assertEqual(cm.exception.code, "brand_new")

    def test_bad_responses(self):
        for line in (b"not json", b"[1]", b'{"v":2,"id":"a","ok":true,"result":{}}',
                     b'{"v":1,"id":"b","ok":true,"result":{}}', b'{"v":1,"id":null,"ok":true,"result":{}}',
                     b'{"v":1,"id":"a","ok":true}', b'{"v":1,"id":"a","result":{}}',
                     b'{"v":1,"id":"b","ok":false,"error":{"code":"busy","message":""}}',
                     b'{"v":1,"id":"a","ok":false,"error":"busy"}', b"\xff\xfe"):
            with self.assertRaises(T.ResponseError, msg=line):
                P.decode_response(line, "a", "result")

    def test_tool_result_parsing(self):
        r = T.ToolResult.from_json({"status": "error", "func_return": "x", "agent_state": {"secret": "S3"},
                                    "stdout": ["o"], "stderr": ["e"], "sandbox_config_fingerprint": "12",
                                    "record": {"end_reason": "timeout"}}, "id1")
        self.assertFalse(r.ok)
        self.assertEqual(r.end_reason, "timeout")
        self.assertNotIn("S3", repr(r))
        self.assertEqual(set(r.to_letta_dict()), {"status", "func_return", "agent_state", "stdout", "stderr",
                                                  "sandbox_config_fingerprint"})
        for bad in ({"status": "maybe"}, {"status": "success", "stdout": "text"}, {"status": "success", "agent_state": []},
                    {"status": "success", "record": []}, {"status": "success", "sandbox_config_fingerprint": 12}, []):
            with self.assertRaises(T.ResponseError):
                T.ToolResult.from_json(bad)


class SyncClientAgainstFake(Base):
    def test_round_trip_and_one_connection_per_request(self):
        d = self.fake(lambda req, c: ok(req, "status", {"version": "x"}) if req["type"] == "status" else ok(req))
        c = T.Client(d.path, timeout=5)
        self.assertEqual(c.status(), {"version": "x"})
        r = self.run_tool(c)
        self.assertEqual((r.status, r.func_return), ("success", 1))
        self.assertEqual(r.request_id, d.requests[-1]["id"])
        self.assertEqual(d.connections, 2)

    def test_mismatched_id(self):
        d = self.fake(lambda req, c: ok(req, rid="someone-else"))
        with self.assertRaises(T.ResponseError):
            self.run_tool(T.Client(d.path, timeout=5))

    def test_closed_without_answer(self):
        d = self.fake(lambda req, c: "close")
        with self.assertRaises(T.DaemonConnectionError) as cm:
            self.run_tool(T.Client(d.path, timeout=5))
        self.assertIn("without answering", cm.exception.message)

    def test_half_answer(self):
        d = self.fake(lambda req, c: ok(req)[:10])
        # The fake then keeps the connection open: the client times out.
        with self.assertRaises(T.ClientTimeoutError):
            T.Client(d.path, timeout=0.5).status()

    def test_client_timeout_waits_for_the_run(self):
        def slow(req, c):
            time.sleep(0.6)
            return ok(req)

        d = self.fake(slow)
        c = T.Client(d.path, timeout=0.2, run_timeout_margin=1.0)
        self.assertEqual(self.run_tool(c).func_return, 1)  # waits max(0.2, 0 + 1.0)
        with self.assertRaises(T.ClientTimeoutError):
            T.Client(d.path, timeout=0.2, run_timeout_margin=0.1).status()

    def test_a_run_with_requirements_waits_for_its_venv_build_too(self):
        def slow(req, c):
            time.sleep(0.6)
            return ok(req)

        d = self.fake(slow)
        quick = dict(timeout=0.2, run_timeout_margin=0.1, venv_build_allowance=1.0)
        c = T.Client(d.path, **quick)
        r = c.run_tool("def f():\n    return 1\n", tool_name="f", args={}, organization_id="o", pip_requirements=["x"])
        self.assertEqual(r.func_return, 1)  # waits max(0.2, 0 + 0.1 + 1.0)
        r = c.run_tool("def f():\n    return 1\n", tool_name="f", args={}, organization_id="o",
                       sandbox_config={"type": "local", "config": {"pip_requirements": [{"name": "x"}]}})
        self.assertEqual(r.func_return, 1)
        with self.assertRaises(T.ClientTimeoutError):
            T.Client(d.path, **quick).run_tool("def f():\n    return 1\n", tool_name="f", args={}, organization_id="o")
        self.assertTrue(P.asks_for_packages({"pip_requirements": ["x"]}))
        self.assertFalse(P.asks_for_packages({"pip_requirements": [], "sandbox_config": {"config": {"pip_requirements": []}}}))
        self.assertFalse(P.asks_for_packages({"sandbox_config": None}))

    def test_oversized_answer(self):
        d = self.fake(lambda req, c: b"x" * 5000 + b"\n")
        with self.assertRaises(T.ResponseError):
            T.Client(d.path, timeout=5, max_response_bytes=1000).status()

    def test_connect_failure(self):
        with self.assertRaises(T.DaemonConnectionError) as cm:
            T.Client("/nonexistent/dir/toolsandboxd.sock", timeout=1).status()
        self.assertIn("/nonexistent/dir/toolsandboxd.sock", cm.exception.message)

    def test_persistent_reuses_and_reconnects(self):
        d = self.fake(lambda req, c: ok(req, "status", {}) if req["type"] == "status" else err(req, "busy"))
        c = T.Client(d.path, timeout=5, persistent=True)
        self.addCleanup(c.close)
        for _ in range(3):
            c.status()
        self.assertEqual(d.connections, 1)
        with self.assertRaises(T.BusyError):
            self.run_tool(c)
        c.status()
        self.assertEqual(d.connections, 1)  # an error for the request keeps the connection
        c.close()
        c.status()
        self.assertEqual(d.connections, 2)

    def test_persistent_drops_after_connection_error(self):
        d = self.fake(lambda req, c: err(req, "timeout", rid=None) if req["type"] == "run_tool" else ok(req, "status", {}))
        c = T.Client(d.path, timeout=5, persistent=True)
        self.addCleanup(c.close)
        with self.assertRaises(T.ProtocolTimeoutError):
            self.run_tool(c)  # on a fresh connection: not retried, and the connection is dropped
        self.assertEqual(len(d.requests), 1)
        c.status()
        self.assertEqual(d.connections, 2)

    def test_persistent_idle_close_is_retried(self):
        # The fake answers each connection's second request with the idle
        # notice (null id) instead of an answer, as the daemon does when its
        # request_timeout fires as the request arrives.
        counts = {}

        def handler(req, conn):
            n = counts[id(conn)] = counts.get(id(conn), 0) + 1
            if n == 2:
                return err(req, "timeout", "no complete request line", rid=None)
            return ok(req, "status", {"n": n})

        d = self.fake(handler)
        c = T.Client(d.path, timeout=5, persistent=True)
        self.addCleanup(c.close)
        self.assertEqual(c.status(), {"n": 1})
        self.assertEqual(c.status(), {"n": 1})  # retried once, on a new connection
        self.assertEqual(d.connections, 2)

    def test_logging_is_metadata_only(self):
        d = self.fake(lambda req, c: ok(req))
        with self.assertLogs("toolsandbox_client", logging.DEBUG) as logs:
            self.run_tool(T.Client(d.path, timeout=5), env={"K": "ENV-SECRET"}, agent_state={"k": "STATE-SECRET"},
                          args={"a": "ARG-SECRET"})
        text = "\n".join(logs.output)
        for s in ("ENV-SECRET", "STATE-SECRET", "ARG-SECRET", "return 1"):
            self.assertNotIn(s, text)

    def test_threads_share_a_client(self):
        d = self.fake(lambda req, c: ok(req, payload={"status": "success", "func_return": req["args"]["i"]}))
        c = T.Client(d.path, timeout=10)
        out = [None] * 16

        def one(i):
            out[i] = self.run_tool(c, args={"i": i}).func_return

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(out, list(range(16)))


class AsyncClientAgainstFake(Base):
    def test_round_trip_and_errors(self):
        def handler(req, c):
            if req["type"] == "status":
                return ok(req, "status", {"v": "x"})
            if req["tool_name"] == "denied":
                return err(req, "policy_denied")
            if req["tool_name"] == "wrongid":
                return ok(req, rid="nope")
            return ok(req)

        d = self.fake(handler)

        async def main():
            ac = T.AsyncClient(d.path, timeout=5)
            self.assertEqual(await ac.status(), {"v": "x"})
            self.assertEqual((await ac.execute("x", tool_name="t", organization_id="o")).func_return, 1)
            with self.assertRaises(T.PolicyDeniedError):
                await ac.run_tool("s", tool_name="denied", args={}, organization_id="o")
            with self.assertRaises(T.ResponseError):
                await ac.run_tool("s", tool_name="wrongid", args={}, organization_id="o")
            with self.assertRaises(T.DaemonConnectionError):
                await T.AsyncClient(os.path.join(d.dir, "none.sock")).status()

        asyncio.run(main())

    def test_timeout_and_close(self):
        d = self.fake(lambda req, c: None if req["type"] == "status" else "close")

        async def main():
            with self.assertRaises(T.ClientTimeoutError):
                await T.AsyncClient(d.path, timeout=0.3).status()
            with self.assertRaises(T.DaemonConnectionError):
                await T.AsyncClient(d.path, timeout=5).execute("x", tool_name="t", organization_id="o")

        asyncio.run(main())

    def test_persistent(self):
        counts = {}

        def handler(req, conn):
            n = counts[id(conn)] = counts.get(id(conn), 0) + 1
            if n == 3:
                return err(req, "timeout", rid=None)
            return ok(req, "status", {"n": n})

        d = self.fake(handler)

        async def main():
            async with T.AsyncClient(d.path, timeout=5, persistent=True) as ac:
                a = await ac.status()
                b = await ac.status()
                c = await ac.status()  # idle notice: retried on a new connection
                return a, b, c

        self.assertEqual(asyncio.run(main()), ({"n": 1}, {"n": 2}, {"n": 1}))
        self.assertEqual(d.connections, 2)


class CommandLine(unittest.TestCase):
    def test_guess_tool_name(self):
        self.assertEqual(_guess_tool_name("def f():\n    pass\n", "x.py"), "f")
        self.assertEqual(_guess_tool_name("def util():\n    pass\ndef tool():\n    pass\n", "/d/tool.py"), "tool")
        self.assertEqual(_guess_tool_name("async def g():\n    pass\n", "-"), "g")
        for src in ("x = 1\n", "def a():\n    pass\ndef b():\n    pass\n", "def (:\n"):
            with self.assertRaises(UsageError):
                _guess_tool_name(src, "z.py")



class SessionFrames(unittest.TestCase):
    """The session request and frames as the client builds and reads them
    (PROTOCOL.md, section 6.8), and a server's stderr as a log shows it."""

    def test_request(self):
        r = P.session_request(["node", "s.js"], organization_id="o", env={"A": "1"}, agent_id="a")
        self.assertEqual((r["type"], r["command"], r["env"], r["agent_id"]), ("session", ["node", "s.js"], {"A": "1"}, "a"))
        for bad in ([], [""], ["node", 3], "node"):
            with self.assertRaises((ValueError, TypeError)):
                P.session_request(bad, organization_id="o")
        self.assertNotIn("workspace", r)
        w = P.session_request(["node"], organization_id="o", workspace="agent-1.x_y:z")
        self.assertEqual(w["workspace"], "agent-1.x_y:z")
        for bad in ("", "a b", "../x", "a" * 129, 3):
            with self.assertRaises(ValueError):
                P.session_request(["node"], organization_id="o", workspace=bad)

    def test_frames_are_taken_whole(self):
        buf = bytearray(b"o\x00\x00\x00\x02hie\x00\x00")
        self.assertEqual(P.take_session_frame(buf), ("stdout", b"hi"))
        self.assertIsNone(P.take_session_frame(buf))
        buf += b"\x00\x01!"
        self.assertEqual(P.take_session_frame(buf), ("stderr", b"!"))
        self.assertEqual(buf, bytearray())
        with self.assertRaises(T.ResponseError):
            P.take_session_frame(bytearray(b"q\x00\x00\x00\x00"))
        with self.assertRaises(T.ResponseError):
            P.take_session_frame(bytearray(b"o\x00\x01\x00\x01"))

    def test_a_session_against_a_fake_daemon(self):
        answer = {"v": 1, "ok": True, "session": {"session_id": "s1", "command": ["/usr/bin/node"], "policy": "p",
                                                   "policy_fingerprint": "sha256:x"}}

        def handler(req, conn):
            answer["id"] = req["id"]
            return (json.dumps(answer) + "\n").encode() + b"o\x00\x00\x00\x03out" + b"x\x00\x00\x00\x14" + \
                json.dumps({"ended_by": "exit"}).encode()[:20].ljust(20)
        d = FakeDaemon(handler)
        try:
            s = T.Client(d.path, timeout=5).open_session(["node"], organization_id="o")
            self.assertEqual((s.session_id, s.command), ("s1", ["/usr/bin/node"]))
            self.assertEqual(s.read(5), ("stdout", b"out"))
            self.assertIsNone(s.read(5))
            self.assertEqual(s.record, {"ended_by": "exit"})
            s.close()
        finally:
            d.stop()

    def test_stderr_for_a_log_is_escaped(self):
        from toolsandbox_client.mcp_stdio import escaped_for_log
        self.assertEqual(escaped_for_log(b"ok\tline\n"), "ok\tline\n")
        self.assertEqual(escaped_for_log(b"\x1b[31mred\r\x07"), "\\x1b[31mred\\x0d\\x07")
        self.assertEqual(escaped_for_log("\u202eevil\u00e9".encode()), "\\u202eevil\u00e9")
        self.assertEqual(escaped_for_log(b"\xff"), "\ufffd")


if __name__ == "__main__":
    unittest.main()
