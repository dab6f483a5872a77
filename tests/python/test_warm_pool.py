"""Warm sandboxes (policies/README.md, "warm_pool") against a real toolsandboxd.

    /usr/bin/python3 -m unittest tests/python/test_warm_pool.py -v

What must hold:
  - a warm sandbox is used by one run and never again (a file one run leaves
    in its /tmp, a value it leaves in its interpreter and its run id are
    never the next one's);
  - no request data is in a warm sandbox before its hand-over: the waiting
    runners' environment is the policy's fixed one, and a secret a run was
    given is in no other sandbox's memory afterwards;
  - the wall-clock timeout and the CPU time count from the hand-over;
  - a reload ends every warm sandbox (the old pool drains);
  - a warm run shows what a cold one shows (os.environ, /proc/self/environ,
    a subprocess's environment, argv, __name__, exit status, output);
  - a burst larger than the pool runs cold, never fails.

Warm sandboxes are found from the host by their command line (the runner's
run_pooled or await_script) and read as root through /proc. Needs root (see
daemon_fixture.py): skipped otherwise, failed under CI=true.
"""

import json
import os
import re
import signal
import sys
import tempfile
import shutil
import time
import unittest
import uuid
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402

ORG = "org-warm-tests"
BASE = os.path.join(F.REPO, "policies", "default.json")

ENV_TOOL = (
    "import os, subprocess\n\n"
    "def env_view() -> dict:\n"
    "    proc = open('/proc/self/environ', 'rb').read().decode()\n"
    "    child = subprocess.run(['/usr/bin/env', '-0'], capture_output=True).stdout.decode()\n"
    "    return {'environ': dict(os.environ), 'proc': proc, 'child': child, 'pid': os.getpid()}\n"
)
MARK_TOOL = (
    "import builtins, os\n\n"
    "def mark(tag: str) -> dict:\n"
    "    seen = sorted(n for n in os.listdir('/tmp') if n.startswith('mark-'))\n"
    "    open('/tmp/mark-' + tag, 'w').close()\n"
    "    before = getattr(builtins, 'tsb_mark', None)\n"
    "    builtins.tsb_mark = tag\n"
    "    return {'seen': seen, 'before': before, 'pid': os.getpid()}\n"
)
SECRET_TOOL = "def keep(secret: str) -> int:\n    global KEPT\n    KEPT = secret * 4\n    return len(KEPT)\n"
SLEEP_TOOL = "import time\n\ndef nap(s: float) -> str:\n    time.sleep(s)\n    return 'rested'\n"
ADD_TOOL = "def add(a: int, b: int) -> int:\n    return a + b\n"
# The end note (docs/SECURITY.md, "Warm sandboxes"): what a tool sees of it
# and what it can do with it.
FDS_TOOL = (
    "import subprocess\n\n"
    "def fds() -> list:\n"
    "    ls = subprocess.run(['/bin/ls', '/proc/self/fd'], capture_output=True, text=True, close_fds=False)\n"
    "    return sorted(int(n) for n in ls.stdout.split())\n"
)
NOTE_TOOL = (
    "import os, sys, time\n\n"
    "def note(status: int) -> str:\n"
    "    os.write(sys.modules['_toolsandbox_runner.lean_exit']._end_note[0], bytes([status]))\n"
    "    time.sleep(30)\n"
    "    return 'not reached'\n"
)
FORK_SCRIPT = (
    "import os\n"
    "pid = os.fork()\n"
    "if pid:\n"
    "    os.waitpid(pid, 0)\n"
    "    print('parent', flush=True)\n"
    "else:\n"
    "    print('child', flush=True)\n"
)
# A script's own descriptors past stdio (the directory listdir opens
# left out): each one's kind and whether a program it starts inherits it.
FDS_SCRIPT = (
    "import fcntl, os, stat\n"
    "own = sorted(int(n) for n in os.listdir('/proc/self/fd') if int(n) > 2)\n"
    "seen = []\n"
    "for n in own:\n"
    "    try:\n"
    "        mode = os.fstat(n).st_mode\n"
    "    except OSError:\n"
    "        continue\n"
    "    seen.append((stat.S_ISFIFO(mode), bool(fcntl.fcntl(n, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)))\n"
    "print(seen)\n"
)
LINGER_TOOL = (
    "import subprocess\n\n"
    "def linger() -> str:\n"
    "    subprocess.Popen(['/bin/sh', '-c', 'sleep 20; echo late'])\n"
    "    print('early')\n"
    "    return 'done'\n"
)
SCRIPT_VIEW = (
    "import os, sys\n"
    "print(repr(sys.argv[0].startswith(os.getcwd() + '/tmp')), __name__, os.environ.get('WARM_VAR'))\n"
    "print('to stderr', file=sys.stderr)\n"
    "print(open('/proc/self/environ', 'rb').read().decode().count('WARM_VAR='))\n"
    "sys.exit(3)\n"
)


def write_policies(tmp):
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)

    def write(name, extra):
        with open(os.path.join(pol, name + ".json"), "w") as f:
            json.dump({"version": 1, "include": BASE, **extra}, f)

    allow = {"environment": {"allow": ["LETTA_*", "WARM_*", "PYTHONPATH", "TZ", "LC_*"]}}
    write("warm", {"warm_pool": {"max": 2, "min": 2, "idle": "300s"}, **allow})
    write("cold", {"warm_pool": {"max": 0, "min": 0}, **allow})  # the shipped default has a pool
    write("short", {"warm_pool": {"max": 1, "min": 1}, "limits": {"wall_timeout": "2s"}, **allow})
    # Its warm runners end at once (the interpreter is /bin/true): they are
    # lost before they are ready, and the pool pauses.
    write("broken", {"warm_pool": {"max": 1, "min": 1}, "interpreter": "/bin/true", "packages": None, **allow})
    orgs = {"version": 1, "default": {"privileged": False, "policy": "warm",
                                      "allowed_policies": ["warm", "cold", "short", "broken"]}}
    with open(os.path.join(pol, "organizations.json"), "w") as f:
        json.dump(orgs, f)
    return pol


def parent(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def descends_from(pid, ancestor):
    try:
        while pid > 1:
            pid = parent(pid)
            if pid == ancestor:
                return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def pooled_runners(daemon):
    """{pid: (mode, environ)} of every warm sandbox's waiting runner of `daemon`."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or not descends_from(int(name), daemon.proc.pid):
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmd = f.read()
            if b"run_pooled(" not in cmd and b"await_script()" not in cmd:
                continue
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        out[int(name)] = ("tool" if b"run_pooled(" in cmd else "script", env)
    return out


def memory_holds(pid, needle: bytes) -> bool:
    """Whether any readable mapping of `pid` holds `needle` (read as root)."""
    with open("/proc/%d/maps" % pid) as maps, open("/proc/%d/mem" % pid, "rb", 0) as mem:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if "r" not in line.split()[1] or hi - lo > (1 << 30):
                continue
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    return True
            except (OSError, ValueError, OverflowError):
                continue
    return False


def start(test_class, **config):
    """A daemon of the test class's own over write_policies' policies."""
    F.require_daemon()
    test_class.tmp = tempfile.mkdtemp(prefix="tsb-warm-")
    test_class.addClassCleanup(shutil.rmtree, test_class.tmp, True)
    os.chmod(test_class.tmp, 0o755)
    test_class.policies = write_policies(test_class.tmp)
    test_class.daemon = F.start_daemon(test_class, policies_dir=test_class.policies,
                                       organizations=os.path.join(test_class.policies, "organizations.json"), **config)


class WarmPool(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start(cls, max_concurrent_runs=8)
        cls.client = cls.daemon.client()

    def wait_warm(self, policy="warm", mode="run_tool", n=None):
        def ready(st):
            pools = [p for p in st["warm_pool"]["pools"] if p["policy"] == policy and p["mode"] == mode]
            return pools and pools[0]["warm"] >= (pools[0]["target"] if n is None else n) > 0
        return self.daemon.wait_for(ready, 30, "a ready warm pool of %s (%s)" % (policy, mode))

    def tool(self, src, name, args, policy="warm", **kw):
        return self.client.run_tool(src, tool_name=name, args=args, organization_id=ORG, policy=policy, **kw)

    def test_status_reports_the_pools(self):
        st = self.wait_warm()
        wp = st["warm_pool"]
        self.assertGreaterEqual(wp["warm"], 2)
        modes = {(p["policy"], p["mode"]) for p in wp["pools"]}
        self.assertIn(("warm", "run_tool"), modes)
        self.assertIn(("warm", "execute"), modes)
        self.assertNotIn("cold", {p["policy"] for p in wp["pools"]})
        hits = wp["hits"]
        self.assertEqual(self.tool(ADD_TOOL, "add", {"a": 2, "b": 3}).func_return, 5)
        self.assertEqual(self.daemon.status()["warm_pool"]["hits"], hits + 1)

    def test_a_warm_sandbox_is_never_used_twice(self):
        seen_runs = set()
        for i in range(5):
            self.wait_warm()
            r = self.tool(MARK_TOOL, "mark", {"tag": str(i)})
            self.assertEqual(r.status, "success", r.stderr)
            self.assertTrue(r.record["warm"], r.record)
            self.assertEqual(r.func_return["seen"], [], "a file of an earlier run is in this one's /tmp")
            self.assertIsNone(r.func_return["before"], "the interpreter of an earlier run ran this one")
            self.assertNotIn(r.record["run_id"], seen_runs)
            seen_runs.add(r.record["run_id"])

    def test_no_request_data_before_the_hand_over(self):
        self.wait_warm()
        self.wait_warm(mode="execute")
        waiting = pooled_runners(self.daemon)
        self.assertGreaterEqual(len(waiting), 4, waiting)
        fixed = None
        for pid, (mode, env) in waiting.items():
            names = sorted(v.split(b"=", 1)[0] for v in env.split(b"\0") if v)
            self.assertNotIn(b"LETTA_AGENT_ID", names)
            self.assertFalse([n for n in names if n.startswith(b"WARM_")], names)
            fixed = fixed or names
            self.assertEqual(names, fixed, "every waiting runner has the policy's fixed variables only")
        secret = "warm-secret-" + uuid.uuid4().hex
        r = self.tool(SECRET_TOOL, "keep", {"secret": secret}, env={"WARM_SECRET": secret}, agent_id="agent-" + secret)
        self.assertEqual(r.status, "success", r.stderr)
        self.assertTrue(r.record["warm"])
        # The sandboxes that waited beside it, and the ones made since, hold
        # nothing of it.
        left = pooled_runners(self.daemon)
        self.assertTrue(left)
        for pid in left:
            try:
                self.assertFalse(memory_holds(pid, secret.encode()), "warm sandbox %d holds another run's secret" % pid)
            except FileNotFoundError:
                pass  # handed over or ended meanwhile

    def test_a_warm_run_sees_what_a_cold_run_sees(self):
        self.wait_warm()
        env = {"WARM_A": "1", "WARM_B": "two words", "PYTHONPATH": "/nowhere"}
        warm = self.tool(ENV_TOOL, "env_view", {}, env=env, agent_id="agent-1")
        cold = self.tool(ENV_TOOL, "env_view", {}, policy="cold", env=env, agent_id="agent-1")
        self.assertEqual((warm.status, cold.status), ("success", "success"), (warm.stderr, cold.stderr))
        self.assertTrue(warm.record["warm"])
        self.assertFalse(cold.record["warm"])
        w, c = warm.func_return, cold.func_return
        self.assertEqual(w["environ"], c["environ"])
        self.assertEqual(w["proc"], c["proc"], "/proc/self/environ differs")
        self.assertEqual(w["child"], c["child"], "a subprocess's environment differs")
        self.assertIn("WARM_B=two words\0", w["proc"])
        self.assertNotIn("PYTHONPATH", w["proc"], "a variable that changes how a program starts is the tool's only")
        self.assertEqual(w["environ"]["PYTHONPATH"], "/nowhere")
        # Variables a program reads as it starts (the zone, the locale): a
        # warm interpreter started without them, so such a run is cold.
        for var in ({"TZ": "Asia/Tokyo"}, {"LC_ALL": "C.UTF-8"}):
            self.wait_warm()
            r = self.tool(ENV_TOOL, "env_view", {}, env=var)
            self.assertEqual(r.status, "success", r.stderr)
            self.assertFalse(r.record["warm"], var)

    def test_a_warm_run_s_record_counts_its_sandbox_s_start(self):
        # cpu_ms of a warm run is from its hand-over; what its sandbox used
        # before (the interpreter's start, the runner) is warm_start_cpu_ms,
        # which a cold run (its whole start in cpu_ms) does not have.
        for mode in ("run_tool", "execute"):
            self.wait_warm(mode=mode)
            runs = [self.tool(ADD_TOOL, "add", {"a": 1, "b": 2}, policy=p) if mode == "run_tool" else
                    self.client.execute("print(3)\n", tool_name="s", organization_id=ORG, policy=p)
                    for p in ("warm", "cold")]
            warm, cold = runs
            self.assertEqual((warm.status, cold.status), ("success", "success"), (warm.stderr, cold.stderr))
            self.assertTrue(warm.record["warm"])
            # An interpreter's start alone is several milliseconds of CPU,
            # and more than the run of a one-line tool after it.
            self.assertGreater(warm.record["warm_start_cpu_ms"], 1.0, warm.record)
            self.assertGreater(warm.record["warm_start_cpu_ms"], warm.record["cpu_ms"], warm.record)
            self.assertNotIn("warm_start_cpu_ms", cold.record)
            self.assertGreater(cold.record["cpu_ms"], 1.0, cold.record)

    def test_a_warm_script_runs_as_a_cold_one(self):
        self.wait_warm(mode="execute")
        env = {"WARM_VAR": "x"}
        runs = [self.client.execute(SCRIPT_VIEW, tool_name="s", organization_id=ORG, policy=p, env=env)
                for p in ("warm", "cold")]
        warm, cold = runs
        self.assertTrue(warm.record["warm"])
        self.assertFalse(cold.record["warm"])
        for r in runs:
            self.assertEqual(r.record["exit_code"], 3)
            self.assertEqual(r.stdout, ["True __main__ x\n1\n"])
            self.assertEqual(r.stderr, ["to stderr\n"])
        # A variable that changes how the interpreter starts: never warm.
        r = self.client.execute("import sys\nprint(sys.path[1])\n", tool_name="s", organization_id=ORG, policy="warm",
                                env={"PYTHONPATH": "/from-request"})
        self.assertFalse(r.record["warm"])
        self.assertEqual(r.stdout, ["/from-request\n"])

    def test_the_end_note_ends_only_its_own_run(self):
        # The note is close-on-exec before the tool runs: a program the tool
        # starts (descriptors kept) inherits what a cold run's would.
        seen = {}
        for policy in ("warm", "cold"):
            self.wait_warm()
            r = self.tool(FDS_TOOL, "fds", {}, policy=policy)
            self.assertEqual(r.status, "success", r.stderr)
            self.assertEqual(r.record["warm"], policy == "warm")
            seen[policy] = r.func_return
        self.assertEqual(seen["warm"], seen["cold"])
        self.assertEqual(seen["cold"], [0, 1, 2, 3], "0-2 and ls's own /proc/self/fd")
        # A tool that writes the note itself ends its run with that status,
        # and its process with it, as os._exit would.
        self.wait_warm()
        t0 = time.monotonic()
        r = self.tool(NOTE_TOOL, "note", {"status": 7})
        self.assertLess(time.monotonic() - t0, 15, "the run went on after its note")
        self.assertTrue(r.record["warm"], r.record)
        self.assertEqual((r.record["end_reason"], r.record["exit_code"]), ("exited", 7), r.record)
        self.assertEqual(r.status, "error")
        # A tool that leaves a program running: the run ends with the tool
        # (the program is killed with the sandbox), its output complete.
        for policy in ("warm", "cold"):
            self.wait_warm()
            t0 = time.monotonic()
            r = self.tool(LINGER_TOOL, "linger", {}, policy=policy)
            self.assertLess(time.monotonic() - t0, 15, "a %s run waited for what its tool left running" % policy)
            self.assertEqual((r.status, r.func_return), ("success", "done"), r.stderr)
            self.assertEqual(r.stdout, ["early\n"])
        # A script that forks: the child runs to the script's end too, and
        # ends as a cold one would (a note of its own would end the run
        # before the parent prints).
        runs = []
        for policy in ("warm", "cold"):
            self.wait_warm(mode="execute")
            runs.append(self.client.execute(FORK_SCRIPT, tool_name="s", organization_id=ORG, policy=policy))
        self.assertEqual([r.record["warm"] for r in runs], [True, False])
        for r in runs:
            self.assertEqual((r.record["end_reason"], r.record["exit_code"]), ("exited", 0), r.record)
            self.assertEqual(r.stdout, ["child\nparent\n"], r.record)
        # A cold script takes its note as a warm one does: the same
        # descriptors, the note's close-on-exec, none inherited.
        runs = []
        for policy in ("warm", "cold"):
            self.wait_warm(mode="execute")
            runs.append(self.client.execute(FDS_SCRIPT, tool_name="s", organization_id=ORG, policy=policy))
        self.assertEqual([r.record["warm"] for r in runs], [True, False])
        self.assertEqual(runs[0].stdout, runs[1].stdout)
        self.assertIn("(True, True)", runs[1].stdout[0], "the cold script's note, close-on-exec")
        # A request without variables: the environment block stays the one
        # the process started with, which is what a cold start shows.
        self.wait_warm()
        warm = self.tool(ENV_TOOL, "env_view", {})
        cold = self.tool(ENV_TOOL, "env_view", {}, policy="cold")
        self.assertTrue(warm.record["warm"])
        self.assertEqual(warm.func_return["proc"], cold.func_return["proc"])
        self.assertEqual(warm.func_return["environ"], cold.func_return["environ"])
        self.wait_warm()
        self.assertEqual(self.tool(ADD_TOOL, "add", {"a": 2, "b": 3}).func_return, 5)

    def test_limits_count_from_the_hand_over(self):
        st = self.wait_warm(policy="short")
        pool = [p for p in st["warm_pool"]["pools"] if p["policy"] == "short" and p["mode"] == "run_tool"][0]
        self.assertGreaterEqual(pool["warm"], 1)
        time.sleep(2.5)  # the waiting sandbox is now older than the policy's 2 s timeout
        r = self.tool(SLEEP_TOOL, "nap", {"s": 1.0}, policy="short")
        self.assertEqual(r.status, "success", r.stderr)
        self.assertTrue(r.record["warm"])
        self.assertEqual(r.func_return, "rested")
        self.wait_warm(policy="short")
        t0 = time.monotonic()
        r = self.tool(SLEEP_TOOL, "nap", {"s": 30.0}, policy="short")
        took = time.monotonic() - t0
        self.assertTrue(r.record["warm"])
        self.assertEqual(r.record["end_reason"], "timeout", r.record)
        self.assertLess(took, 15)
        self.assertGreaterEqual(r.record["wall_ms"], 1900, r.record)
        # CPU time: the warm-up (an interpreter start, the runner's imports)
        # is not the run's; a cold run's record counts its own start.
        self.wait_warm()
        warm = self.tool(ADD_TOOL, "add", {"a": 1, "b": 2})
        cold = self.tool(ADD_TOOL, "add", {"a": 1, "b": 2}, policy="cold")
        self.assertTrue(warm.record["warm"])
        self.assertLess(warm.record["cpu_ms"], cold.record["cpu_ms"] / 2, (warm.record, cold.record))

    def test_a_pool_whose_sandboxes_end_before_their_use_pauses(self):
        def lost():
            pools = [p for p in self.daemon.status()["warm_pool"]["pools"] if p["policy"] == "broken"]
            return sum(p["lost"] for p in pools), sum(p["warm"] for p in pools)

        self.daemon.wait_for(lambda st: lost()[0] >= 6, 30, "both pools of the broken policy to lose 3 each")
        time.sleep(2)
        self.assertEqual(lost(), (6, 0), "three in a row, then a pause: no more warm sandboxes made and lost")
        r = self.client.execute("print(1)\n", tool_name="s", organization_id=ORG, policy="broken")
        self.assertFalse(r.record["warm"])
        self.assertEqual(r.record["exit_code"], 0)
        self.assertIn("3 warm sandboxes in a row ended before their use", self.daemon.log())

    def test_a_burst_larger_than_the_pool_runs_cold(self):
        self.wait_warm()
        with ThreadPoolExecutor(max_workers=6) as ex:
            runs = list(ex.map(lambda i: self.tool(ADD_TOOL, "add", {"a": i, "b": 1}), range(6)))
        self.assertEqual([r.func_return for r in runs], [i + 1 for i in range(6)])
        warm = sum(1 for r in runs if r.record["warm"])
        self.assertGreaterEqual(warm, 1)
        self.assertGreaterEqual(len(runs) - warm, 1, "6 runs at once cannot all have found a warm sandbox of 2")


class WarmPoolReload(unittest.TestCase):
    """A daemon of its own: the reload changes the policy."""

    @classmethod
    def setUpClass(cls):
        start(cls)

    def test_a_reload_drains_the_old_pool(self):
        d = self.daemon
        st = d.wait_for(lambda s: s["warm_pool"]["warm"] >= 5, 30, "the pools to fill")
        before = set(pooled_runners(self.daemon))
        self.assertGreaterEqual(len(before), 5)
        # The policy changes (a variable the runs get), and the daemon reloads.
        path = os.path.join(self.policies, "warm.json")
        with open(path) as f:
            doc = json.load(f)
        doc["environment"]["set"] = {"WARM_GENERATION": "2"}
        with open(path, "w") as f:
            json.dump(doc, f)
        old_fp = st["policies"]["warm"]
        d.proc.send_signal(signal.SIGHUP)
        st = d.wait_for(lambda s: s["policies"]["warm"] != old_fp and s["warm_pool"]["warm"] >= 2, 30,
                        "the reload and new warm sandboxes")
        deadline = time.monotonic() + 10
        while before & set(pooled_runners(self.daemon)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(before & set(pooled_runners(self.daemon)), "a warm sandbox of the old policies outlived the reload")
        self.assertEqual(st["warm_pool"]["hits"], 0, "the new pools start afresh")
        r = d.client().run_tool(ENV_TOOL, tool_name="env_view", args={}, organization_id=ORG)
        self.assertTrue(r.record["warm"])
        self.assertEqual(r.record["policy_fingerprint"], st["policies"]["warm"])
        self.assertEqual(r.func_return["environ"].get("WARM_GENERATION"), "2")


if __name__ == "__main__":
    unittest.main()
