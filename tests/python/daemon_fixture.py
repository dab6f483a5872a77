"""A real toolsandboxd on a temporary socket, for the client tests.

    class MyTest(unittest.TestCase):
        @classmethod
        def setUpClass(cls):
            cls.daemon = start_daemon(cls, max_concurrent_runs=1)

The daemon is build/bin/toolsandboxd (or $TSB_BUILD/bin/toolsandboxd) with
a temporary configuration:

    {"version": 1,
     "socket": {"path": "<tmp>/d.sock"},
     "engine": {"state_dir": "<tmp under /run>/state",
                "cgroup_parent": "$TSB_CGROUP_PARENT or /toolsandbox-pytest",
                "uid_base": <a range of its own>, "uid_slots": 64},
     ...overrides}

and the policies shipped in the binary, unless $TSB_TEST_POLICIES_DIR names
a directory with default.json, organizations.json, seccomp/... to use instead.

TSB_TEST_KEEP=1 keeps the temporary directory (configuration, daemon.log).

Sandboxes need root. Without root the tests are skipped, loudly; with CI=true
or TOOLSANDBOXD_TESTS_MUST_RUN containing "root" they fail instead.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CLIENT_DIR = os.path.join(REPO, "clients", "python")
if CLIENT_DIR not in sys.path:
    sys.path.insert(0, CLIENT_DIR)

from toolsandbox_client import Client  # noqa: E402

# Set in the daemon's environment (and this process's): no tool may see it.
HOST_ONLY_VAR = "TSB_CLIENT_TEST_HOST_ONLY"
HOST_ONLY_VALUE = "host-only-%016x" % random.getrandbits(64)
os.environ[HOST_ONLY_VAR] = HOST_ONLY_VALUE


def must_run() -> bool:
    return os.environ.get("CI") == "true" or "root" in os.environ.get("TOOLSANDBOXD_TESTS_MUST_RUN", "")


def daemon_binary() -> str:
    build = os.environ.get("TSB_BUILD")
    if build:
        for cand in (os.path.join(build, "bin", "toolsandboxd"), os.path.join(build, "toolsandboxd")):
            if os.path.isfile(cand):
                return cand
        return os.path.join(build, "bin", "toolsandboxd")
    return os.path.join(REPO, "build", "bin", "toolsandboxd")


def require_daemon() -> None:
    """Skip (or, when the tests must run, fail) if a daemon cannot be started here."""
    reason = None
    if os.geteuid() != 0:
        reason = ("toolsandboxd end-to-end tests need root (user namespaces, cgroups, mounts); "
                  "this process runs as uid %d" % os.geteuid())
    elif not os.access(daemon_binary(), os.X_OK):
        reason = "no toolsandboxd binary at %s (build it, or set TSB_BUILD to the build directory)" % daemon_binary()
    if reason is None:
        return
    if must_run():
        raise AssertionError("%s; CI=true or TOOLSANDBOXD_TESTS_MUST_RUN=root forbids skipping" % reason)
    sys.stderr.write("\n*** SKIPPING toolsandboxd client end-to-end tests: %s ***\n" % reason)
    raise unittest.SkipTest(reason)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        elif v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


class Daemon:
    def __init__(self, wrap=(), binary=None, **overrides):
        # wrap: a command the daemon runs under (tests/egress: a mount and a
        # network namespace of the test's making); binary: another
        # toolsandboxd than the build's.
        self.wrap = list(wrap)
        self.binary = binary
        self.overrides = overrides
        self.proc = None
        self.tmp = None
        self.run_dir = None
        self.socket_path = None
        self.log_path = None
        self.config = None

    # --- life cycle -----------------------------------------------------------

    def start(self, ready_timeout: float = 20.0) -> "Daemon":
        self.tmp = tempfile.mkdtemp(prefix="tsb-client-")
        os.chmod(self.tmp, 0o755)  # peers of other uids must reach the socket
        self.run_dir = tempfile.mkdtemp(prefix="tsb-client-", dir="/run")
        os.chmod(self.run_dir, 0o711)  # the sandboxes' ids must reach the staging root below it
        self.socket_path = os.path.join(self.tmp, "d.sock")
        self.log_path = os.path.join(self.tmp, "daemon.log")
        slots = 64
        config = {
            "version": 1,
            "socket": {"path": self.socket_path},
            "engine": {
                "state_dir": os.path.join(self.run_dir, "state"),
                "cgroup_parent": os.environ.get("TSB_CGROUP_PARENT", "/toolsandbox-pytest"),
                # A host id range of its own, away from the default one.
                "uid_base": 0x50000000 + random.randrange(256) * slots * 65536,
                "uid_slots": slots,
            },
            "max_concurrent_runs": 8,
            "max_queued_runs": 64,
            "request_timeout": "10s",
            "shutdown_grace": "2s",
        }
        # Per-tool venvs: a cache of this daemon's own (never the host's), as
        # the front end's user owns it.
        venvs = os.path.join(self.tmp, "venvs")
        os.mkdir(venvs, 0o755)
        try:
            import pwd
            fe = pwd.getpwnam("toolsandboxd")
            os.chown(venvs, fe.pw_uid, fe.pw_gid)
        except (KeyError, PermissionError):
            pass
        config["venvs"] = {"cache_dir": venvs}
        policies = os.environ.get("TSB_TEST_POLICIES_DIR")
        if policies:
            config["policies_dir"] = os.path.abspath(policies)
            orgs = os.path.join(config["policies_dir"], "organizations.json")
            if os.path.exists(orgs):
                config["organizations"] = orgs
        self.config = _merge(config, self.overrides)
        cfg_path = os.path.join(self.tmp, "toolsandboxd.json")
        with open(cfg_path, "w") as f:
            json.dump(self.config, f, indent=2)
        env = dict(os.environ)
        env[HOST_ONLY_VAR] = HOST_ONLY_VALUE
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.wrap + [self.binary or daemon_binary(), "--config", cfg_path], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                log_text = self.log()
                self.stop()
                raise RuntimeError("toolsandboxd exited with %s during start-up:\n%s" % (self.proc.returncode, log_text))
            if os.path.exists(self.socket_path) and self._answers():
                return self
            if time.monotonic() > deadline:
                log_text = self.log()
                self.stop()
                raise RuntimeError("toolsandboxd did not answer on %s within %.0fs:\n%s"
                                   % (self.socket_path, ready_timeout, log_text))
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(self.socket_path)
                s.sendall(b'{"v":1,"id":"ready","type":"status"}\n')
                return b"\n" in s.recv(1 << 16)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        # The state dir: remove only what the daemon leaves (never recurse
        # into something that might still be a mount point).
        if self.run_dir:
            state = os.path.join(self.run_dir, "state")
            for p in (os.path.join(state, "uid-slots.lock"),):
                try:
                    os.unlink(p)
                except OSError:
                    pass
            for d in (os.path.join(state, "root"), os.path.join(state, "engines"), os.path.join(state, "empty"), state,
                      self.run_dir):
                try:
                    if not os.path.ismount(d):
                        os.rmdir(d)
                except OSError:
                    pass
            self.run_dir = None
        if self.tmp and os.environ.get("TSB_TEST_KEEP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    # --- utilities --------------------------------------------------------------

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def client(self, **kw) -> Client:
        kw.setdefault("timeout", 60)
        return Client(self.socket_path, **kw)

    def status(self) -> dict:
        return self.client().status()

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition") -> dict:
        """Poll status() until predicate(status) holds; returns that status."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if predicate(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for %s; last status: %s" % (what, json.dumps(st)))
            time.sleep(0.05)

    def raw(self, timeout: float = 30.0) -> "RawConn":
        return RawConn(self.socket_path, timeout)


def start_daemon(test_class, **overrides) -> Daemon:
    """Start a daemon for a TestCase class; it is stopped by a class cleanup."""
    require_daemon()
    d = Daemon(**overrides)
    test_class.addClassCleanup(d.stop)
    return d.start()


class RawConn:
    """A bare protocol connection, for sending exactly the bytes a test wants."""

    def __init__(self, path: str, timeout: float = 30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send(self, data) -> None:
        if isinstance(data, (dict, list)):
            data = json.dumps(data).encode() + b"\n"
        elif isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def readline(self, timeout: float = 30.0):
        """The next answer as a dict, or None at EOF."""
        self.sock.settimeout(timeout)
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                if self.buf:
                    raise AssertionError("connection closed in the middle of an answer: %r" % self.buf[:200])
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, obj, timeout: float = 30.0):
        self.send(obj)
        return self.readline(timeout)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- tool sources and scripts used by several test files --------------------------

SLEEP_TOOL = "import time\n\ndef sleeper(seconds: float) -> str:\n    time.sleep(seconds)\n    return 'woke'\n"


def sleep_request(seconds: float = 30, request_id: str = "sleeper", org: str = "org-client-tests") -> dict:
    return {"v": 1, "id": request_id, "type": "run_tool", "tool_name": "sleeper", "organization_id": org,
            "source_code": SLEEP_TOOL, "args": {"seconds": seconds}}


# Letta's markers (letta/services/tool_sandbox/base.py and the legacy
# letta/services/tool_executor/tool_execution_sandbox.py), computed as Letta does.
LETTA_START = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker"))
LETTA_END = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-end-marker"))
LETTA_MARKER = uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker").bytes


def legacy_text_script(payload: dict) -> str:
    """A script that reports its result with the legacy text markers (section 5.1)."""
    return (
        "import base64, json, sys\n"
        "payload = json.dumps(%r).encode('utf-8')\n"
        "print('before the frame')\n"
        "sys.stdout.write(%r + base64.b64encode(payload).decode('utf-8') + %r)\n"
        "print('after the frame')\n" % (payload, LETTA_START, LETTA_END)
    )


def binary_frame_script(payload: dict, corrupt_md5: bool = False) -> str:
    """A script that writes Letta's binary frame (section 5.2), optionally with a wrong md5."""
    return (
        "import hashlib, json, struct, sys\n"
        "payload = json.dumps(%r).encode('utf-8')\n"
        "digest = hashlib.md5(payload + (b'tampered' if %r else b'')).hexdigest().encode('ascii')\n"
        "print('before the frame')\n"
        "sys.stdout.flush()\n"
        "sys.stdout.buffer.write(%r + struct.pack('>I', len(payload)) + digest + payload)\n"
        "sys.stdout.buffer.flush()\n"
        "print('after the frame')\n" % (payload, corrupt_md5, LETTA_MARKER)
    )
