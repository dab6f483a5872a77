"""Session workspaces (protocol section 6.8, "Workspaces"; policies/README.md,
"sessions"): an organization's sandbox kept by name between its sessions,
its /work outliving each session's command and nothing else. Under the
shipped default policy's "workspace" (included, as the sessions tests do),
and a policy of short times for the ends.

Run by scripts/lib.sh (run_sessions_tier) inside the outer guard, like
test_sessions.py, whose helpers it uses.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import daemon_fixture as F  # noqa: E402
from test_sessions import MCP_DIR, MCP_IN_SANDBOX, SERVERS, Raw, marked, run_sdk_client, tsb_cli, wait_gone  # noqa: E402

ORG = "org-ws"
OTHER = "org-ws-other"
# The keeper's command line holds its program (python3 -c), which says this.
KEEPER = "toolsandbox workspace: %s"


def write_policies(tmp):
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)
    base = os.path.join(F.REPO, "policies", "default.json")
    mcp = {"filesystem": {"binds": [{"source": MCP_DIR, "target": MCP_IN_SANDBOX}]}}
    short = {"commands": ["/usr/bin/python3"], "max_lifetime": "6s", "idle_timeout": "6s", "memory": "256MiB",
             "workspace": {"size": "8MiB", "idle_ttl": "2s"}}
    policies = {
        "default": dict(mcp),
        "short": dict(mcp, sessions=short),
        "nows": {"sessions": {"commands": ["/usr/bin/python3"], "workspace": None}},
    }
    for name, extra in policies.items():
        with open(os.path.join(pol, name + ".json"), "w") as f:
            json.dump({"version": 1, "include": base, **extra}, f)
    allowed = sorted(policies)
    orgs = {"version": 1, "default": {"privileged": False, "policy": "default", "allowed_policies": allowed}}
    with open(os.path.join(pol, "organizations.json"), "w") as f:
        json.dump(orgs, f)
    return pol


class Workspaces(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        F.require_daemon()
        cls.tmp = tempfile.mkdtemp(prefix="tsb-workspaces-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        os.chmod(cls.tmp, 0o755)
        policies = write_policies(cls.tmp)
        cls.daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"),
                              bind_allowlist=[MCP_DIR], max_sessions=6, max_sessions_per_organization=3)
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()

    def setUp(self):
        # Each test's workspaces are removed before the next (they hold
        # session slots): by the operator, as `toolsandbox session kill` does.
        self.addCleanup(self.remove_workspaces)

    def remove_workspaces(self):
        for w in self.listing()["workspaces"]:
            self.operator({"type": "session_kill", "session_id": w["workspace_id"]})
        self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == 0 and st["sessions"]["open"] == 0, 10,
                             "no workspace kept")

    def operator(self, req):
        with self.daemon.raw() as c:
            return c.request(dict({"v": 1, "id": "op"}, **req))

    def listing(self):
        answer = self.operator({"type": "session_list"})
        self.assertTrue(answer["ok"], answer)
        return answer

    def raw(self, command, workspace, **kw):
        r = Raw(self.daemon.socket_path, command, org=kw.pop("org", ORG), workspace=workspace, **kw)
        self.addCleanup(r.close)
        return r

    def run_in(self, workspace, script, **kw):
        """A session in `workspace` running python3 -c script to its end: (answer, record, stdout)."""
        r = self.raw(["python3", "-c", script], workspace, **kw)
        self.assertTrue(r.answer.get("ok"), r.answer)
        r.end_stdin()
        rec = r.finish()
        return r.answer["session"], rec, r.out.decode()

    # --- what lasts, and what does not ----------------------------------------

    def test_files_outlive_the_session_and_nothing_else_does(self):
        tag = "tsb-ws-left-" + uuid.uuid4().hex[:8]
        first = textwrap.dedent("""\
            import os
            open('/work/notes.txt', 'w').write('kept')
            open('/tmp/scratch', 'w').write('not kept')
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(1000)', '%s'])
                os._exit(0)
            """ % tag)
        opened, rec, _ = self.run_in("agent-1", first)
        self.assertEqual((rec["ended_by"], rec["exit_code"]), ("exit", 0), rec)
        self.assertTrue(opened["workspace"]["new"])
        wid = opened["workspace"]["workspace_id"]
        self.assertEqual(opened["session_id"], wid + ".1")
        self.assertEqual(rec["workspace"], {"name": "agent-1", "workspace_id": wid})
        self.assertNotIn("peak_memory_bytes", rec)
        self.assertTrue(wait_gone(tag, 1.0), "a process of the session outlived it in its workspace")
        second = textwrap.dedent("""\
            import os
            print(open('/work/notes.txt').read())
            print(os.path.exists('/tmp/scratch'))
            print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
            """)
        opened, rec, out = self.run_in("agent-1", second)
        self.assertFalse(opened["workspace"]["new"])
        self.assertEqual(opened["session_id"], wid + ".2")
        kept, scratch, pids = out.splitlines()
        self.assertEqual(kept, "kept")
        self.assertEqual(scratch, "True", "/tmp is the workspace sandbox's too, and lasts with it")
        # pid 1 (init), the keeper, this command: nothing of the first session.
        self.assertEqual(len(json.loads(pids)), 3, out)
        [w] = self.listing()["workspaces"]
        self.assertEqual((w["workspace_id"], w["organization_id"], w["name"], w["policy"], w["sessions"],
                          w["in_use"]), (wid, ORG, "agent-1", "default", 2, False))
        self.assertEqual(self.daemon.status()["sessions"]["workspaces"], 1)

    def test_another_organization_or_name_starts_empty(self):
        self.run_in("shared-name", "open('/work/mine', 'w').write('org-ws')")
        for org, name in ((OTHER, "shared-name"), (ORG, "another-name")):
            opened, rec, out = self.run_in(name, "import os; print(os.listdir('/work'))", org=org)
            self.assertTrue(opened["workspace"]["new"], (org, name))
            self.assertEqual(out.strip(), "[]", (org, name))
        self.assertEqual(len(self.listing()["workspaces"]), 3)

    def test_one_session_at_a_time(self):
        r = self.raw(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(1000)"], "busy-one")
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        second = Raw(self.daemon.socket_path, ["python3", "-c", "print(1)"], org=ORG, workspace="busy-one")
        self.addCleanup(second.close)
        self.assertFalse(second.answer["ok"])
        self.assertEqual(second.answer["error"]["code"], "busy", second.answer)
        self.assertIn("one at a time", second.answer["error"]["message"])
        r.close()
        # Its end frees it: the next session runs in it.
        self.daemon.wait_for(lambda st: st["sessions"]["open"] == 0, 5, "the first session ended")
        opened, rec, out = self.run_in("busy-one", "print('next')")
        self.assertEqual((out.strip(), opened["workspace"]["new"]), ("next", False))

    def test_the_next_session_waits_for_the_last_ones_end(self):
        # As letta-server does: a session per call, the next one opened as
        # soon as the last one's client let go.
        for i in range(5):
            r = self.raw(["python3", "-c", "import sys\nprint('call', flush=True)\nsys.stdin.read()"], "calls")
            self.assertTrue(r.answer.get("ok"), (i, r.answer))
            self.assertTrue(r.read_until(lambda: b"call" in r.out))
            r.close()
        [w] = self.listing()["workspaces"]
        self.assertEqual(w["sessions"], 5)

    def test_a_disconnect_ends_the_command_within_a_second_and_keeps_the_workspace(self):
        tag = "tsb-ws-disc-" + uuid.uuid4().hex[:8]
        script = textwrap.dedent("""\
            import os, time
            open('/work/before', 'w').write('x')
            if os.fork() == 0:
                os.setsid()
                os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(1000)', '%s'])
            print('forked', flush=True)
            time.sleep(1000)
            """ % tag)
        r = self.raw(["python3", "-c", script], "disc")
        self.assertTrue(r.read_until(lambda: b"forked" in r.out))
        deadline = time.monotonic() + 5
        while not marked(tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertTrue(marked(tag))
        r.close()
        self.assertTrue(wait_gone(tag, 1.0), "a process of the session outlived its client by a second")
        _, rec, out = self.run_in("disc", "import os; print(os.path.exists('/work/before'))")
        self.assertEqual(out.strip(), "True")

    def test_the_workspace_size_is_a_hard_cap(self):
        script = textwrap.dedent("""\
            import errno
            try:
                with open('/work/big', 'wb') as f:
                    for _ in range(16):
                        f.write(b'x' * (1 << 20))
                        f.flush()
            except OSError as e:
                print(errno.errorcode[e.errno])
            """)
        _, rec, out = self.run_in("full", script, policy="short")
        self.assertEqual(out.strip(), "ENOSPC", rec)

    # --- its ends ------------------------------------------------------------

    def test_idle_ttl_removes_the_workspace_and_its_sandbox(self):
        self.run_in("ttl", "open('/work/f', 'w').write('x')", policy="short")
        [w] = self.listing()["workspaces"]
        self.assertEqual(w["name"], "ttl")
        self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == 0, 6, "the workspace removed after its idle_ttl")
        self.assertTrue(wait_gone(KEEPER, 3), "the keeper outlived its workspace")
        opened, _, out = self.run_in("ttl", "import os; print(os.listdir('/work'))", policy="short")
        self.assertTrue(opened["workspace"]["new"])
        self.assertEqual(out.strip(), "[]")

    def test_a_session_keeps_its_workspace_past_the_idle_ttl(self):
        r = self.raw(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(3)\nprint('done')"], "held",
                     policy="short")
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        r.end_stdin()
        rec = r.finish(timeout=10)
        self.assertEqual((rec["ended_by"], r.out), ("exit", b"up\ndone\n"), rec)

    def test_max_lifetime_ends_the_workspace_and_the_session_in_it(self):
        r = self.raw(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(1000)"], "life", policy="short")
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        rec = r.finish(timeout=15)
        self.assertEqual(rec["ended_by"], "lifetime", rec)
        self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == 0, 5, "the workspace removed at its lifetime")

    def test_the_operator_removes_a_workspace_and_ends_its_session(self):
        r = self.raw(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(1000)"], "op")
        self.assertTrue(r.read_until(lambda: b"up" in r.out))
        wid = r.answer["session"]["workspace"]["workspace_id"]
        [listed] = [s for s in self.listing()["sessions"] if s["session_id"] == wid + ".1"]
        self.assertEqual(listed["workspace"], "op")
        killed = subprocess.run([tsb_cli(), "session", "kill", wid, "--socket", self.daemon.socket_path],
                                capture_output=True, text=True, timeout=20)
        self.assertEqual(killed.returncode, 0, killed.stderr)
        rec = r.finish(timeout=10)
        self.assertEqual(rec["ended_by"], "operator", rec)
        self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == 0, 5, "the workspace removed")

    def test_a_command_that_stops_its_keeper_still_ends_with_its_session(self):
        tag = "tsb-ws-stop-" + uuid.uuid4().hex[:8]
        script = textwrap.dedent("""\
            import os, signal, time
            for p in os.listdir('/proc'):
                if p.isdigit() and b'toolsandbox' + b' workspace' in open('/proc/%%s/cmdline' %% p, 'rb').read():
                    os.kill(int(p), signal.SIGSTOP)
            print('stopped', flush=True)
            time.sleep(1000)
            # %s
            """ % tag)
        r = self.raw(["python3", "-c", script], "stopper")
        self.assertTrue(r.read_until(lambda: b"stopped" in r.out))
        r.close()
        self.assertTrue(wait_gone(tag, 4), "a command that stopped its keeper outlived its session")
        self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == 0, 5, "the workspace of a stuck keeper removed")

    def test_a_session_right_after_the_workspace_was_removed_gets_a_new_one(self):
        _, _, _ = self.run_in("again", "open('/work/f', 'w').write('x')")
        [w] = self.listing()["workspaces"]
        self.operator({"type": "session_kill", "session_id": w["workspace_id"]})
        opened, rec, out = self.run_in("again", "import os; print(os.listdir('/work'))")
        self.assertEqual((opened["workspace"]["new"], rec["ended_by"], out.strip()), (True, "exit", "[]"), rec)
        self.assertNotEqual(opened["workspace"]["workspace_id"], w["workspace_id"])

    def test_a_large_environment_goes_whole_and_keeps_the_workspace(self):
        self.run_in("env", "open('/work/f', 'w').write('kept')")
        env = {"BIG_%d" % i: chr(ord("a") + i) * 100_000 for i in range(3)}
        opened, rec, out = self.run_in(
            "env", "import os; print(sum(len(os.environ['BIG_%d' % i]) for i in range(3)), open('/work/f').read())",
            env=env)
        self.assertEqual((out.strip(), opened["workspace"]["new"]), ("300000 kept", False), rec)

    def test_children_a_command_gives_the_keeper_are_reaped(self):
        # clone(CLONE_PARENT): the command's children are the keeper's own;
        # each session's end reaps them, so none piles up as a zombie.
        script = textwrap.dedent("""\
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            for _ in range(20):
                if libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:  # clone(CLONE_PARENT | SIGCHLD)
                    libc.syscall(60, 0)  # exit
            zombies = 0
            for p in os.listdir('/proc'):
                if p.isdigit() and open('/proc/%s/stat' % p).read().rsplit(') ', 1)[1].startswith('Z'):
                    zombies += 1
            print(zombies)
            """)
        counts = [int(self.run_in("zombies", script)[2]) for _ in range(3)]
        self.assertLessEqual(max(counts[1:]), 20, "zombies of one session outlived it: %s" % counts)

    def test_a_session_that_changes_its_keepers_limits_ends_the_workspace(self):
        script = textwrap.dedent("""\
            import os, resource
            resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (12, 12))
            print('done')
            """)
        opened, rec, out = self.run_in("limits", script)
        self.assertEqual((out.strip(), rec["ended_by"]), ("done", "exit"), rec)
        self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == 0, 5,
                             "the workspace of a keeper whose limits a session changed removed")
        opened, rec, out = self.run_in("limits", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
        self.assertTrue(opened["workspace"]["new"])
        self.assertNotEqual(out.strip(), "12", "a session's limits reached the next one")

    def test_a_session_that_changes_its_keepers_scheduling_ends_the_workspace(self):
        # The scheduling policy and the I/O priority are inherited too.
        for name, change, probe in (
                ("sched", "os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))",
                 "print(os.sched_getscheduler(0))"),
                ("ioprio", "ctypes.CDLL(None).syscall(251, 1, os.getppid(), 3 << 13)",  # ioprio_set, IDLE (x86_64)
                 "print(ctypes.CDLL(None).syscall(252, 1, 0))")):
            kept = self.daemon.status()["sessions"]["workspaces"]
            opened, rec, out = self.run_in(name, "import ctypes, os\n%s\nprint('done')" % change)
            self.assertEqual((out.strip(), rec["ended_by"]), ("done", "exit"), rec)
            self.daemon.wait_for(lambda st: st["sessions"]["workspaces"] == kept, 5,
                                 "the workspace of a keeper whose %s a session changed removed" % name)
            opened, rec, out = self.run_in(name, "import ctypes, os\n" + probe)
            self.assertTrue(opened["workspace"]["new"], name)
            self.assertEqual(out.strip(), "0", "a session's %s reached the next one" % name)

    def test_workspaces_hold_session_slots(self):
        for i in range(3):  # max_sessions_per_organization
            self.run_in("slot-%d" % i, "pass")
        r = Raw(self.daemon.socket_path, ["python3", "-c", "pass"], org=ORG)
        self.addCleanup(r.close)
        self.assertEqual(r.answer["error"]["code"], "busy", r.answer)
        self.assertIn("kept as workspaces", r.answer["error"]["message"])
        # A session in a kept one takes no other slot.
        _, rec, out = self.run_in("slot-0", "print('in')")
        self.assertEqual(out.strip(), "in")

    def test_refused_where_the_policy_keeps_none_or_the_name_is_bad(self):
        r = Raw(self.daemon.socket_path, ["python3", "-c", "pass"], org=ORG, policy="nows", workspace="w")
        self.addCleanup(r.close)
        self.assertEqual(r.answer["error"]["code"], "policy_denied", r.answer)
        self.assertIn("keeps no workspaces", r.answer["error"]["message"])
        bad = Raw(self.daemon.socket_path, ["python3", "-c", "pass"], org=ORG, workspace="../x y")
        self.addCleanup(bad.close)
        self.assertEqual(bad.answer["error"]["code"], "bad_request", bad.answer)

    # --- a real MCP server keeps its state in a workspace ---------------------

    def test_mcp_memory_server_state_lasts_across_sessions_in_a_workspace(self):
        def client(workspace, steps):
            opts = ["--socket", self.daemon.socket_path, "--org", ORG, "--workspace", workspace,
                    "--env", "MEMORY_FILE_PATH=/work/memory.jsonl"]
            return run_sdk_client(self, self.tmp, opts, [SERVERS + "/server-memory/dist/index.js"], steps)

        client("agent-mem", """
            await client.callTool({ name: "create_entities", arguments: { entities: [
                { name: "toolsandbox", entityType: "project", observations: ["kept in a workspace"] }] } });
            return true;""")
        read = 'const g = await client.callTool({ name: "read_graph", arguments: {} }); return g.content;'
        self.assertIn("kept in a workspace", json.dumps(client("agent-mem", read)))
        self.assertNotIn("toolsandbox", json.dumps(client("agent-other", read)), "another workspace starts empty")


class WorkspacesOfAnotherClient(unittest.TestCase):
    """A workspace is its client uid's: the organization is what a client
    claims, so another allowed uid naming the same one gets its own."""

    NOBODY = 65534

    def test_another_uid_never_reaches_a_workspace(self):
        import grp
        from test_sessions import _as_uid
        F.require_daemon()
        d = F.Daemon(socket={"group": grp.getgrgid(self.NOBODY).gr_name, "mode": "0660"},
                     allowed_uids=[0, self.NOBODY])
        d.start()
        self.addCleanup(d.stop)

        def session(script):
            r = Raw(d.socket_path, ["python3", "-c", script], org="org-victim", workspace="agent-1")
            try:
                r.end_stdin()
                r.finish()
                return {"new": r.answer["session"]["workspace"]["new"], "out": r.out.decode().strip()}
            finally:
                r.close()
        mine = session("open('/work/secret', 'w').write('s3cret'); print('written')")
        self.assertEqual(mine, {"new": True, "out": "written"})
        theirs = _as_uid(self.NOBODY, lambda: session("import os; print(os.listdir('/work'))"))
        self.assertEqual(theirs, {"new": True, "out": "[]"}, theirs)
        again = session("print(open('/work/secret').read())")
        self.assertEqual(again, {"new": False, "out": "s3cret"})
        listed = {(w["peer_uid"], w["name"]) for w in d.raw().request({"v": 1, "id": "l", "type": "session_list"})["workspaces"]}
        self.assertEqual(listed, {(0, "agent-1"), (self.NOBODY, "agent-1")})


    def test_another_uid_never_signals_a_session(self):
        # A session's command takes a signal from its own client's uid (or
        # the operator's), never from another allowed client.
        import grp
        import socket
        from test_sessions import _as_uid
        F.require_daemon()
        d = F.Daemon(socket={"group": grp.getgrgid(self.NOBODY).gr_name, "mode": "0660"},
                     allowed_uids=[0, self.NOBODY])
        d.start()
        self.addCleanup(d.stop)
        r = Raw(d.socket_path, ["python3", "-c", "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: "
                                "sys.exit(9))\nprint('ready', flush=True)\nsignal.pause()"], org="org-victim")
        self.addCleanup(r.close)
        self.assertTrue(r.read_until(lambda: b"ready\n" in r.out))

        def signal_it():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(10)
                c.connect(d.socket_path)
                c.sendall(json.dumps({"v": 1, "id": "sig", "type": "session_kill", "signal": "TERM",
                                      "session_id": r.answer["session"]["session_id"]}).encode() + b"\n")
                return json.loads(c.makefile().readline())
        theirs = _as_uid(self.NOBODY, signal_it)
        self.assertEqual(theirs.get("error", {}).get("code"), "bad_request", theirs)
        try:
            frame = r.read_frame(1)
        except (AssertionError, OSError):
            frame = None  # no frame within 1 s: the session goes on
        self.assertIsNone(frame, (frame, r.out, r.err))
        self.assertTrue(signal_it()["ok"])
        self.assertEqual(r.finish()["exit_code"], 9)


class WorkspacesAtTheDaemonsEnd(unittest.TestCase):
    def start(self, **kw):
        F.require_daemon()
        d = F.Daemon(max_sessions=4, shutdown_grace="5s", **kw)
        d.start()
        self.addCleanup(d.stop)
        return d

    def test_a_reload_that_changes_the_policy_gives_the_next_session_a_new_workspace(self):
        tmp = tempfile.mkdtemp(prefix="tsb-ws-reload-")
        self.addCleanup(shutil.rmtree, tmp, True)
        os.chmod(tmp, 0o755)
        path = os.path.join(tmp, "default.json")

        def write(generation):
            with open(path, "w") as f:
                json.dump({"version": 1, "include": os.path.join(F.REPO, "policies", "default.json"),
                           "environment": {"set": {"GENERATION": generation, "PATH": "/usr/bin:/bin"}}}, f)
        write("old")
        orgs = os.path.join(tmp, "organizations.json")
        with open(orgs, "w") as f:
            json.dump({"version": 1, "default": {"privileged": False, "policy": "default"}}, f)
        d = self.start(policies_dir=tmp, organizations=orgs)
        script = "import os; open('/work/f', 'a').write('x'); print(os.environ['GENERATION'], open('/work/f').read())"

        def session():
            r = Raw(d.socket_path, ["python3", "-c", script], org=ORG, workspace="gen")
            self.addCleanup(r.close)
            r.end_stdin()
            rec = r.finish()
            return r.answer["session"], rec, r.out.decode().strip()
        _, _, out = session()
        self.assertEqual(out, "old x")
        old_fp = d.status()["policies"]["default"]
        write("new")
        d.proc.send_signal(signal.SIGHUP)
        st = d.wait_for(lambda s: s["policies"]["default"] != old_fp, 30, "the reload")
        opened, rec, out = session()
        self.assertEqual(out, "new x", "a session runs under the policy in force, in a new workspace")
        self.assertTrue(opened["workspace"]["new"])
        self.assertEqual(opened["policy_fingerprint"], st["policies"]["default"])
        d.wait_for(lambda s: s["sessions"]["workspaces"] == 1, 5, "the old workspace removed")

    def keep_one(self, d):
        r = Raw(d.socket_path, ["python3", "-c", "open('/work/f', 'w').write('x')"], org=ORG, workspace="end")
        self.addCleanup(r.close)
        r.end_stdin()
        self.assertEqual(r.finish()["ended_by"], "exit")
        self.assertEqual(d.status()["sessions"]["workspaces"], 1)

    def test_shutdown_removes_kept_workspaces(self):
        d = self.start()
        self.keep_one(d)
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(10)
        self.assertTrue(wait_gone(KEEPER, 3), "a workspace outlived the daemon's stop")

    def test_sigkill_of_the_daemon_leaves_no_workspace_behind(self):
        d = self.start()
        self.keep_one(d)
        d.proc.kill()
        d.proc.wait(10)
        self.assertTrue(wait_gone(KEEPER, 3), "a workspace outlived the daemon")


if __name__ == "__main__":
    unittest.main()
