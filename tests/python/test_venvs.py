"""Per-tool venvs end to end: a daemon whose policies install packages from a
local wheel directory (wheels this test writes), its venv cache, and runs
that ask for pip requirements (daemon/venv/cache.h, policies/README.md
"packages").

    sudo CI=true /usr/bin/python3 -m pytest -q tests/python/test_venvs.py

A package index over the network is tested in tests/egress (the index runs
in the test's own network namespace).
"""

import asyncio
import concurrent.futures
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import daemon_fixture as F  # noqa: E402
from toolsandbox_client import errors as E  # noqa: E402
from toolsandbox_client import letta as L  # noqa: E402
from wheels import make_wheel  # noqa: E402

REPO = F.REPO
ORG = "org-venvs"
IMPORT_TOOL = (
    "import sys\n\n"
    "def versions() -> dict:\n"
    "    import tsbtool, tsbdep\n"
    "    return {'tool': tsbtool.VALUE, 'dep': tsbdep.VALUE, 'prefix': sys.prefix}\n"
)

# What a package prints during a build: a forged log line, OSC and CSI
# sequences, BEL, CR, a C1 CSI and bytes that are not UTF-8.
PTH_NOISE = b"noise\n2024-01-01T00:00:00.000 info audit run_id=forged\x1b]0;pwned\x07\x1b[2J\r\xc2\x9b31m\xff\n"
# What a terminal takes as a control (newline aside).
TERMINAL_CONTROLS = [bytes([c]) for c in range(0x20) if c != 0x0A] + [b"\x7f", b"\xc2\x9b", b"\xff"]

# A name that would forge a log line and drive a terminal.
PTH_FIFO = "fifo\n2024-01-01 00:00:00 [info] audit: allowed\x1b[2J\x1b]0;pwned\x07"


def front_end_user():
    for name in ("toolsandboxd",):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    raise unittest.SkipTest("no toolsandboxd user (the set-up of scripts/start.sh or scripts/test.sh creates it)")


def write_policies(tmp, wheels, hang_wheels, build_timeout="120s"):
    """default: installs from `wheels`; nopkgs: installs nothing; hang: its
    wheel directory holds a FIFO, so pip blocks reading it."""
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)
    base = os.path.join(REPO, "policies", "default.json")

    def write(name, extra):
        doc = {"version": 1, "include": base, **extra}
        with open(os.path.join(pol, name + ".json"), "w") as f:
            json.dump(doc, f)

    write("default", {"packages": {"allow": ["tsb*"], "max_requirements": 4, "wheels": wheels,
                                   "build": {"wall_timeout": build_timeout}}})
    write("nopkgs", {"packages": None})
    write("hang", {"packages": {"allow": ["*"], "wheels": hang_wheels, "build": {"wall_timeout": "4s"}}})
    orgs = {"version": 1,
            "default": {"privileged": False, "policy": "default", "allowed_policies": ["default"]},
            "organizations": {"org-nopkgs": {"policy": "nopkgs", "allowed_policies": ["nopkgs"]},
                              "org-hang": {"policy": "hang", "allowed_policies": ["hang"]}}}
    with open(os.path.join(pol, "organizations.json"), "w") as f:
        json.dump(orgs, f)
    return pol


def pip_available():
    return subprocess.run(["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True).returncode == 0


class VenvDaemon:
    """A temporary tree (wheels, policies, cache) and a daemon over it."""

    def __init__(self, test_class, max_bytes=None, big=False):
        F.require_daemon()
        if not pip_available():
            raise AssertionError("the system's pip is missing (scripts/lib.sh installs python3-pip)")
        user = front_end_user()
        self.tmp = tempfile.mkdtemp(prefix="tsb-venvs-")
        test_class.addClassCleanup(shutil.rmtree, self.tmp, True)
        os.chmod(self.tmp, 0o755)
        self.wheels = os.path.join(self.tmp, "wheels")
        os.mkdir(self.wheels)
        make_wheel(self.wheels, "tsbdep", "2.0")
        make_wheel(self.wheels, "tsbdep", "1.0")
        make_wheel(self.wheels, "tsbtool", "1.5", requires=["tsbdep>=2"])
        make_wheel(self.wheels, "tsbother", "3.0")
        # A wheel that tries to choose the interpreter the runner's parent
        # (which holds the nonce) starts from: a pyvenv.cfg at the venv's
        # root and a ._pth file beside bin/python3 (both still let pip
        # freeze work, so only the daemon's refusal keeps them out).
        ver = "python%d.%d" % sys.version_info[:2]
        make_wheel(self.wheels, "tsbevil", "1.0", modules={
            "tsbevil/__init__.py": "VALUE = 'evil'\n",
            "tsbevil-1.0.data/data/pyvenv.cfg": "home = /usr/bin\ninclude-system-site-packages = true\nevil = yes\n",
            "tsbevil-1.0.data/scripts/%s._pth" % "python3": "/usr/lib/%s.zip\n/usr/lib/%s\n/usr/lib/%s/lib-dynload\n"
            "/venv/lib/%s/site-packages\n/venv/evil\n" % (ver.replace(".", ""), ver, ver, ver),
        })
        # A wheel whose .pth file, run by `pip freeze` in the build sandbox,
        # writes a forged log line, terminal sequences and bytes that are
        # not UTF-8 on pip's stderr, and fails the freeze.
        make_wheel(self.wheels, "tsbpthnoise", "1.0", modules={
            "tsbpthnoise.pth": "import os; os.write(2, %r); os._exit(1)\n" % PTH_NOISE})
        # A wheel whose .pth file, run by `pip freeze` in the build sandbox,
        # leaves a FIFO with a hostile name in the venv.
        make_wheel(self.wheels, "tsbpthfifo", "1.0", modules={
            "tsbpthfifo/__init__.py": "VALUE = 'fifo'\n",
            "tsbpthfifo.pth": "import os, sys; p = os.path.join(sys.prefix, %r); os.path.lexists(p) or os.mkfifo(p)\n"
                              % PTH_FIFO})
        if big:
            # Three venvs of about 6 MiB each (incompressible data).
            for name in ("tsbbiga", "tsbbigb", "tsbbigc"):
                make_wheel(self.wheels, name, "1.0", modules={
                    name + "/__init__.py": "VALUE = %r\n" % name,
                    name + "/blob.bin": os.urandom(6 << 20).hex()[: 6 << 20]})
        self.hang_wheels = os.path.join(self.tmp, "hang-wheels")
        os.mkdir(self.hang_wheels)
        os.mkfifo(os.path.join(self.hang_wheels, "tsbfifo-1.0-py3-none-any.whl"), 0o644)
        for d in (self.wheels, self.hang_wheels):
            for n in os.listdir(d):
                os.chmod(os.path.join(d, n), 0o644)
        self.cache = os.path.join(self.tmp, "venvs")
        os.mkdir(self.cache, 0o755)
        os.chown(self.cache, user.pw_uid, user.pw_gid)
        policies = write_policies(self.tmp, self.wheels, self.hang_wheels)
        venvs = {"cache_dir": self.cache}
        if max_bytes:
            venvs["max_bytes"] = max_bytes
        self.daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"),
                               venvs=venvs)
        test_class.addClassCleanup(self.daemon.stop)
        self.daemon.start()

    def listing(self):
        return sorted(os.listdir(self.cache))

    def keys(self):
        return sorted(n for n in self.listing() if len(n) == 64)


def run_tool(client, source, name, reqs=None, org=ORG, sandbox_reqs=None, **kw):
    sc = None
    if sandbox_reqs is not None:
        sc = {"type": "local", "config": {"pip_requirements": sandbox_reqs, "use_venv": False}}
    return client.run_tool(source, tool_name=name, args={}, organization_id=org, pip_requirements=reqs,
                           sandbox_config=sc, **kw)


class Venvs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.v = VenvDaemon(cls)
        cls.client = cls.v.daemon.client()

    def test_build_once_then_reuse(self):
        r1 = run_tool(self.client, IMPORT_TOOL, "versions", ["tsbtool"])
        self.assertEqual(r1.status, "success", r1)
        self.assertEqual(r1.func_return, {"tool": "tsbtool-from-the-test-index", "dep": "tsbdep-from-the-test-index",
                                          "prefix": "/venv"})
        v1 = r1.record["venv"]
        self.assertTrue(v1["built"])
        self.assertEqual(v1["requirements"], ["tsbtool"])
        self.assertGreater(v1["build_ms"], 0)
        key = v1["key"]
        self.assertIn(key, self.v.keys())
        manifest = json.load(open(os.path.join(self.v.cache, key + ".json")))
        self.assertEqual(manifest["requirements"], ["tsbtool"])
        self.assertIn("tsbtool==1.5", manifest["freeze"])
        self.assertIn("tsbdep==2.0", manifest["freeze"])
        self.assertGreater(manifest["bytes"], 0)
        self.assertEqual(manifest["policy"], "default")
        # The same set, spelled otherwise and split between the sandbox
        # config ({name, version} as Letta's local config stores it) and the
        # tool: the same venv, not built again.
        r2 = run_tool(self.client, IMPORT_TOOL, "versions", ["TSBTool"], sandbox_reqs=[{"name": "tsbtool", "version": None}])
        self.assertEqual(r2.status, "success", r2)
        self.assertEqual(r2.record["venv"]["key"], key)
        self.assertFalse(r2.record["venv"]["built"])
        self.assertFalse(any(n.startswith(".tmp-") for n in self.v.listing()))

    def test_concurrent_requests_build_once(self):
        before = self.client.status()["venvs"]["builds"]
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(run_tool, self.v.daemon.client(), IMPORT_TOOL.replace("tsbtool, ", "").replace(
                "'tool': tsbtool.VALUE, ", ""), "versions", ["tsbdep==2.0", "tsbother"]) for _ in range(4)]
            results = [f.result() for f in futs]
        for r in results:
            self.assertEqual(r.status, "success", r)
        self.assertEqual(len({r.record["venv"]["key"] for r in results}), 1)
        self.assertEqual(sum(r.record["venv"]["built"] for r in results), 1)
        self.assertEqual(self.client.status()["venvs"]["builds"], before + 1)

    def test_missing_and_conflicting_requirements_fail_clearly(self):
        before = set(self.v.keys())
        for reqs, words in ((["tsbmissing"], "tsbmissing"), (["tsbtool", "tsbdep<2"], "tsbdep")):
            r = run_tool(self.client, IMPORT_TOOL, "versions", reqs)
            self.assertEqual(r.status, "error", r)
            self.assertIn("Error executing function versions: RuntimeError", r.func_return)
            self.assertIn(words, r.func_return)
            self.assertEqual(r.record["detail"], "venv_build_failed")
            self.assertEqual(r.record["setup_stage"], "venv-build")
            self.assertEqual(r.record["end_reason"], "setup_failed")
            self.assertFalse(r.record["venv"]["built"])
            # pip's last lines are in stderr and in the record.
            self.assertIn(words, "\n".join(r.stderr))
            self.assertTrue(r.record["venv"]["log_tail"])
        self.assertEqual(set(self.v.keys()), before)
        self.assertFalse(any(n.startswith(".tmp-") for n in self.v.listing()))

    def test_refused_requirements(self):
        cases = [
            (["tsbdep @ https://example.invalid/tsbdep-2.0-py3-none-any.whl"], E.PolicyDeniedError),
            (["-e", "."], E.PolicyDeniedError),
            (["--index-url=http://x/"], E.PolicyDeniedError),
            (["/tmp/tsbdep.whl"], E.PolicyDeniedError),
            (["tsbdep; python_version > '3'"], E.BadRequestError),
            (["requests"], E.PolicyDeniedError),  # not in packages.allow
            (["tsba", "tsbb", "tsbc", "tsbd", "tsbe"], E.BadRequestError),  # max_requirements 4
        ]
        builds = self.client.status()["venvs"]["builds"]
        for reqs, exc in cases:
            with self.subTest(reqs=reqs), self.assertRaises(exc):
                run_tool(self.client, IMPORT_TOOL, "versions", reqs)
        self.assertEqual(self.client.status()["venvs"]["builds"], builds)
        # A policy without "packages" installs nothing, and says so.
        with self.assertRaisesRegex(E.PolicyDeniedError, "installs no packages"):
            run_tool(self.client, IMPORT_TOOL, "versions", ["tsbtool"], org="org-nopkgs")

    def test_hanging_build_is_killed(self):
        t0 = time.monotonic()
        r = run_tool(self.client, IMPORT_TOOL, "versions", ["tsbfifo"], org="org-hang")
        self.assertLess(time.monotonic() - t0, 60)
        self.assertEqual(r.status, "error", r)
        self.assertIn("longer than its limit (4s)", r.func_return)
        self.assertEqual(r.record["detail"], "venv_build_failed")
        self.assertFalse(any(n.startswith(".tmp-") for n in self.v.listing()))

    def test_a_fifo_left_in_the_venv_fails_the_build_with_its_name_escaped(self):
        # The builder refuses the FIFO without opening it (nothing waits for
        # a writer), and says which, escaped.
        t0 = time.monotonic()
        r = run_tool(self.client, IMPORT_TOOL, "versions", ["tsbpthfifo"])
        self.assertLess(time.monotonic() - t0, 100)
        self.assertEqual(r.status, "error", r)
        self.assertEqual(r.record["detail"], "venv_build_failed")
        self.assertIn("the build failed (exit status 3)", r.func_return)
        tail = r.record["venv"]["log_tail"]
        self.assertIn("venv build failed: %s is a FIFO: neither a file, a directory nor a link" % ascii(PTH_FIFO), tail)
        self.assertNotRegex(tail, "[\x00-\x09\x0b-\x1f\x7f]")
        self.assertFalse(any(n.startswith(".tmp-") for n in self.v.listing()))

    def test_venv_is_read_only(self):
        src = (
            "import os, sys\n\n"
            "def write() -> dict:\n"
            "    import tsbtool\n"
            "    out = {}\n"
            "    for p in (tsbtool.__file__, os.path.dirname(tsbtool.__file__) + '/new.py', '/venv/new'):\n"
            "        try:\n"
            "            open(p, 'a').close()\n"
            "            out[p] = 'written'\n"
            "        except OSError as e:\n"
            "            out[p] = e.errno\n"
            "    out['access'] = os.access(tsbtool.__file__, os.W_OK)\n"
            "    return out\n")
        r = run_tool(self.client, src, "write", ["tsbtool"])
        self.assertEqual(r.status, "success", r)
        self.assertFalse(r.func_return.pop("access"))
        for p, v in r.func_return.items():
            self.assertIn(v, (13, 30), p)  # EACCES or EROFS, never written

    def test_the_build_cannot_choose_the_interpreter(self):
        src = ("import os, sys\n\n"
               "def frame() -> dict:\n"
               "    import tsbevil\n"
               "    return {'cfg': open('/venv/pyvenv.cfg').read(), 'pth': os.path.exists('/venv/bin/python3._pth'),\n"
               "            'python3': os.readlink('/venv/bin/python3'), 'path': sys.path,\n"
               "            'real': os.path.realpath(sys.executable), 'value': tsbevil.VALUE}\n")
        r = run_tool(self.client, src, "frame", ["tsbevil"])
        self.assertEqual(r.status, "success", r)
        f = r.func_return
        self.assertEqual(f["value"], "evil")
        self.assertTrue(f["cfg"].startswith("home = /usr/bin\ninclude-system-site-packages = false\n"), f["cfg"])
        self.assertNotIn("evil", f["cfg"])
        self.assertFalse(f["pth"])
        self.assertEqual(f["python3"], "/usr/bin/python3")
        self.assertEqual(f["real"], os.path.realpath("/usr/bin/python3"))
        self.assertNotIn("/venv/evil", f["path"])
        # The manifest is the daemon's: pip freeze and the Python version
        # from the build, the rest its own.
        manifest = json.load(open(os.path.join(self.v.cache, r.record["venv"]["key"] + ".json")))
        self.assertIn("tsbevil==1.0", manifest["freeze"])
        self.assertEqual(manifest["requirements"], ["tsbevil"])

    def test_no_requirements_use_the_policy_venv(self):
        src = ("import sys\n\ndef where() -> dict:\n"
               "    try:\n        import tsbtool\n        found = True\n"
               "    except ImportError:\n        found = False\n"
               "    return {'prefix': sys.prefix, 'found': found}\n")
        r = run_tool(self.client, src, "where", [])
        self.assertEqual(r.status, "success", r)
        self.assertEqual(r.func_return, {"prefix": "/venv", "found": False})
        self.assertNotIn("venv", r.record)
        self.assertNotIn("pip_requirements_ignored", r.record)

    def test_script_mode_with_sandbox_config_requirements(self):
        script = "import tsbother\nprint(tsbother.VALUE)\n"
        r = self.client.execute(script, tool_name="script", organization_id=ORG,
                                sandbox_config={"type": "local", "config": {"pip_requirements": [{"name": "tsbother"}]}})
        self.assertEqual(r.record["end_reason"], "exited", r)
        self.assertIn("tsbother-from-the-test-index", "".join(r.stdout))
        self.assertEqual(r.record["venv"]["requirements"], ["tsbother"])

    def test_letta_adapter_pip_requirements(self):
        tool = SimpleNamespace(id="tool-00000000-0000-4000-8000-00000000000b", name="versions", source_code=IMPORT_TOOL,
                               json_schema={"name": "versions", "parameters": {"type": "object", "properties": {}}},
                               pip_requirements=[SimpleNamespace(name="tsbtool", version="1.5")])
        user = SimpleNamespace(id="user-1", organization_id=ORG)
        sb = L.ToolSandboxDaemonSandbox("versions", {}, user, tool_object=tool, socket_path=self.v.daemon.socket_path)
        r = asyncio.run(sb.run())
        self.assertEqual(r.status, "success", r)
        self.assertEqual(r.func_return["tool"], "tsbtool-from-the-test-index")

    def test_status(self):
        s = self.client.status()["venvs"]
        self.assertEqual(s["dir"], self.v.cache)
        self.assertIsNone(s.get("error"))
        self.assertGreaterEqual(s["max_bytes"], 1 << 30)


def cli(*args, check=True):
    exe = os.path.join(os.environ.get("TSB_BUILD", os.path.join(REPO, "build")), "bin", "toolsandbox")
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError("toolsandbox %s: %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


class Commands(unittest.TestCase):
    """toolsandbox venv build | list | show | gc."""

    @classmethod
    def setUpClass(cls):
        cls.v = VenvDaemon(cls)
        cls.client = cls.v.daemon.client()

    def test_build_list_show_gc(self):
        sock = self.v.daemon.socket_path
        built = cli("venv", "build", "tsbother", "TSBDEP==2.0", "--org", ORG, "--socket", sock)
        key = built.stdout.split()[0]
        self.assertEqual(len(key), 64, built.stdout)
        self.assertIn(" built in ", built.stdout)
        again = cli("venv", "build", "tsbdep==2.0", "tsbother", "--org", ORG, "--socket", sock)
        self.assertTrue(again.stdout.startswith(key + " cached"), again.stdout)
        # A tool asking for the same set runs in the venv built ahead.
        r = run_tool(self.client, "def v() -> str:\n    import tsbother\n    return tsbother.VALUE\n", "v",
                     ["tsbother", "tsbdep==2.0"])
        self.assertEqual(r.record["venv"]["key"], key)
        self.assertFalse(r.record["venv"]["built"])
        failed = cli("venv", "build", "tsbmissing", "--org", ORG, "--socket", sock, check=False)
        self.assertEqual(failed.returncode, 1)
        self.assertIn("tsbmissing", failed.stderr)
        # pip's output, with what a package printed, reaches the operator's
        # terminal escaped, lines kept; the daemon's log gets no raw byte.
        noisy = subprocess.run([os.path.join(os.environ.get("TSB_BUILD", os.path.join(REPO, "build")), "bin", "toolsandbox"),
                                "venv", "build", "tsbpthnoise", "--org", ORG, "--socket", sock], capture_output=True, timeout=300)
        self.assertEqual(noisy.returncode, 1, noisy)
        self.assertIn(b"noise\n2024-01-01T00:00:00.000 info audit run_id=forged\\u001B]0;pwned\\u0007\\u001B[2J\\r\\u009B31m",
                      noisy.stderr)
        self.assertIn(b"toolsandbox venv: the build failed: ", noisy.stderr)
        self.assertEqual([c for c in TERMINAL_CONTROLS if c in noisy.stdout + noisy.stderr], [], noisy.stderr)
        with open(self.v.daemon.log_path, "rb") as f:
            log = f.read()
        self.assertEqual([c for c in TERMINAL_CONTROLS if c in log], [], log)
        self.assertNotIn(b"\n2024-01-01T00:00:00.000 info audit run_id=forged", log)
        refused = cli("venv", "build", "requests", "--org", ORG, "--socket", sock, check=False)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("policy_denied", refused.stderr)

        listed = json.loads(cli("venv", "list", "--cache", self.v.cache, "--json").stdout)
        self.assertEqual(listed["dir"], self.v.cache)
        entry = [e for e in listed["venvs"] if e["key"] == key]
        self.assertEqual(len(entry), 1)
        self.assertEqual(entry[0]["requirements"], ["tsbdep==2.0", "tsbother"])
        self.assertFalse(entry[0]["in_use"])
        shown = json.loads(cli("venv", "show", key[:12], "--cache", self.v.cache).stdout)
        self.assertIn("tsbother==3.0", shown["freeze"])
        self.assertEqual(shown["path"], os.path.join(self.v.cache, key))
        self.assertEqual(cli("venv", "show", "nope1234", "--cache", self.v.cache, check=False).returncode, 1)
        self.assertEqual(cli("venv", "gc", "--all", "--max-bytes", "1MiB", check=False).returncode, 2)

        # gc --all while a run holds one venv: that one stays, the rest go;
        # the daemon then builds a removed one again.
        hold = "import time\n\ndef hold() -> str:\n    import tsbtool\n    time.sleep(6)\n    return tsbtool.VALUE\n"
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            held = ex.submit(run_tool, self.v.daemon.client(), hold, "hold", ["tsbtool"])
            deadline = time.monotonic() + 60
            while self.client.status()["venvs"]["in_use"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            listed = json.loads(cli("venv", "list", "--cache", self.v.cache, "--json").stdout)
            in_use = [e["key"] for e in listed["venvs"] if e["in_use"]]
            self.assertEqual(len(in_use), 1, listed)
            gc = json.loads(cli("venv", "gc", "--all", "--cache", self.v.cache, "--json").stdout)
            self.assertIn(key, gc["removed"])
            self.assertNotIn(in_use[0], gc["removed"])
            self.assertEqual(self.v.keys(), in_use)
            r = held.result()
        self.assertEqual(r.status, "success", r)
        r = run_tool(self.client, "def v() -> str:\n    import tsbother\n    return tsbother.VALUE\n", "v",
                     ["tsbother", "tsbdep==2.0"])
        self.assertEqual(r.status, "success", r)
        self.assertTrue(r.record["venv"]["built"])
        self.assertEqual(r.record["venv"]["key"], key)


class Eviction(unittest.TestCase):
    """A cache of 16 MiB and venvs of about 6 MiB: the least recently used
    venv no run holds goes; one in use never does."""

    @classmethod
    def setUpClass(cls):
        cls.v = VenvDaemon(cls, max_bytes="16MiB", big=True)
        cls.client = cls.v.daemon.client()

    def test_eviction_skips_a_venv_in_use(self):
        hold = ("import time\n\ndef hold(seconds: float) -> str:\n"
                "    import tsbbiga\n    time.sleep(seconds)\n"
                "    return open(tsbbiga.__file__.replace('__init__.py', 'blob.bin')).read(8)\n")
        use = "def use() -> str:\n    import {0}\n    return {0}.VALUE\n"
        a = run_tool(self.client, use.format("tsbbiga"), "use", ["tsbbiga"])
        self.assertEqual(a.status, "success", a)
        key_a = a.record["venv"]["key"]
        b = run_tool(self.client, use.format("tsbbigb"), "use", ["tsbbigb"])
        self.assertEqual(b.status, "success", b)
        key_b = b.record["venv"]["key"]
        # B is now the most recently used; A is held by a run while C is
        # built: A would be the one to go, but it is in use, so B goes.
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            held = ex.submit(self.client.run_tool, hold, tool_name="hold", args={"seconds": 8},
                             organization_id=ORG, pip_requirements=["tsbbiga"])
            F_deadline = time.monotonic() + 20
            while self.client.status()["venvs"]["in_use"] < 1 and time.monotonic() < F_deadline:
                time.sleep(0.05)
            c = run_tool(self.client, use.format("tsbbigc"), "use", ["tsbbigc"])
            self.assertEqual(c.status, "success", c)
            keys = self.v.keys()
            self.assertIn(key_a, keys)
            self.assertNotIn(key_b, keys)
            self.assertIn(c.record["venv"]["key"], keys)
            r = held.result()
        self.assertEqual(r.status, "success", r)
        self.assertEqual(len(r.func_return), 8)
        s = self.client.status()["venvs"]
        self.assertLessEqual(s["bytes"], 16 << 20)
        self.assertEqual(s["in_use"], 0)


if __name__ == "__main__":
    unittest.main()
