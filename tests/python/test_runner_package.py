"""The runner as a package: isolate/runner/toolsandbox_runner.py, the program,
and its parts in isolate/runner/_toolsandbox_runner/, as the build installs
them (share/toolsandbox/runner of $TSB_BUILD, else build/).

    /usr/bin/python3 -m pytest tests/python/test_runner_package.py

What must hold:
  - the build tree holds every part with a checked-hash .pyc of its source
    beside it, and importing the runner from there compiles no source;
  - each mode imports the parts it runs: a cold channel run of a plain tool
    neither the Letta stand-ins nor the unpickler (a tool that declares
    agent_state the stand-ins, a pickle the unpickler), and no standard
    library module the one-file runner did not import; a warm runner has
    every part a run may use loaded before it says it is ready;
  - run as a script (an E2B cell), the runner finds its package beside it
    and leaves its directory off sys.path again;
  - in a sandbox of a real toolsandboxd, every part is imported from its
    bytecode (needs root, see daemon_fixture.py: skipped otherwise, failed
    under CI=true).
"""

import base64
import glob
import importlib.util
import json
import os
import pickle
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import daemon_fixture as F  # noqa: E402

SOURCE = os.path.join(F.REPO, "isolate", "runner")
PACKAGE = "_toolsandbox_runner"
PYTHON = "/usr/bin/python3"
FLAGS = ["-I", "-S", "-B", "-u", "-X", "utf8"]
TIMEOUT = 60
ADD_TOOL = "def add(a, b):\n    return a + b\n"
STATE_TOOL = "def f(agent_state):\n    return agent_state.id\n"
# What a cold channel run of a plain tool imports of the runner.
COLD_PARTS = {"toolsandbox_runner", PACKAGE} | {PACKAGE + "." + p for p in
                                                ("base", "request", "tool", "channel", "lean_exit")}
# Standard library modules the one-file runner never imported on that path
# (its cold start imported json, os, stat, struct and sys).
NEVER_COLD = ("ctypes", "pickle", "base64", "hashlib", "ast", "select", "signal", "importlib.util", "inspect",
              "copy", "uuid", "datetime", "decimal", "dataclasses", "asyncio", "_compat_pickle")


def build_dir():
    return os.environ.get("TSB_BUILD") or os.path.join(F.REPO, "build")


def installed():
    """The runner's directory in the build tree; skips when it is not built."""
    d = os.path.join(build_dir(), "share", "toolsandbox", "runner")
    if not os.path.isfile(os.path.join(d, "toolsandbox_runner.py")):
        raise unittest.SkipTest("no runner in %s (build the tree, or set TSB_BUILD)" % d)
    return d


def runner_files():
    """The runner's modules, relative to isolate/runner: the program, then its package."""
    parts = sorted(os.path.relpath(p, SOURCE) for p in glob.glob(os.path.join(SOURCE, PACKAGE, "*.py")))
    return ["toolsandbox_runner.py"] + parts


def module_name(rel):
    name = rel[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def part(obj):
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def boot(directory, entry):
    return "import sys\nsys.path.append(%r)\nimport toolsandbox_runner\ntoolsandbox_runner.%s()\n" % (directory, entry)


def imported(stderr):
    """The modules -X importtime names, in import order."""
    return [m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", stderr, re.M)]


def channel_run(directory, first, second, pooled=False):
    """(result, stderr) of the runner in channel mode (pooled: a warm one,
    with its hand-over), under -X importtime."""
    ours, theirs = socket.socketpair()
    with tempfile.TemporaryDirectory() as cwd, ours:
        with theirs:
            proc = subprocess.Popen([PYTHON, *FLAGS, "-X", "importtime", "-c",
                                     boot(directory, "run_pooled" if pooled else "run_channel")],
                                    stdin=theirs, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
        ours.settimeout(TIMEOUT)
        if pooled:
            assert ours.recv(11, socket.MSG_WAITALL) == b"TSB1 ready\n"
            ours.sendall(part({"environ": {}}))
        ours.sendall(part(first))
        ours.recv(19, socket.MSG_WAITALL)
        ours.sendall(part(second))
        ours.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := ours.recv(1 << 16):
            chunks.append(chunk)
        _, err = proc.communicate(timeout=TIMEOUT)
    return json.loads(b"".join(chunks)), err.decode()


class BuiltRunner(unittest.TestCase):
    """The build tree's runner, outside any sandbox."""

    def test_every_module_is_built_with_its_checked_hash_bytecode(self):
        d = installed()
        files = runner_files()
        self.assertIn(PACKAGE + "/__init__.py", files)
        shown = sorted(os.path.relpath(p, d) for p in glob.glob(os.path.join(d, PACKAGE, "*.py")))
        self.assertEqual(["toolsandbox_runner.py"] + shown, files, "the build tree's package is not the source's")
        for rel in files:
            with open(os.path.join(SOURCE, rel), "rb") as f:
                source = f.read()
            with open(os.path.join(d, rel), "rb") as f:
                self.assertEqual(f.read(), source, rel)
            pyc = importlib.util.cache_from_source(os.path.join(d, rel))
            self.assertTrue(os.path.isfile(pyc), pyc)
            with open(pyc, "rb") as f:
                head = f.read(16)
            self.assertEqual(head[:4], importlib.util.MAGIC_NUMBER, pyc)
            self.assertEqual(int.from_bytes(head[4:8], "little"), 0b11, "%s: not a checked-hash .pyc" % pyc)
            self.assertEqual(head[8:16], importlib.util.source_hash(source), "%s: not of its source" % pyc)

    def test_importing_every_module_compiles_no_source(self):
        d = installed()
        names = [module_name(rel) for rel in runner_files()]
        code = "import sys\nsys.path.append(%r)\n" % d + "".join("import %s\n" % n for n in names)
        err = subprocess.run([PYTHON, *FLAGS, "-v", "-c", code], capture_output=True, text=True,
                             timeout=TIMEOUT).stderr
        for rel in runner_files():
            pyc = importlib.util.cache_from_source(os.path.join(d, rel))
            self.assertIn("# code object from %r\n" % pyc, err, rel)
            self.assertNotIn("# code object from %s\n" % os.path.join(d, rel), err, rel)


class PartsPerMode(unittest.TestCase):
    """Each mode imports what it runs (-X importtime of the runner)."""

    def runner_parts(self, err):
        return {m for m in imported(err) if m == "toolsandbox_runner" or m.startswith(PACKAGE)}

    def test_a_cold_channel_run_imports_what_it_runs(self):
        d = installed()
        result, err = channel_run(d, {"tool_name": "add", "source_code": ADD_TOOL}, {"args": {"a": 2, "b": 3}})
        self.assertEqual(result["results"], 5)
        self.assertEqual(self.runner_parts(err), COLD_PARTS)
        for name in NEVER_COLD:
            self.assertNotIn(name, imported(err))

    def test_the_stand_ins_and_the_unpickler_when_a_run_needs_them(self):
        d = installed()
        result, err = channel_run(d, {"tool_name": "f", "source_code": STATE_TOOL}, {"agent_state": {"id": "a-1"}})
        self.assertEqual(result["results"], "a-1")
        self.assertEqual(self.runner_parts(err), COLD_PARTS | {PACKAGE + ".letta_models"})
        payload = base64.b64encode(pickle.dumps({"results": [1], "agent_state": None})).decode()
        result, err = channel_run(d, {"unpickle": payload}, {})
        self.assertEqual(result["results"], [1])
        self.assertEqual(self.runner_parts(err), COLD_PARTS | {PACKAGE + ".unpickler"})

    def test_a_warm_runner_loads_what_most_runs_use_and_the_rest_when_a_run_needs_it(self):
        # Every part but the nonce mode's and the two a run seldom needs
        # (agent_state's stand-ins, the unpickler): a warm sandbox does not
        # pay for those ahead; a run that needs one imports it, as cold.
        d = installed()
        result, err = channel_run(d, {"tool_name": "add", "source_code": ADD_TOOL}, {"args": {"a": 2, "b": 3}},
                                  pooled=True)
        self.assertEqual(result["results"], 5)
        every = {module_name(rel) for rel in runner_files()}
        rare = {PACKAGE + ".letta_models", PACKAGE + ".unpickler"}
        self.assertEqual(self.runner_parts(err), every - {PACKAGE + ".nonce"} - rare)
        # The hand-over's prctl through _ctypes, not the ctypes package.
        self.assertIn("_ctypes", imported(err))
        self.assertNotIn("ctypes", imported(err))
        result, err = channel_run(d, {"tool_name": "f", "source_code": STATE_TOOL}, {"agent_state": {"id": "a-1"}},
                                  pooled=True)
        self.assertEqual(result["results"], "a-1")
        self.assertEqual(self.runner_parts(err), every - {PACKAGE + ".nonce", PACKAGE + ".unpickler"})

    def test_a_warm_script_imports_only_its_hand_over(self):
        # Script mode's pooled launcher (daemon/compile/spawn_policy.cc,
        # script_launcher(true)) up to the script: none of the channel mode,
        # the tool's process or ctypes, which a cold script never imports.
        d = installed()
        code = ("import sys\nsys.path.insert(0, %r)\nimport toolsandbox_runner\n"
                "source, watch = toolsandbox_runner.await_script()\nprint(source.decode())\n" % d)
        ours, theirs = socket.socketpair()
        with tempfile.TemporaryDirectory() as cwd, ours:
            with theirs:
                proc = subprocess.Popen([PYTHON, "-X", "importtime", "-c", code], stdin=theirs,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
            ours.settimeout(TIMEOUT)
            self.assertEqual(ours.recv(11, socket.MSG_WAITALL), b"TSB1 ready\n")
            ours.sendall(part({"environ": {"TSB_PART_TEST": "1"}}) + b"print('hi')\n")
            ours.shutdown(socket.SHUT_WR)
            out, err = proc.communicate(timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(out, b"print('hi')\n\n")
        names = imported(err.decode())
        self.assertEqual(self.runner_parts(err.decode()),
                         {"toolsandbox_runner", PACKAGE} | {PACKAGE + "." + p for p in ("base", "lean_exit", "warm")})
        self.assertIn("_ctypes", names)
        self.assertNotIn("ctypes", names)

    def test_a_warm_script_s_environment_outlives_the_runner_s_modules(self):
        # The launcher forgets the runner's modules once the script is in
        # (daemon/compile/spawn_policy.cc, script_launcher(true)); a
        # collection then, and memory used again, must leave the block
        # /proc/self/environ shows as the hand-over made it.
        d = installed()
        code = ("import sys\nsys.path.insert(0, %r)\nimport toolsandbox_runner\n"
                "del sys.path[0], sys.modules['toolsandbox_runner']\n"
                "source, watch = toolsandbox_runner.await_script()\ndel toolsandbox_runner\n"
                "for name in [n for n in sys.modules if n.partition('.')[0] == '_toolsandbox_runner']:\n"
                "    del sys.modules[name]\n"
                "import gc\ngc.collect()\njunk = [bytes([7]) * 300 for _ in range(20000)]\n"
                "sys.stdout.buffer.write(open('/proc/self/environ', 'rb').read())\n" % d)
        ours, theirs = socket.socketpair()
        with tempfile.TemporaryDirectory() as cwd, ours:
            with theirs:
                proc = subprocess.Popen([PYTHON, "-c", code], stdin=theirs, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, cwd=cwd, env={"A": "1"})
            ours.settimeout(TIMEOUT)
            self.assertEqual(ours.recv(11, socket.MSG_WAITALL), b"TSB1 ready\n")
            ours.sendall(part({"environ": {"TSB_PART_TEST": "x" * 300}}) + b"pass\n")
            ours.shutdown(socket.SHUT_WR)
            out, err = proc.communicate(timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(out, b"A=1\0TSB_PART_TEST=" + b"x" * 300 + b"\0")

    def test_the_hand_over_s_environment_with_and_without_ctypes(self):
        # The environment /proc/self/environ shows after a hand-over, set
        # through _ctypes, and through the ctypes package where _ctypes
        # lacks what the short way uses.
        d = installed()
        for cut in ("", "import _ctypes\ndel _ctypes.dlsym\n"):
            code = (cut + "import sys\nsys.path.insert(0, %r)\nfrom _toolsandbox_runner.warm import _Environ\n"
                    "_Environ().adopt({'environ': {'TSB_PART_TEST': 'a b'}})\n"
                    "print('ctypes' in sys.modules, open('/proc/self/environ', 'rb').read().split(b'\\0')[-2])\n"
                    % d)
            proc = subprocess.run([PYTHON, "-I", "-S", "-c", code], capture_output=True, timeout=TIMEOUT,
                                  env={"A": "1"})
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(proc.stdout, b"%s b'TSB_PART_TEST=a b'\n" % (b"True" if cut else b"False"))

    def test_the_nonce_mode_imports_no_part_of_the_channel(self):
        d = installed()
        nonce = "ab" * 16
        req = {"nonce": nonce, "tool_name": "add", "source_code": ADD_TOOL, "args": {"a": 2, "b": 3}}
        with tempfile.TemporaryDirectory() as cwd:
            proc = subprocess.run([PYTHON, *FLAGS, "-X", "importtime", "-c", boot(d, "run")],
                                  input=json.dumps(req).encode(), capture_output=True, cwd=cwd, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(b"<<TSB-RESULT-" + nonce.encode(), proc.stdout)
        self.assertEqual(self.runner_parts(proc.stderr.decode()),
                         {"toolsandbox_runner", PACKAGE} | {PACKAGE + "." + p for p in ("base", "request", "tool",
                                                                                       "nonce", "lean_exit")})


class AsAScript(unittest.TestCase):
    """python3 -I -S ... toolsandbox_runner.py, as an E2B cell runs it: the
    program and its package copied to a directory of their own."""

    def test_the_package_is_found_beside_it_and_the_directory_leaves_sys_path(self):
        with tempfile.TemporaryDirectory() as top, tempfile.TemporaryDirectory() as cwd:
            for rel in runner_files():
                os.makedirs(os.path.join(top, os.path.dirname(rel)), exist_ok=True)
                shutil.copyfile(os.path.join(SOURCE, rel), os.path.join(top, rel))
            nonce = "cd" * 16
            src = "import sys\ndef f():\n    return [p for p in sys.path if p.startswith(%r)]\n" % top
            req = {"nonce": nonce, "tool_name": "f", "source_code": src}
            proc = subprocess.run([PYTHON, *FLAGS, os.path.join(top, "toolsandbox_runner.py")],
                                  input=json.dumps(req).encode(), capture_output=True, cwd=cwd, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        frame = re.search(rb"<<TSB-RESULT-" + nonce.encode() + rb">>([A-Za-z0-9+/=]*)<<TSB-END-", proc.stdout)
        self.assertIsNotNone(frame, proc.stdout)
        self.assertEqual(json.loads(base64.b64decode(frame.group(1))), {"results": [], "agent_state": None})


# In a sandbox: its own runner's modules, and every part in a fresh
# interpreter (python -v), imported from bytecode that matches its source.
BYTECODE_TOOL = r'''
import importlib.util, os, subprocess, sys

def check() -> dict:
    own = {}
    for name, m in sorted(sys.modules.items()):
        if name == "toolsandbox_runner" or name.startswith("_toolsandbox_runner"):
            with open(m.__file__, "rb") as f:
                source = f.read()
            try:
                with open(m.__cached__, "rb") as f:
                    head = f.read(16)
            except OSError:
                head = b""
            own[name] = [m.__file__, head[4:8] == b"\3\0\0\0" and head[8:16] == importlib.util.source_hash(source)]
    root = "/opt/toolsandbox/runner"
    files = ["toolsandbox_runner.py"] + sorted("_toolsandbox_runner/" + n for n in os.listdir(root + "/_toolsandbox_runner")
                                               if n.endswith(".py"))
    names = [f[:-3].replace("/", ".").replace(".__init__", "") for f in files]
    code = "import sys\nsys.path.append(%r)\n" % root + "".join("import %s\n" % n for n in names)
    err = subprocess.run([sys.executable, "-I", "-S", "-B", "-v", "-c", code], capture_output=True, text=True).stderr
    loaded = [line[len("# code object from "):] for line in err.splitlines() if line.startswith("# code object from ")]
    return {"own": own, "files": files, "loaded": [l for l in loaded if root in l]}
'''


class InASandbox(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = F.start_daemon(cls)

    def check(self, warm):
        if warm:
            self.daemon.wait_for(lambda st: any(p["policy"] == "default" and p["mode"] == "run_tool" and p["warm"] > 0
                                                for p in st["warm_pool"]["pools"]), 30, "a warm sandbox of run_tool")
        r = self.daemon.client().run_tool(BYTECODE_TOOL, tool_name="check", args={}, organization_id="org-runner-package",
                                          env={} if warm else {"TZ": "UTC"})  # TZ: never warm
        self.assertEqual(r.status, "success", r.stderr)
        self.assertEqual(r.record["warm"], warm, r.record)
        got = r.func_return
        self.assertEqual(got["files"], runner_files(), "the sandbox's runner is not the source's")
        every = {module_name(rel) for rel in runner_files()}
        rare = {PACKAGE + ".letta_models", PACKAGE + ".unpickler"}  # loaded by a run that needs them
        self.assertEqual(set(got["own"]), every - {PACKAGE + ".nonce"} - rare if warm else COLD_PARTS)
        for name, (path, from_bytecode) in got["own"].items():
            self.assertTrue(path.startswith("/opt/toolsandbox/runner/"), path)
            self.assertTrue(from_bytecode, "%s: no bytecode of its source in the sandbox" % name)
        expected = ["'%s'" % importlib.util.cache_from_source("/opt/toolsandbox/runner/" + rel) for rel in got["files"]]
        self.assertEqual(sorted(got["loaded"]), sorted(expected), "a part was compiled from its source in the sandbox")

    def test_every_part_comes_from_its_bytecode_cold(self):
        self.check(warm=False)

    def test_every_part_comes_from_its_bytecode_warm(self):
        self.check(warm=True)


class EndNote(unittest.TestCase):
    """lean_exit._exit in a warm sandbox's runner (isolate/init/init.cc, "end
    note"), outside any sandbox: the program gets a pipe as fd 3, as init
    gives it, and the test reads what arrives there."""

    def note(self, body):
        """(the bytes the pipe got, the program's exit status) for `body`,
        run after _take_end_note."""
        r, w = os.pipe()
        code = ("import os, sys\nos.dup2(%d, 3)\nos.close(%d)\nsys.path.insert(0, %r)\n"
                "from _toolsandbox_runner import lean_exit\nlean_exit._take_end_note()\n" % (w, w, SOURCE)) + body
        proc = subprocess.Popen([PYTHON, *FLAGS, "-c", code], pass_fds=(w,), stdout=subprocess.DEVNULL)
        os.close(w)
        with os.fdopen(r, "rb") as pipe:
            got = pipe.read()
        return got, proc.wait(timeout=TIMEOUT)

    def test_the_status_goes_on_the_note_after_every_other_descriptor_is_closed(self):
        body = ("other = os.open('/dev/null', os.O_RDONLY)\n"
                "os.set_inheritable(other, True)\n"
                "import atexit\n"
                "atexit.register(lambda: None)\n"
                "def gone(fd):\n"
                "    try:\n"
                "        os.fstat(fd)\n"
                "        return False\n"
                "    except OSError:\n"
                "        return True\n"
                "real_write = os.write\n"
                "def checked(fd, data):\n"
                "    assert fd == lean_exit._end_note[0] and all(gone(n) for n in (0, 1, 2, other)), 'open'\n"
                "    return real_write(fd, data)\n"
                "os.write = checked\n"
                "lean_exit._exit(5)\n")
        self.assertEqual(self.note(body), (b"\x05", 5))

    def test_a_forked_child_writes_no_note(self):
        body = ("pid = os.fork()\n"
                "if pid == 0:\n"
                "    lean_exit._exit(3)\n"
                "os.waitpid(pid, 0)\n"
                "lean_exit._exit(4)\n")
        self.assertEqual(self.note(body), (b"\x04", 4))

    def test_no_byte_lands_in_a_file_opened_under_the_note_s_number(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "f")
            body = ("f = os.open(%r, os.O_WRONLY | os.O_CREAT, 0o600)\n"
                    "os.dup2(f, lean_exit._end_note[0])  # the note's number now names the file\n"
                    "lean_exit._exit(6)\n" % path)
            self.assertEqual(self.note(body), (b"", 6))
            with open(path, "rb") as f:
                self.assertEqual(f.read(), b"")


if __name__ == "__main__":
    unittest.main()
