#!/usr/bin/python3
"""A fake E2B service for offline tests of toolsandboxd's E2B backend.

Standard library only. Listens on 127.0.0.1 and nowhere else. One listener
serves every plane, as the e2b and e2b-code-interpreter Python SDKs call them
(references: E2B's OpenAPI spec, spec/openapi.yml in e2b-dev/infra; envd's
spec/envd/process/process.proto in e2b-dev/E2B; the code interpreter's server,
template/server/ in e2b-dev/code-interpreter):

Control plane (requires the X-API-KEY header to equal the configured key):
    POST   /sandboxes                    -> 201 Sandbox
    GET    /v2/sandboxes?metadata=&state=&limit=&nextToken=
                                         -> 200 [ListedSandbox], cursor in x-next-token
    GET    /sandboxes?metadata=          -> 200 [ListedSandbox] (v1, running only)
    GET    /sandboxes/{id}               -> 200 SandboxDetail | 404
    POST   /sandboxes/{id}/timeout       -> 204 | 404
    POST   /sandboxes/{id}/connect       -> 200 Sandbox | 404
    DELETE /sandboxes/{id}               -> 204 | 404

Data plane (requires X-Access-Token to equal the sandbox's envdAccessToken),
routed by any of:
    - a path prefix /sbx/{id}/{port}/...   (sandbox_url "http://127.0.0.1:P/sbx/{id}/{port}")
    - the Host header {port}-{id}.{domain}
    - the E2b-Sandbox-Id and E2b-Sandbox-Port headers
  port 49999 (code interpreter):
    POST   /execute                      -> NDJSON stream (as template/server/ streams it)
    POST   /contexts, DELETE /contexts/{id}, GET /health
  port 49983 (envd):
    POST   /process.Process/Start        -> Connect envelopes (process.proto Start); runs nothing:
                                            a pip install of an allowed name
                                            succeeds, anything else fails;
                                            `npm install -- SPEC` of an allowed
                                            name drops a small package into
                                            the sandbox's node_modules (no
                                            registry is ever reached), others
                                            fail with npm's 404 text
    GET    /health                       -> 204

Cells run as a plain /usr/bin/python3 subprocess per cell, in a per-sandbox
working directory, with a clean environment (the fake's own is never passed
on) plus what earlier cells of the same context put into os.environ. The main
result is the value of the cell's last expression, if it is one, as repr()
with one pair of quotes stripped, as the real server does.

A context created with language "typescript" (or "ts", "javascript", "js")
is a persistent Node process instead (tests/fakes/e2b_ts_kernel.js, which
says how it follows E2B's TypeScript kernel): one global scope for all its
cells, top-level await, the last value as util.inspect() text (one pair of
quotes stripped by the server, as for Python), console output as stream
chunks, errors as name, value and traceback. It needs Debian's
node-typescript (scripts/lib.sh installs it).

Test control (no key needed):
    POST /_control/faults    body: a fault or a list of faults (appended)
    POST /_control/reset     forget sandboxes, requests, faults, pip calls
    GET  /_control/requests  every request: method, path, headers, body, plane
    GET  /_control/sandboxes every sandbox ever created, with its state
    GET  /_control/pip       argv of every process Start call
    POST /_control/expire/{id}  the sandbox disappears (as at its TTL)

A fault: {"op": OP, "kind": KIND, "status": N, "times": N (default 1; -1 = always)}
    OP:   create, list, get, timeout, kill, execute, process, contexts
    KIND: "status"            answer with HTTP `status` and an E2B error body
          "midstream_502"     (execute) start the stream, then send an edge
                              proxy's 502 page and drop the connection
          "truncate"          (execute) end the body cleanly without
                              end_of_execution
          "stall"             (execute, process) start the stream, then send
                              nothing until the client goes away
          "display_first"     (execute) a display_data result carrying a decoy
                              payload before the real output
          "deadline_exceeded" (process) end the stream with that Connect error
          "stderr"            (process) the command writes the bytes of
                              `stderr_b64` (base64) on its stderr and fails
    "message": the error body's message (KIND "status")
"""

import argparse
import base64
import codecs
import datetime
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LISTEN_ADDRESS = "127.0.0.1"  # never anything else
INTERPRETER_PORT = 49999
ENVD_PORT = 49983

DRIVER = r'''
import ast, asyncio, json, os, sys, traceback
cell_path, result_path, env_path = sys.argv[1:4]
with open(cell_path, encoding="utf-8") as f:
    src = f.read()
out = {"result": None, "error": None}
ns = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    tree = ast.parse(src, "<cell>")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    r = eval(compile(tree, "<cell>", "exec", flags=flags), ns)
    if asyncio.iscoroutine(r):
        asyncio.run(r)
    if last is not None:
        v = eval(compile(last, "<cell>", "eval", flags=flags), ns)
        if asyncio.iscoroutine(v):
            v = asyncio.run(v)
        if v is not None:
            out["result"] = repr(v)
except BaseException as e:
    out["error"] = {
        "name": type(e).__name__,
        "value": str(e),
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
    }
finally:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    with open(result_path, "w") as f:
        json.dump(out, f)
    with open(env_path, "w") as f:
        json.dump(dict(os.environ), f)
'''


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def strip_quotes(text):
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def envelope(flags, obj):
    data = json.dumps(obj).encode("utf-8")
    return bytes([flags]) + len(data).to_bytes(4, "big") + data


class State:
    def __init__(self, api_key, domain, pip_allow, page_size, workdir, npm_allow=()):
        self.lock = threading.Lock()
        self.api_key = api_key
        self.domain = domain
        self.pip_allow = set(pip_allow)
        self.npm_allow = set(npm_allow)
        self.kernels = {}  # (sandbox id, context id) -> TsKernel
        self.page_size = page_size
        self.workdir = workdir
        self.reset()

    def reset(self):
        self.sandboxes = {}
        self.requests = []
        self.faults = []
        self.pip_calls = []
        self.procs = {}  # sandbox id -> set of Popen
        self.execution_count = 0
        for k in getattr(self, "kernels", {}).values():
            k.kill()
        self.kernels = {}

    def take_fault(self, op):
        with self.lock:
            for f in self.faults:
                if f.get("op") != op:
                    continue
                times = f.get("times", 1)
                if times == 0:
                    continue
                if times > 0:
                    f["times"] = times - 1
                return dict(f)
        return None

    def alive(self, sid):
        sb = self.sandboxes.get(sid)
        if not sb or sb["killed"]:
            return None
        if time.time() >= sb["end_at"]:
            sb["killed"] = True
            sb["ended_by"] = "ttl"
            return None
        return sb


STATE = None
TS_KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2b_ts_kernel.js")
TS_LANGUAGES = {"ts": "typescript", "typescript": "typescript", "js": "javascript", "javascript": "javascript"}


class TsKernel:
    """One TypeScript context: a Node process (e2b_ts_kernel.js) fed one cell
    at a time; its messages arrive as JSON lines on a pipe of their own."""

    def __init__(self, sdir):
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            ["/usr/bin/node", TS_KERNEL], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(w,), cwd=sdir, start_new_session=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sdir, "LANG": "C.UTF-8", "TSB_KERNEL_FD": str(w)})
        os.close(w)
        self.fd = r
        self.buf = b""
        self.lock = threading.Lock()  # one cell at a time

    def send(self, code):
        self.proc.stdin.write((json.dumps({"code": code}) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def message(self, timeout):
        """The next message, None when none came within `timeout`, or an
        error message when the kernel died."""
        while b"\n" not in self.buf:
            r, _, _ = select.select([self.fd], [], [], timeout)
            if not r:
                return None
            data = os.read(self.fd, 65536)
            if not data:
                return {"type": "error", "name": "UnexpectedEndOfExecution", "value": "the kernel died",
                        "traceback": ""}
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "e2b-fake/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    # -- helpers ------------------------------------------------------------

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def record(self, plane, body):
        with STATE.lock:
            STATE.requests.append({
                "method": self.command,
                "path": self.path,
                "headers": {k: v for k, v in self.headers.items()},
                "body": body.decode("utf-8", "replace"),
                "plane": plane,
                "time": time.time(),
            })

    def send_json(self, status, obj, headers=None):
        data = b"" if obj is None else json.dumps(obj).encode("utf-8")
        self.send_response(status)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def send_error_body(self, status, message):
        self.send_json(status, {"code": status, "message": message})

    def start_chunked(self, content_type):
        self.send_response(200)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def chunk(self, data):
        if not data:
            return
        self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
        self.wfile.flush()

    def end_chunked(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def drop_connection(self):
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def client_gone(self):
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    # -- dispatch -----------------------------------------------------------

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def dispatch(self):
        body = self.read_body()
        path = self.path
        if path.startswith("/_control/"):
            self.record("test", body)
            return self.control(path, body)
        route = self.data_route(path)
        if route:
            sid, port, rest = route
            self.record("data", body)
            return self.data_plane(sid, port, rest, body)
        self.record("control", body)
        key = self.headers.get("X-API-KEY")
        if key != STATE.api_key:
            return self.send_error_body(401, "Invalid API key")
        return self.control_plane(body)

    def data_route(self, path):
        m = re.match(r"^/sbx/([A-Za-z0-9_-]+)/(\d+)(/.*)?$", path)
        if m:
            return m.group(1), int(m.group(2)), m.group(3) or "/"
        host = (self.headers.get("Host") or "").split(":")[0]
        m = re.match(r"^(\d+)-([A-Za-z0-9_-]+)\.(.+)$", host)
        if m and m.group(3) == STATE.domain:
            return m.group(2), int(m.group(1)), path
        sid = self.headers.get("E2b-Sandbox-Id")
        port = self.headers.get("E2b-Sandbox-Port")
        if sid and port and port.isdigit() and not path.startswith("/sandboxes") and not path.startswith("/v2/"):
            return sid, int(port), path
        return None

    # -- test control -------------------------------------------------------

    def control(self, path, body):
        if path == "/_control/faults" and self.command == "POST":
            f = json.loads(body or b"[]")
            with STATE.lock:
                STATE.faults.extend(f if isinstance(f, list) else [f])
            return self.send_json(200, {"faults": len(STATE.faults)})
        if path == "/_control/reset" and self.command == "POST":
            with STATE.lock:
                for procs in STATE.procs.values():
                    for p in procs:
                        p.kill()
                STATE.reset()
            return self.send_json(200, {})
        if path == "/_control/requests":
            with STATE.lock:
                return self.send_json(200, list(STATE.requests))
        if path == "/_control/sandboxes":
            with STATE.lock:
                out = []
                for sb in STATE.sandboxes.values():
                    STATE.alive(sb["sandboxID"])
                    out.append({k: v for k, v in sb.items() if k != "dir"})
                return self.send_json(200, out)
        if path == "/_control/pip":
            with STATE.lock:
                return self.send_json(200, list(STATE.pip_calls))
        m = re.match(r"^/_control/expire/([A-Za-z0-9_-]+)$", path)
        if m and self.command == "POST":
            with STATE.lock:
                sb = STATE.sandboxes.get(m.group(1))
                if sb:
                    sb["killed"] = True
                    sb["ended_by"] = "expired"
            return self.send_json(200 if sb else 404, {})
        return self.send_error_body(404, "no such control endpoint")

    # -- control plane --------------------------------------------------------

    def fault_status(self, op):
        f = STATE.take_fault(op)
        if f and f.get("kind", "status") == "status":
            status = int(f.get("status", 500))
            self.send_error_body(status, f.get("message", "injected failure %d" % status))
            return True
        return False

    def listed(self, sb):
        return {
            "templateID": sb["templateID"],
            "alias": "code-interpreter-v1",
            "sandboxID": sb["sandboxID"],
            "clientID": sb["clientID"],
            "startedAt": sb["startedAt"],
            "endAt": datetime.datetime.fromtimestamp(sb["end_at"], datetime.timezone.utc).isoformat(),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "metadata": sb["metadata"],
            "state": "running",
            "envdVersion": "0.2.4",
        }

    def control_plane(self, body):
        u = urllib.parse.urlsplit(self.path)
        path, query = u.path, urllib.parse.parse_qs(u.query, keep_blank_values=True)
        if path == "/sandboxes" and self.command == "POST":
            if self.fault_status("create"):
                return
            try:
                req = json.loads(body)
            except ValueError:
                return self.send_error_body(400, "invalid JSON")
            if not isinstance(req, dict) or not isinstance(req.get("templateID"), str):
                return self.send_error_body(400, "templateID is required")
            sid = "i" + uuid.uuid4().hex[:19]
            token = "tok_" + uuid.uuid4().hex
            sdir = os.path.join(STATE.workdir, sid)
            os.makedirs(sdir, mode=0o700)
            timeout = int(req.get("timeout", 15))
            sb = {
                "templateID": req["templateID"],
                "sandboxID": sid,
                "clientID": "fakeclient",
                "envdVersion": "0.2.4",
                "envdAccessToken": token,
                "metadata": req.get("metadata") or {},
                "envVars": req.get("envVars") or {},
                "secure": req.get("secure"),
                "allow_internet_access": req.get("allow_internet_access"),
                "timeout": timeout,
                "startedAt": now_iso(),
                "end_at": time.time() + timeout,
                "killed": False,
                "ended_by": None,
                "refreshes": 0,
                "executions": 0,
                "contexts": {None: {}},
                "context_languages": {},
                "dir": sdir,
            }
            with STATE.lock:
                STATE.sandboxes[sid] = sb
            return self.send_json(201, {
                "templateID": sb["templateID"],
                "sandboxID": sid,
                "clientID": "fakeclient",
                "envdVersion": "0.2.4",
                "envdAccessToken": token,
                "domain": None,
            })
        if path in ("/v2/sandboxes", "/sandboxes") and self.command == "GET":
            if self.fault_status("list"):
                return
            want = {}
            if "metadata" in query:
                want = dict(urllib.parse.parse_qsl(query["metadata"][0], keep_blank_values=True))
            states = query.get("state", ["running"])[0].split(",")
            with STATE.lock:
                items = [self.listed(sb) for sid, sb in STATE.sandboxes.items()
                         if STATE.alive(sid) and "running" in states
                         and all(sb["metadata"].get(k) == v for k, v in want.items())]
            if path == "/sandboxes":
                return self.send_json(200, items)
            limit = int(query.get("limit", ["100"])[0])
            size = min(limit, STATE.page_size)
            start = int(query.get("nextToken", ["0"])[0] or 0)
            page = items[start:start + size]
            headers = {}
            if start + size < len(items):
                headers["x-next-token"] = str(start + size)
            return self.send_json(200, page, headers)
        m = re.match(r"^/sandboxes/([A-Za-z0-9_-]+)(/timeout|/connect)?$", path)
        if m:
            sid, action = m.group(1), m.group(2)
            if self.command == "GET" and not action:
                if self.fault_status("get"):
                    return
                with STATE.lock:
                    sb = STATE.alive(sid)
                    if not sb:
                        return self.send_error_body(404, "sandbox %s not found" % sid)
                    d = self.listed(sb)
                d.update({"envdAccessToken": sb["envdAccessToken"], "domain": None})
                return self.send_json(200, d)
            if self.command == "POST" and action == "/timeout":
                if self.fault_status("timeout"):
                    return
                try:
                    t = int(json.loads(body)["timeout"])
                except (ValueError, KeyError, TypeError):
                    return self.send_error_body(400, "timeout is required")
                with STATE.lock:
                    sb = STATE.alive(sid)
                    if not sb:
                        return self.send_error_body(404, "sandbox %s not found" % sid)
                    sb["end_at"] = time.time() + t
                    sb["refreshes"] += 1
                return self.send_json(204, None)
            if self.command == "POST" and action == "/connect":
                with STATE.lock:
                    sb = STATE.alive(sid)
                    if not sb:
                        return self.send_error_body(404, "sandbox %s not found" % sid)
                return self.send_json(200, {
                    "templateID": sb["templateID"], "sandboxID": sid, "clientID": "fakeclient",
                    "envdVersion": "0.2.4", "envdAccessToken": sb["envdAccessToken"], "domain": None})
            if self.command == "DELETE" and not action:
                if self.fault_status("kill"):
                    return
                with STATE.lock:
                    sb = STATE.alive(sid)
                    if not sb:
                        return self.send_error_body(404, "sandbox %s not found" % sid)
                    sb["killed"] = True
                    sb["ended_by"] = "kill"
                    for p in STATE.procs.pop(sid, set()):
                        p.kill()
                return self.send_json(204, None)
        return self.send_error_body(404, "no route %s %s" % (self.command, path))

    # -- data plane -----------------------------------------------------------

    def data_plane(self, sid, port, rest, body):
        with STATE.lock:
            sb = STATE.alive(sid)
        if not sb:
            # What E2B's edge answers for a sandbox that is gone.
            return self.send_error_body(502, "The sandbox %s was not found" % sid)
        if self.headers.get("X-Access-Token") != sb["envdAccessToken"]:
            return self.send_error_body(401, "missing or wrong X-Access-Token")
        rest = urllib.parse.urlsplit(rest).path
        if port == INTERPRETER_PORT:
            if rest == "/health":
                return self.send_json(200, "OK")
            if rest == "/execute" and self.command == "POST":
                return self.execute(sb, body)
            if rest == "/contexts" and self.command == "POST":
                if self.fault_status("contexts"):
                    return
                try:
                    creq = json.loads(body or b"{}")
                except ValueError:
                    return self.send_error_body(422, "invalid JSON")
                language = str(creq.get("language") or "python").lower().strip()
                language = TS_LANGUAGES.get(language, language)
                cid = uuid.uuid4().hex
                with STATE.lock:
                    sb["contexts"][cid] = {}
                    sb["context_languages"][cid] = language
                    if language in ("typescript", "javascript"):
                        STATE.kernels[(sb["sandboxID"], cid)] = TsKernel(sb["dir"])
                return self.send_json(200, {"id": cid, "language": language, "cwd": "/home/user"})
            m = re.match(r"^/contexts/([A-Za-z0-9_-]+)$", rest)
            if m and self.command == "DELETE":
                with STATE.lock:
                    found = sb["contexts"].pop(m.group(1), None) is not None
                    kernel = STATE.kernels.pop((sb["sandboxID"], m.group(1)), None)
                if kernel:
                    kernel.kill()
                return self.send_json(204 if found else 404, None)
        if port == ENVD_PORT:
            if rest == "/health":
                return self.send_json(204, None)
            if rest == "/process.Process/Start" and self.command == "POST":
                return self.process_start(sb, body)
        return self.send_error_body(404, "no route on port %d: %s %s" % (port, self.command, rest))

    def execute(self, sb, body):
        try:
            req = json.loads(body)
        except ValueError:
            return self.send_error_body(422, "invalid JSON")
        if not isinstance(req, dict) or not isinstance(req.get("code"), str):
            return self.send_error_body(422, "code is required")
        ctx_id = req.get("context_id")
        if ctx_id is not None and req.get("language") is not None:
            return self.send_json(400, "Only one of context_id or language can be provided")
        with STATE.lock:
            if ctx_id not in sb["contexts"]:
                return self.send_json(404, "Context %s not found" % ctx_id)
            ctx_env = dict(sb["contexts"][ctx_id])
        fault = STATE.take_fault("execute")
        kind = fault.get("kind", "status") if fault else None
        if kind == "status":
            status = int(fault.get("status", 500))
            return self.send_error_body(status, "injected failure %d" % status)
        with STATE.lock:
            kernel = STATE.kernels.get((sb["sandboxID"], ctx_id))
        if kernel:
            return self.execute_ts(sb, kernel, req["code"])

        sdir = sb["dir"]
        cell = tempfile.NamedTemporaryFile("w", dir=sdir, suffix=".py", delete=False, encoding="utf-8")
        cell.write(req["code"])
        cell.close()
        result_path = cell.name + ".result"
        env_path = cell.name + ".env"
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sdir, "LANG": "C.UTF-8"}
        env.update(ctx_env)
        env.update(req.get("env_vars") or {})
        proc = subprocess.Popen(
            ["/usr/bin/python3", "-c", DRIVER, cell.name, result_path, env_path],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=sdir, env=env, start_new_session=True)
        with STATE.lock:
            STATE.procs.setdefault(sb["sandboxID"], set()).add(proc)
            STATE.execution_count += 1
            count = STATE.execution_count
            sb["executions"] += 1

        def line(obj):
            self.chunk((json.dumps(obj) + "\n").encode("utf-8"))

        try:
            self.start_chunked(None)
            line({"type": "number_of_executions", "execution_count": count})
            if kind == "display_first":
                decoy = base64.b64encode(json.dumps({"results": "display-decoy", "agent_state": None}).encode()).decode()
                line({"type": "result", "text": decoy, "extra": {}, "is_main_result": False})
            if kind == "stall":
                while not self.client_gone():
                    time.sleep(0.2)
                proc.kill()
                return self.drop_connection()
            decoders = {proc.stdout.fileno(): ("stdout", codecs.getincrementaldecoder("utf-8")("replace")),
                        proc.stderr.fileno(): ("stderr", codecs.getincrementaldecoder("utf-8")("replace"))}
            open_fds = set(decoders)
            sent_output = False
            while open_fds:
                r, _, _ = select.select(list(open_fds), [], [], 0.5)
                if not r and self.client_gone():
                    proc.kill()
                    return self.drop_connection()
                for fd in r:
                    data = os.read(fd, 65536)
                    name, dec = decoders[fd]
                    if not data:
                        open_fds.discard(fd)
                        text = dec.decode(b"", final=True)
                    else:
                        text = dec.decode(data)
                    if text:
                        line({"type": name, "text": text, "timestamp": now_iso()})
                        sent_output = True
                if kind == "midstream_502" and sent_output:
                    proc.kill()
                    self.chunk(b"<html><head><title>502 Bad Gateway</title></head><body>502 Bad Gateway</body></html>\n")
                    return self.drop_connection()
            proc.wait()
            if kind == "midstream_502":
                self.chunk(b"<html><body>502 Bad Gateway</body></html>\n")
                return self.drop_connection()
            try:
                with open(result_path) as f:
                    res = json.load(f)
            except (OSError, ValueError):
                res = {"result": None, "error": {"name": "UnexpectedEndOfExecution",
                                                 "value": "the kernel died", "traceback": ""}}
            try:
                with open(env_path) as f:
                    new_env = json.load(f)
                for k in ("PATH", "HOME", "LANG"):
                    new_env.pop(k, None)
                with STATE.lock:
                    if ctx_id in sb["contexts"]:
                        sb["contexts"][ctx_id] = new_env
            except (OSError, ValueError):
                pass
            if res.get("result") is not None:
                line({"type": "result", "text": strip_quotes(res["result"]), "extra": {}, "is_main_result": True})
            if res.get("error"):
                line(dict(type="error", **res["error"]))
            if kind == "truncate":
                return self.end_chunked()
            line({"type": "end_of_execution"})
            self.end_chunked()
        except (BrokenPipeError, ConnectionResetError):
            proc.kill()
            self.close_connection = True
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            with STATE.lock:
                STATE.procs.get(sb["sandboxID"], set()).discard(proc)
            for p in (cell.name, result_path, env_path):
                try:
                    os.unlink(p)
                except OSError:
                    pass

    def execute_ts(self, sb, kernel, code):
        with STATE.lock:
            STATE.execution_count += 1
            count = STATE.execution_count
            sb["executions"] += 1

        def line(obj):
            self.chunk((json.dumps(obj) + "\n").encode("utf-8"))

        with kernel.lock:
            try:
                self.start_chunked(None)
                line({"type": "number_of_executions", "execution_count": count})
                kernel.send(code)
                while True:
                    m = kernel.message(0.5)
                    if m is None:
                        if self.client_gone():
                            kernel.kill()
                            return self.drop_connection()
                        continue
                    t = m.get("type")
                    if t in ("stdout", "stderr"):
                        line({"type": t, "text": m["text"], "timestamp": now_iso()})
                    elif t == "result":
                        line({"type": "result", "text": strip_quotes(m["text"]), "extra": {}, "is_main_result": True})
                    elif t == "error":
                        line({"type": "error", "name": m["name"], "value": m["value"], "traceback": m["traceback"]})
                        if m["name"] == "UnexpectedEndOfExecution":
                            break
                    elif t == "done":
                        break
                line({"type": "end_of_execution"})
                self.end_chunked()
            except (BrokenPipeError, ConnectionResetError):
                kernel.kill()
                self.close_connection = True

    def npm_install(self, sb, argv, cwd):
        """`npm install -- SPEC` in the kernel's working directory: an allowed
        name gets a small local package in node_modules, whose module exports
        its name and version (and, for Letta's client, a LettaClient class)."""
        spec = argv[3]
        m = re.match(r"^(@[a-z0-9._-]+/[a-z0-9._-]+|[a-z0-9._-]+)(?:@(.*))?$", spec)
        name = m.group(1) if m else ""
        if name and name in STATE.npm_allow and cwd == "/home/user":
            version = "1.0.0"
            target = os.path.join(sb["dir"], "node_modules", *name.split("/"))
            os.makedirs(target, exist_ok=True)
            with open(os.path.join(target, "package.json"), "w") as f:
                json.dump({"name": name, "version": version, "main": "index.js"}, f)
            extra = ("class LettaClient { constructor(options) { this.options = options; } }\n"
                     "module.exports.LettaClient = LettaClient;\n") if name == "@letta-ai/letta-client" else ""
            with open(os.path.join(target, "index.js"), "w") as f:
                f.write("module.exports = { name: %s, version: %s, greet: (s) => 'hello ' + s };\n%s"
                        % (json.dumps(name), json.dumps(version), extra))
            return True, ("\nadded 1 package in 1s\n").encode()
        return False, ("npm ERR! code E404\nnpm ERR! 404 Not Found - GET https://registry.npmjs.org/%s - Not found\n"
                       "npm ERR! 404\nnpm ERR! 404  '%s' is not in this registry.\n" % (name or spec, spec)).encode()

    def process_start(self, sb, body):
        if self.headers.get("Authorization") not in ("Basic dXNlcjo=", "Basic cm9vdDo="):
            return self.send_json(401, {"code": "unauthenticated", "message": "missing user"})
        if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            return self.send_json(400, {"code": "invalid_argument", "message": "bad envelope"})
        try:
            req = json.loads(body[5:])
            proc = req["process"]
            argv = [proc["cmd"]] + list(proc.get("args", []))
        except (ValueError, KeyError, TypeError):
            return self.send_json(400, {"code": "invalid_argument", "message": "bad StartRequest"})
        with STATE.lock:
            STATE.pip_calls.append({"sandbox": sb["sandboxID"], "argv": argv, "envs": proc.get("envs"),
                                    "cwd": proc.get("cwd"), "content_type": self.headers.get("Content-Type")})
        fault = STATE.take_fault("process")
        kind = fault.get("kind", "status") if fault else None
        if kind == "status":
            status = int(fault.get("status", 500))
            return self.send_json(status, {"code": "internal", "message": "injected failure %d" % status})
        self.start_chunked("application/connect+json")
        self.chunk(envelope(0, {"event": {"start": {"pid": 4242}}}))
        if kind == "stall":
            while not self.client_gone():
                time.sleep(0.2)
            return self.drop_connection()
        if kind == "deadline_exceeded":
            self.chunk(envelope(2, {"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}}))
            return self.end_chunked()
        if kind == "stderr":
            # The command fails and writes the fault's bytes (base64) on its stderr.
            self.chunk(envelope(0, {"event": {"data": {"stderr": fault.get("stderr_b64", "")}}}))
            self.chunk(envelope(0, {"event": {"end": {"exitCode": 1, "exited": True, "status": "exit status 1"}}}))
            self.chunk(envelope(2, {}))
            return self.end_chunked()
        if len(argv) == 4 and argv[:3] == ["npm", "install", "--"]:
            ok, text = self.npm_install(sb, argv, proc.get("cwd"))
            self.chunk(envelope(0, {"event": {"data": {"stdout" if ok else "stderr": base64.b64encode(text).decode()}}}))
            end = {"exited": True, "status": "exit status 0"} if ok else \
                {"exitCode": 1, "exited": True, "status": "exit status 1"}
            self.chunk(envelope(0, {"event": {"end": end}}))
            self.chunk(envelope(2, {}))
            return self.end_chunked()
        is_pip = len(argv) == 7 and argv[:6] == ["python3", "-m", "pip", "install", "--no-input", "--"]
        name = ""
        if is_pip:
            m = re.match(r"[A-Za-z0-9._-]+", argv[6])
            name = m.group(0).lower() if m else ""
        if is_pip and name in STATE.pip_allow:
            out = ("Successfully installed %s\n" % argv[6]).encode()
            self.chunk(envelope(0, {"event": {"data": {"stdout": base64.b64encode(out).decode()}}}))
            self.chunk(envelope(0, {"event": {"end": {"exited": True, "status": "exit status 0"}}}))
        else:
            what = argv[6] if is_pip else " ".join(argv)
            err = ("ERROR: No matching distribution found for %s\n" % what).encode()
            self.chunk(envelope(0, {"event": {"data": {"stderr": base64.b64encode(err).decode()}}}))
            self.chunk(envelope(0, {"event": {"end": {"exitCode": 1, "exited": True, "status": "exit status 1"}}}))
        self.chunk(envelope(2, {}))
        self.end_chunked()


def main():
    global STATE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the listening port here once ready")
    ap.add_argument("--api-key-file", required=True)
    ap.add_argument("--domain", default="e2b.test")
    ap.add_argument("--pip-allow", default="six,requests,tsb-fake-ok")
    ap.add_argument("--npm-allow", default="tsb-fake-npm-ok,@letta-ai/letta-client")
    ap.add_argument("--page-size", type=int, default=100)
    args = ap.parse_args()
    with open(args.api_key_file) as f:
        key = f.read().strip()
    workdir = tempfile.mkdtemp(prefix="e2b-fake-")
    STATE = State(key, args.domain, [n.strip().lower() for n in args.pip_allow.split(",") if n.strip()],
                  args.page_size, workdir, [n.strip() for n in args.npm_allow.split(",") if n.strip()])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    srv = ThreadingHTTPServer((LISTEN_ADDRESS, args.port), Handler)
    srv.daemon_threads = True
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(srv.server_address[1]))
        os.rename(tmp, args.port_file)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for procs in STATE.procs.values():
            for p in procs:
                p.kill()
        for k in STATE.kernels.values():
            k.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
