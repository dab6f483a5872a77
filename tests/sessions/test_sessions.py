"""Sessions: long-lived sandboxes over the client's connection (protocol
section 6.8), through the raw protocol, `toolsandbox session` and the real
MCP SDK client with the reference MCP servers from npm.

    tests/guard/run-guarded ... -- /usr/bin/python3 -m pytest tests/sessions

Hostile commands (forks that try to outlive their session, floods, a
command that never reads) run here, inside the outer guard
(scripts/lib.sh, run_sessions_tier). The MCP packages are the ones
scripts/lib.sh installs from tests/sessions/mcp/package-lock.json into
/var/lib/toolsandbox-test/mcp; the tests use them offline.

Needs root (tests/python/daemon_fixture.py): skipped otherwise, failed
under CI=true.
"""

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import daemon_fixture as F  # noqa: E402

MCP_DIR = "/var/lib/toolsandbox-test/mcp"
MCP_IN_SANDBOX = "/opt/mcp"
SERVERS = MCP_IN_SANDBOX + "/node_modules/@modelcontextprotocol"
ORG = "org-sessions"
ORG_FEW = "org-sessions-few"


def tsb_cli():
    return os.path.join(os.path.dirname(F.daemon_binary()), "toolsandbox")


def write_policies(tmp):
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)
    base = os.path.join(F.REPO, "policies", "default.json")
    mcp = {"filesystem": {"binds": [{"source": MCP_DIR, "target": MCP_IN_SANDBOX}]}}
    policies = {
        "default": dict(mcp),
        "short": dict(mcp, sessions={"commands": ["/usr/bin/python3"], "idle_timeout": "1s", "max_lifetime": "4s",
                                     "stream_bytes": "1MiB", "memory": "128MiB"}),
        "nosess": {"sessions": None},
        "grep": dict(mcp, sessions={"commands": ["/usr/bin/grep"]}),
        "missing": {"sessions": {"commands": ["/usr/bin/toolsandbox-not-installed"]}},
    }
    for name, extra in policies.items():
        with open(os.path.join(pol, name + ".json"), "w") as f:
            json.dump({"version": 1, "include": base, **extra}, f)
    allowed = sorted(policies)
    orgs = {"version": 1,
            "default": {"privileged": False, "policy": "default", "allowed_policies": allowed},
            "organizations": {ORG_FEW: {"policy": "default", "allowed_policies": allowed}}}
    with open(os.path.join(pol, "organizations.json"), "w") as f:
        json.dump(orgs, f)
    return pol


def marked(tag):
    """Processes of the host whose command line holds `tag`."""
    out = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    return [p for p in out if int(p) != os.getpid()]


def wait_gone(tag, timeout):
    deadline = time.monotonic() + timeout
    while marked(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_sdk_client(test, tmp, session_opts, server_args, steps, launcher=("node",)):
    """The TypeScript MCP SDK's stdio client (node, on the host) with
    `toolsandbox session SESSION_OPTS -- LAUNCHER SERVER_ARGS` as its server
    command; `steps` is the body of an async function of `client`; its JSON."""
    sdk = MCP_DIR + "/node_modules/@modelcontextprotocol/sdk/dist/esm"
    script = textwrap.dedent("""\
        import { Client } from "%s/client/index.js";
        import { StdioClientTransport } from "%s/client/stdio.js";
        const transport = new StdioClientTransport({ command: %s, args: %s, stderr: "inherit" });
        const client = new Client({ name: "toolsandbox-tests", version: "1.0.0" });
        await client.connect(transport);
        const out = await (async (client) => { %s })(client);
        await client.close();
        console.log(JSON.stringify(out));
        """) % (sdk, sdk, json.dumps(tsb_cli()), json.dumps(["session"] + session_opts + ["--"] + list(launcher) + server_args),
                steps)
    path = os.path.join(tmp, "client-%s.mjs" % uuid.uuid4().hex[:8])
    with open(path, "w") as f:
        f.write(script)
    p = subprocess.run(["/usr/bin/node", path], capture_output=True, text=True, timeout=120)
    test.assertEqual(p.returncode, 0, p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


class Raw:
    """One session on the raw protocol: the request, the answer line, frames."""

    def __init__(self, path, command, org=ORG, policy=None, env=None, workspace=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        req = {"v": 1, "id": "s-" + uuid.uuid4().hex[:8], "type": "session", "organization_id": org, "command": command}
        if policy:
            req["policy"] = policy
        if env:
            req["env"] = env
        if workspace:
            req["workspace"] = workspace
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        self.buf = b""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("closed before the answer")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        self.answer = json.loads(line)
        self.out, self.err, self.record = b"", b"", None

    def send(self, data):
        self.sock.sendall(data)

    def end_stdin(self):
        self.sock.shutdown(socket.SHUT_WR)

    def read_frame(self, timeout=30):
        """One frame (kind, payload), or None at the connection's end."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 5:
                kind, n = self.buf[:1], struct.unpack(">I", self.buf[1:5])[0]
                if len(self.buf) >= 5 + n:
                    payload, self.buf = self.buf[5:5 + n], self.buf[5 + n:]
                    if kind == b"o":
                        self.out += payload
                    elif kind == b"e":
                        self.err += payload
                    elif kind == b"x":
                        self.record = json.loads(payload)
                    else:
                        raise AssertionError("unknown frame kind %r" % kind)
                    return kind, payload
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no frame within %ss" % timeout)
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def read_until(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while not pred():
            if self.read_frame(max(0.1, deadline - time.monotonic())) is None:
                break
        return pred()

    def finish(self, timeout=30):
        """Reads to the end record; returns it."""
        while self.record is None:
            if self.read_frame(timeout) is None:
                break
        return self.record

    def close(self):
        self.sock.close()


class Sessions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        F.require_daemon()
        if not os.path.isdir(os.path.join(MCP_DIR, "node_modules", "@modelcontextprotocol", "sdk")):
            raise AssertionError("%s lacks the MCP packages (scripts/lib.sh, install_test_mcp)" % MCP_DIR)
        cls.tmp = tempfile.mkdtemp(prefix="tsb-sessions-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        os.chmod(cls.tmp, 0o755)
        policies = write_policies(cls.tmp)
        cls.daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"),
                              bind_allowlist=[MCP_DIR], max_sessions=6, max_sessions_per_organization=2)
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()

    def setUp(self):
        # Each test's sessions end before the next one opens any (the
        # bounds per organization are per daemon). Registered first, run last.
        self.addCleanup(self.wait_no_session)

    def raw(self, command, **kw):
        r = Raw(self.daemon.socket_path, command, **kw)
        self.addCleanup(r.close)
        return r

    def cli(self, command, *opts, input=b"", timeout=60, org=ORG):
        rec = os.path.join(self.tmp, "rec-%s.json" % uuid.uuid4().hex[:8])
        p = subprocess.run([tsb_cli(), "session", "--socket", self.daemon.socket_path, "--org", org, "--record", rec,
                            *opts, "--", *command], input=input, capture_output=True, timeout=timeout)
        record = json.load(open(rec)) if os.path.exists(rec) else None
        return p, record

    def wait_no_session(self, timeout=5):
        self.daemon.wait_for(lambda st: st["sessions"]["open"] == 0, timeout, "no session open")

    # --- the stream and the end -----------------------------------------------

    def test_stdin_stdout_stderr_and_the_exit_status(self):
        script = ("import sys\nfor l in sys.stdin: print('echo', l.strip(), flush=True)\n"
                  "print('bye', file=sys.stderr)\nsys.exit(3)")
        p, rec = self.cli(["python3", "-c", script], input=b"one\ntwo\n")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertEqual(p.stdout, b"echo one\necho two\n")
        self.assertEqual(p.stderr, b"bye\n")
        self.assertEqual((rec["ended_by"], rec["end_reason"], rec["exit_code"]), ("exit", "exited", 3))
        self.assertEqual((rec["bytes_in"], rec["bytes_out"], rec["bytes_err"]), (8, 18, 4))
        self.assertEqual(rec["policy"], "default")
        st = self.daemon.status()["sessions"]
        self.assertGreaterEqual(st["total"], 1)
        self.assertIn("audit session_id=%s" % rec["session_id"], self.daemon.log())

    def test_bytes_sent_with_the_request_are_the_first_input(self):
        # An MCP client may send its first message with the request line.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.settimeout(30)
        s.connect(self.daemon.socket_path)
        req = {"v": 1, "id": "early", "type": "session", "organization_id": ORG,
               "command": ["python3", "-c", "import sys\nprint(sys.stdin.readline().strip()[::-1], flush=True)"]}
        s.sendall(json.dumps(req).encode() + b"\nhello early\n")
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        answer, frames = data.split(b"\n", 1)
        self.assertTrue(json.loads(answer)["ok"])
        self.assertIn(b"ylrae olleh", frames)

    def test_a_large_last_output_comes_whole_before_the_end(self):
        # The command writes 3 MiB and exits while the client is not reading
        # yet: every byte comes, in frames, before the end frame.
        r = self.raw(["python3", "-c", "import os\nfor i in range(48):\n    os.write(1, bytes([65 + i % 26]) * 65536)"])
        time.sleep(1.5)
        # Then slowly: the daemon is in the middle of a frame when the
        # command ends, and most of the output is still to come.
        while True:
            chunk = r.sock.recv(8192)
            if not chunk:
                break
            r.buf += chunk
            time.sleep(0.002)
        rec = r.finish(timeout=30)
        self.assertEqual(rec["ended_by"], "exit", rec)
        self.assertEqual(len(r.out), 48 * 65536)
        self.assertEqual(r.out, b"".join(bytes([65 + i % 26]) * 65536 for i in range(48)))
        self.assertIsNone(r.read_frame(5), "nothing after the end frame")

    def test_the_answer_names_the_command_as_started(self):
        r = self.raw(["python3", "-c", "print(42)"])
        self.assertTrue(r.answer["ok"], r.answer)
        s = r.answer["session"]
        self.assertEqual(s["command"], ["/venv/bin/python3", "-c", "print(42)"])
        self.assertEqual(s["policy"], "default")
        self.assertNotIn("workspace", s, "a sandbox of its own is no workspace")
        rec = r.finish()
        self.assertEqual(r.out, b"42\n")
        self.assertEqual(rec["session_id"], s["session_id"])

    def test_the_bridge_forwards_signals_to_the_server(self):
        # As tini or dumb-init do: the server itself gets SIGUSR1 (and goes
        # on), then SIGTERM, which its handler answers by exiting.
        script = textwrap.dedent("""\
            import signal, sys, time
            signal.signal(signal.SIGUSR1, lambda *a: print("got USR1", flush=True))
            signal.signal(signal.SIGTERM, lambda *a: (print("got TERM", flush=True), sys.exit(7)))
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
            """)
        proc = subprocess.Popen([tsb_cli(), "session", "--socket", self.daemon.socket_path, "--org", ORG, "--",
                                 "python3", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.assertEqual(proc.stdout.readline(), b"ready\n")
        proc.send_signal(signal.SIGUSR1)
        self.assertEqual(proc.stdout.readline(), b"got USR1\n")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        self.assertEqual(out, b"got TERM\n")
        self.assertEqual(proc.returncode, 7, "the server's own status")

    def test_a_signal_the_server_ignores_ends_the_session_2s_later(self):
        tag = "tsb-sig-" + uuid.uuid4().hex[:8]
        script = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                  "time.sleep(60)  # %s" % tag)
        proc = subprocess.Popen([tsb_cli(), "session", "--socket", self.daemon.socket_path, "--org", ORG, "--",
                                 "python3", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.assertEqual(proc.stdout.readline(), b"ready\n")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM)
        self.assertGreaterEqual(time.monotonic() - t0, 1.5)
        self.assertTrue(wait_gone(tag, 2))

    def test_a_session_takes_the_signals_it_may_be_sent(self):
        script = ("import signal, sys\nsignal.signal(signal.SIGHUP, lambda *a: sys.exit(3))\n"
                  "print('ready', flush=True)\nsignal.pause()")
        r = self.raw(["python3", "-c", script])
        self.assertTrue(r.read_until(lambda: b"ready\n" in r.out))
        sid = r.answer["session"]["session_id"]

        def signal_it(name):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(10)
                c.connect(self.daemon.socket_path)
                c.sendall(json.dumps({"v": 1, "id": "sig", "type": "session_kill", "session_id": sid,
                                      "signal": name}).encode() + b"\n")
                return json.loads(c.makefile().readline())
        for bad in ("KILL", "STOP", "SIGTERM", "9", ""):
            a = signal_it(bad)
            self.assertEqual(a["error"]["code"], "bad_request", (bad, a))
        self.assertIsNone(r.record)
        a = signal_it("HUP")
        self.assertEqual((a["ok"], a["killed"], a["signal"]), (True, sid, "HUP"), a)
        rec = r.finish()
        self.assertEqual((rec["ended_by"], rec["exit_code"]), ("exit", 3), rec)
        self.assertEqual(signal_it("HUP")["error"]["code"], "bad_request", "an ended session takes none")

    def test_the_python_client_sends_a_signal(self):
        sys.path.insert(0, F.CLIENT_DIR)
        from toolsandbox_client import Client
        with Client(self.daemon.socket_path).open_session(
                ["python3", "-c", "import signal, sys\nsignal.signal(signal.SIGUSR2, lambda *a: sys.exit(5))\n"
                                  "print('ready', flush=True)\nsignal.pause()"], organization_id=ORG) as s:
            out = b""
            while not out.endswith(b"ready\n"):  # (print may write it in two)
                kind, data = s.read(timeout=30)
                out += data if kind == "stdout" else b""
            s.send_signal("SIGUSR2")
            self.assertEqual(s.wait(timeout=30)["exit_code"], 5)

    def _wait_marked(self, tag, timeout=10):
        deadline = time.monotonic() + timeout
        while not marked(tag):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    # --- refusals ----------------------------------------------------------------

    def test_refusals_say_why_and_start_nothing(self):
        cases = [
            (["sh", "-c", "id"], {}, "policy_denied", "does not allow the command"),
            (["/usr/bin/python3x"], {}, "policy_denied", "does not allow the command"),
            (["python3", "-c", "pass"], {"policy": "nosess"}, "policy_denied", "has no \"sessions\""),
            (["python3", "-c", "pass"], {"env": {"PATH": "/tmp"}}, "policy_denied", "PATH"),
            (["python3", "-c", "pass"], {"policy": "nope"}, "policy_denied", ""),
        ]
        for command, kw, code, words in cases:
            r = self.raw(command, **kw)
            self.assertFalse(r.answer["ok"], (command, kw))
            self.assertEqual(r.answer["error"]["code"], code, r.answer)
            self.assertIn(words, r.answer["error"]["message"])
            self.assertEqual(r.sock.recv(10), b"", "the connection closes after a refusal")
        p, rec = self.cli(["sh", "-c", "id"])
        self.assertEqual(p.returncode, 125)
        self.assertIn(b"policy_denied", p.stderr)
        self.assertIsNone(rec)

    def test_a_program_that_is_not_there_fails_its_start(self):
        # Listed by the policy, absent from the sandbox: the launcher says so.
        r = self.raw(["toolsandbox-not-installed"], policy="missing")
        self.assertTrue(r.answer["ok"], r.answer)
        rec = r.finish()
        self.assertEqual((rec["ended_by"], rec["exit_code"]), ("exit", 127), rec)
        self.assertIn(b"cannot start /usr/bin/toolsandbox-not-installed", r.err)

    # --- ends the daemon decides ---------------------------------------------

    def test_idle_timeout(self):
        tag = "tsb-idle-" + uuid.uuid4().hex[:8]
        t0 = time.monotonic()
        r = self.raw(["python3", "-c", "import time\ntime.sleep(60)\n# " + tag], policy="short")
        rec = r.finish(timeout=10)
        self.assertEqual(rec["ended_by"], "idle", rec)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertTrue(wait_gone(tag, 1))

    def test_bytes_keep_a_session_alive_until_its_lifetime(self):
        # A byte every 0.3 s: never idle; max_lifetime (4 s) ends it.
        tag = "tsb-life-" + uuid.uuid4().hex[:8]
        r = self.raw(["python3", "-c", "import time\nwhile True:\n    print('.', flush=True)\n    time.sleep(0.3)\n# " + tag],
                     policy="short")
        rec = r.finish(timeout=15)
        self.assertEqual((rec["ended_by"], rec["end_reason"]), ("lifetime", "timeout"), rec)
        self.assertTrue(wait_gone(tag, 1))
        self.assertGreater(r.out.count(b"."), 5)
        p, _ = self.cli(["python3", "-c", "import time\nwhile True:\n    print('.', flush=True)\n    time.sleep(0.3)"],
                        "--policy", "short", timeout=20)
        self.assertEqual(p.returncode, 124)
        self.assertIn(b"lifetime", p.stderr)

    def test_stream_limit(self):
        tag = "tsb-stream-" + uuid.uuid4().hex[:8]
        r = self.raw(["python3", "-c", "import os\nwhile True:\n    os.write(1, b'x' * 65536)\n# " + tag], policy="short")
        rec = r.finish(timeout=15)
        self.assertEqual(rec["ended_by"], "stream_limit", rec)
        self.assertTrue(wait_gone(tag, 1))
        # Counted as it comes: what the pipe and one read held past the bound
        # at most, and nothing of it reached the client.
        self.assertLess(rec["bytes_out"], (1 << 20) + (1 << 18))
        self.assertLessEqual(len(r.out), 1 << 20)

    def test_a_limit_ends_the_session(self):
        # 128 MiB for the session: a command that takes more is OOM-killed.
        tag = "tsb-oom-" + uuid.uuid4().hex[:8]
        r = self.raw(["python3", "-c", "import os\nif os.fork() == 0:\n    os.execv('/usr/bin/python3', ['python3', '-c', "
                                       "'import time; time.sleep(60)', '%s'])\nb = b'x' * (512 << 20)" % tag], policy="short")
        rec = r.finish(timeout=30)
        self.assertEqual((rec["ended_by"], rec["end_reason"]), ("limit", "memory_limit"), rec)
        self.assertTrue(wait_gone(tag, 1), "a child of an OOM-killed session outlived it")

    def test_the_command_starts_with_every_signal_default(self):
        # As the engine starts a sandbox's first process: nothing ignored,
        # nothing blocked (its keeper, a Python program, ignores SIGPIPE
        # and SIGXFSZ; a program that does not set its own sees that).
        r = self.raw(["grep", "^Sig[IB]", "/proc/self/status"], policy="grep")
        r.finish()
        self.assertEqual(r.out, b"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n")

    def test_the_record_says_how_the_command_ended(self):
        # The command's own status or signal (its keeper exits as it did),
        # and cancelled when the daemon ended it; the keeper says nothing.
        for script, want in (("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", ("exit", "signaled", None, 9)),
                             ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", ("exit", "signaled", None, 15)),
                             ("import sys\nsys.exit(42)", ("exit", "exited", 42, None))):
            rec = self.raw(["python3", "-c", script]).finish()
            self.assertEqual((rec["ended_by"], rec["end_reason"], rec["exit_code"], rec.get("signal")), want, rec)
        r = self.raw(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(60)"])
        self.assertTrue(r.read_until(lambda: b"up\n" in r.out))
        r.send(b"")
        kill = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        kill.connect(self.daemon.socket_path)
        kill.sendall(json.dumps({"v": 1, "id": "k", "type": "session_kill",
                                 "session_id": r.answer["session"]["session_id"]}).encode() + b"\n")
        kill.close()
        rec = r.finish()
        self.assertEqual((rec["ended_by"], rec["end_reason"]), ("operator", "cancelled"), rec)
        self.assertNotIn("its keeper says", self.daemon.log())

    def test_a_disconnect_kills_the_whole_tree_within_a_second(self):
        tag = "tsb-disc-" + uuid.uuid4().hex[:8]
        script = textwrap.dedent("""\
            import os, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(1000)', '%s'])
                os._exit(0)
            print('forked', flush=True)
            time.sleep(1000)
            """ % tag)
        r = self.raw(["python3", "-c", script])
        self.assertTrue(r.read_until(lambda: b"forked" in r.out))
        self.assertTrue(self._wait_marked(tag))
        r.close()
        t0 = time.monotonic()
        self.assertTrue(wait_gone(tag, 1.0), "a process of the session outlived its client by a second")
        self.assertLess(time.monotonic() - t0, 1.0)
        self.wait_no_session()

    def test_a_half_close_keeps_the_session_and_a_full_close_ends_it(self):
        tag = "tsb-half-" + uuid.uuid4().hex[:8]
        r = self.raw(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(1000)\n# " + tag])
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        r.end_stdin()
        time.sleep(0.6)
        self.assertTrue(marked(tag), "a half-close is not going away")
        r.close()
        self.assertTrue(wait_gone(tag, 1.0))

    def test_a_command_that_never_reads_stdin_still_talks(self):
        # The client writes megabytes the command never reads; its output
        # still comes, and the daemon holds neither side's bytes unbounded.
        r = self.raw(["python3", "-c", "import time\nwhile True:\n    print('alive', flush=True)\n    time.sleep(0.1)"])
        stop = threading.Event()

        def flood():
            r.sock.settimeout(0.2)
            while not stop.is_set():
                try:
                    r.sock.send(b"z" * 65536)
                except (socket.timeout, BlockingIOError):
                    pass
                except OSError:
                    return
        t = threading.Thread(target=flood, daemon=True)
        t.start()
        try:
            n0 = r.out.count(b"alive")
            self.assertTrue(r.read_until(lambda: r.out.count(b"alive") >= n0 + 10, timeout=10))
        finally:
            stop.set()
            t.join(5)

    def test_a_client_that_does_not_read_holds_the_command_not_the_daemon(self):
        tag = "tsb-flood-" + uuid.uuid4().hex[:8]
        r = self.raw(["python3", "-c", "import os\nwhile True:\n    os.write(1, b'y' * 65536)\n# " + tag])
        self.assertTrue(self._wait_marked(tag))
        front = subprocess.run(["pgrep", "-f", "toolsandboxd-frontend --serve"], capture_output=True, text=True).stdout.split()
        rss = [int(open("/proc/%s/status" % p).read().split("VmRSS:")[1].split()[0]) for p in front]
        time.sleep(2)  # the command writes as fast as it can; nobody reads
        rss2 = [int(open("/proc/%s/status" % p).read().split("VmRSS:")[1].split()[0]) for p in front]
        self.assertTrue(all(b - a < 16 * 1024 for a, b in zip(rss, rss2)), (rss, rss2))
        r.close()
        self.assertTrue(wait_gone(tag, 1.0))

    # --- isolation --------------------------------------------------------------

    def test_sessions_see_neither_each_other_nor_the_host(self):
        a = self.raw(["python3", "-c", "import os,time\nopen('/tmp/mine','w').write('a')\n"
                                       "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), flush=True)\n"
                                       "time.sleep(30)"])
        self.assertTrue(a.read_until(lambda: b"]" in a.out))
        b = self.raw(["python3", "-c", "import os\nprint(os.path.exists('/tmp/mine'), os.path.exists('%s'), "
                                       "os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
                                       % self.tmp])
        b.finish()
        self.assertEqual(b.out.split(), [b"False", b"False", b"1000", b"0000000000000000"])
        self.assertLessEqual(len(json.loads(a.out)), 3, a.out)  # init, the command (and its launcher's exec)
        a.close()

    def test_bounds_per_organization(self):
        rs = [self.raw(["python3", "-c", "import time\ntime.sleep(30)"], org=ORG_FEW) for _ in range(2)]
        self.assertTrue(all(r.answer["ok"] for r in rs))
        third = self.raw(["python3", "-c", "pass"], org=ORG_FEW)
        self.assertEqual(third.answer["error"]["code"], "busy", third.answer)
        self.assertIn("max_sessions_per_organization", third.answer["error"]["message"])
        other = self.raw(["python3", "-c", "print(1)"])  # another organization is not held up
        self.assertEqual(other.finish()["exit_code"], 0)
        for r in rs:
            r.close()
        self.wait_no_session()
        # A run is never held up by sessions either.
        c = self.daemon.client()
        self.assertEqual(c.run_tool("def f():\n    return 1\n", tool_name="f", args={}, organization_id=ORG).status,
                         "success")

    # --- the real MCP SDK and reference servers ---------------------------------

    def sdk_client(self, server_args, steps, policy=None, env=None):
        """Runs the TypeScript SDK's stdio client (node, on the host) with
        `toolsandbox session -- node <server>` as its server command; `steps`
        is the body of an async function of `client`; returns its JSON."""
        opts = ["--socket", self.daemon.socket_path, "--org", ORG]
        if policy:
            opts += ["--policy", policy]
        for k, v in (env or {}).items():
            opts += ["--env", "%s=%s" % (k, v)]
        return run_sdk_client(self, self.tmp, opts, server_args, steps)

    def test_mcp_sdk_drives_server_everything(self):
        out = self.sdk_client([SERVERS + "/server-everything/dist/index.js", "stdio"], """
            const tools = await client.listTools();
            const echo = await client.callTool({ name: "echo", arguments: { message: "through the sandbox" } });
            const sum = await client.callTool({ name: tools.tools.some(t => t.name === "get-sum") ? "get-sum" : "add",
                                                arguments: { a: 2, b: 40 } });
            return { names: tools.tools.map(t => t.name), echo: echo.content, sum: sum.content };""")
        self.assertIn("echo", out["names"])
        self.assertIn("through the sandbox", json.dumps(out["echo"]))
        self.assertIn("42", json.dumps(out["sum"]))
        self.wait_no_session()

    def test_mcp_filesystem_server_sees_only_its_sandbox(self):
        secret = os.path.join(self.tmp, "host-secret.txt")
        with open(secret, "w") as f:
            f.write("host only")
        os.chmod(secret, 0o644)
        out = self.sdk_client([SERVERS + "/server-filesystem/dist/index.js", "/work"], """
            const call = (name, args) => client.callTool({ name, arguments: args });
            await call("write_file", { path: "/work/notes.txt", content: "in the sandbox" });
            const back = await call("read_text_file", { path: "/work/notes.txt" });
            const host = await call("read_text_file", { path: %s });
            const dirs = await call("list_allowed_directories", {});
            return { back: back.content, host: host, dirs: dirs.content };""" % json.dumps(secret))
        self.assertIn("in the sandbox", json.dumps(out["back"]))
        self.assertTrue(out["host"].get("isError"), out["host"])
        self.assertNotIn("host only", json.dumps(out["host"]))
        self.assertIn("/work", json.dumps(out["dirs"]))

    def test_mcp_memory_server_state_lasts_for_its_session_only(self):
        server = [SERVERS + "/server-memory/dist/index.js"]
        env = {"MEMORY_FILE_PATH": "/work/memory.jsonl"}
        out = self.sdk_client(server, """
            await client.callTool({ name: "create_entities", arguments: { entities: [
                { name: "toolsandbox", entityType: "project", observations: ["sandboxes MCP servers"] }] } });
            const g = await client.callTool({ name: "read_graph", arguments: {} });
            return g.content;""", env=env)
        self.assertIn("sandboxes MCP servers", json.dumps(out))
        again = self.sdk_client(server, """
            const g = await client.callTool({ name: "read_graph", arguments: {} });
            return g.content;""", env=env)
        self.assertNotIn("toolsandbox", json.dumps(again), "a new session starts from nothing")


class PythonClientSessions(unittest.TestCase):
    """The Python client's sessions (Client.open_session, AsyncClient's,
    toolsandbox_client.mcp_stdio.session_lines) speaking MCP's JSON-RPC to
    the reference servers."""

    @classmethod
    def setUpClass(cls):
        Sessions.setUpClass.__func__(cls)
        sys.path.insert(0, F.CLIENT_DIR)

    def rpc(self, i, method, params):
        return (json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode()

    def initialize(self):
        return self.rpc(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                          "clientInfo": {"name": "toolsandbox-tests", "version": "1"}}) + \
            (json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n").encode()

    def test_blocking_session_with_server_everything(self):
        from toolsandbox_client import Client, PolicyDeniedError
        c = Client(self.daemon.socket_path, timeout=30)
        with c.open_session(["node", SERVERS + "/server-everything/dist/index.js", "stdio"], organization_id=ORG) as s:
            self.assertEqual(s.command[0], "/usr/bin/node")
            s.write(self.initialize() + self.rpc(2, "tools/call", {"name": "echo", "arguments": {"message": "py"}}))
            out, replies = b"", []
            while len(replies) < 2:  # the server's notifications come between its replies
                kind, data = s.read(timeout=30)
                if kind == "stdout":
                    out += data
                    replies = [r for r in map(json.loads, out.splitlines()) if "id" in r]
            self.assertEqual([r["id"] for r in replies], [1, 2])
            self.assertIn("py", json.dumps(replies[1]["result"]))
            s.close_stdin()
            rec = s.wait(timeout=30)
        self.assertEqual((rec["ended_by"], rec["exit_code"]), ("exit", 0), rec)
        with self.assertRaises(PolicyDeniedError):
            c.open_session(["sh"], organization_id=ORG)

    def test_async_session_lines_with_server_memory(self):
        import asyncio
        import io
        from toolsandbox_client import AsyncClient
        from toolsandbox_client.mcp_stdio import session_lines

        async def go():
            c = AsyncClient(self.daemon.socket_path, timeout=30)
            s = await c.open_session(["node", SERVERS + "/server-memory/dist/index.js"], organization_id=ORG,
                                     env={"MEMORY_FILE_PATH": "/work/m.jsonl"})
            log = io.StringIO()
            await s.write(self.initialize() + self.rpc(2, "tools/call", {"name": "read_graph", "arguments": {}}))
            got = []
            async for line in session_lines(s, log):
                if "id" in json.loads(line):
                    got.append(json.loads(line))
                if len(got) == 2:
                    s.close_stdin()
            s.close()
            return got, s.record, log.getvalue()

        got, rec, log = asyncio.run(go())
        self.assertEqual([g["id"] for g in got], [1, 2])
        self.assertEqual(rec["ended_by"], "exit", rec)
        self.assertIn("Knowledge Graph MCP Server", log)


def _as_uid(uid, fn):
    """fn() in a child process of `uid` (and its group); its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(w, json.dumps(fn()).encode())
        except BaseException as e:  # noqa: B902 - the child never returns into the test runner
            os.write(w, json.dumps({"error": repr(e)}).encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


class SessionsForOperators(unittest.TestCase):
    """session_list and session_kill: uid 0's, not another peer's, even one
    the daemon allows."""

    NOBODY = 65534

    def test_list_and_kill(self):
        F.require_daemon()
        import grp
        d = F.Daemon(socket={"group": grp.getgrgid(self.NOBODY).gr_name, "mode": "0660"},
                     allowed_uids=[0, self.NOBODY])
        self.addCleanup(d.stop)
        d.start()
        path = d.socket_path

        def peer_asks():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(20)
            s.connect(path)
            s.sendall(b'{"v":1,"id":"l","type":"session_list"}\n')
            return json.loads(s.makefile().readline())
        answer = _as_uid(self.NOBODY, peer_asks)
        self.assertEqual(answer.get("error", {}).get("code"), "unauthorized", answer)
        self.assertIn("uid 0", answer["error"]["message"])

        r = Raw(path, ["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(1000)"], org="org-op")
        self.addCleanup(r.close)
        self.assertTrue(r.read_until(lambda: b"up\n" in r.out))  # (unbuffered: "up" and "\n" may come apart)
        sid = r.answer["session"]["session_id"]
        listed = subprocess.run([tsb_cli(), "session", "list", "--json", "--socket", path], capture_output=True,
                                text=True, timeout=20)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        [mine] = [x for x in json.loads(listed.stdout)["sessions"] if x["session_id"] == sid]
        self.assertEqual((mine["organization_id"], mine["program"], mine["peer_uid"], mine["bytes_out"]),
                         ("org-op", "/venv/bin/python3", 0, 3))
        self.assertNotIn("time.sleep", listed.stdout, "the arguments are not shown")
        table = subprocess.run([tsb_cli(), "session", "list", "--socket", path], capture_output=True, text=True,
                               timeout=20)
        self.assertIn(sid, table.stdout)
        killed = subprocess.run([tsb_cli(), "session", "kill", sid, "--socket", path], capture_output=True,
                                text=True, timeout=20)
        self.assertEqual(killed.returncode, 0, killed.stderr)
        rec = r.finish(timeout=10)
        self.assertEqual((rec["ended_by"], rec["end_reason"]), ("operator", "cancelled"), rec)
        again = subprocess.run([tsb_cli(), "session", "kill", sid, "--socket", path], capture_output=True,
                               text=True, timeout=20)
        self.assertEqual(again.returncode, 1)
        self.assertIn("no open session", again.stderr)


class SessionsAndTheDaemonsEnd(unittest.TestCase):
    """The daemon's stop ends every session (with its record); its death
    (SIGKILL) leaves no process of any session behind."""

    def start(self):
        F.require_daemon()
        d = F.Daemon(max_sessions=4, shutdown_grace="5s")
        d.start()
        self.addCleanup(d.stop)
        return d

    def test_shutdown_ends_sessions_with_their_record(self):
        d = self.start()
        tag = "tsb-stop-" + uuid.uuid4().hex[:8]
        r = Raw(d.socket_path, ["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(1000)\n# " + tag])
        self.addCleanup(r.close)
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        rec = r.finish(timeout=10)
        self.assertEqual(rec["ended_by"], "shutdown", rec)
        self.assertLess(time.monotonic() - t0, 3, "sessions get no grace")
        self.assertTrue(wait_gone(tag, 2))
        d.proc.wait(10)

    def test_sigkill_of_the_daemon_leaves_no_session_behind(self):
        d = self.start()
        tag = "tsb-kill-" + uuid.uuid4().hex[:8]
        r = Raw(d.socket_path, ["python3", "-c", "import os,time\nif os.fork()==0:\n    os.setsid()\n"
                                "print('up', flush=True)\ntime.sleep(1000)\n# " + tag])
        self.addCleanup(r.close)
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        self.assertTrue(marked(tag))
        d.proc.kill()
        d.proc.wait(10)
        self.assertTrue(wait_gone(tag, 3), "a session outlived the daemon")
        frames = []
        while (f := r.read_frame(5)) is not None:
            frames.append(f[0])
        self.assertNotIn(b"x", frames, "the client reads the end of the connection, without an end frame")


if __name__ == "__main__":
    unittest.main()
