"""A session command's own packages: `npx -y PACKAGE` and `uvx PACKAGE`, as
MCP clients start servers, built once in a build sandbox from the policy's
package source, cached, bound read-only, never installed in the session
(daemon/frontend/session/packages.h).

The npm packages come from a tarball directory this test packs from the
MCP packages scripts/lib.sh installed (tests/sessions/mcp), served by the
builder on its own loopback: the real reference servers and their real
dependencies, offline. The Python package is a wheel made here.

    tests/guard/run-guarded ... -- /usr/bin/python3 -m pytest tests/sessions
"""

import json
import os
import shutil
import socket
import sys
import tempfile
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import daemon_fixture as F  # noqa: E402
import npm_tarballs  # noqa: E402
import wheels  # noqa: E402
from test_sessions import MCP_DIR, Raw, run_sdk_client, tsb_cli  # noqa: E402

ORG = "org-packages"
MEMORY = "@modelcontextprotocol/server-memory"

# Prints what it sees of its sandbox, then echoes stdin: its own package
# read-only, its arguments, no npm cache of the session's.
PROBE_JS = r"""#!/usr/bin/env node
const fs = require("fs");
let write = "written";
try { fs.writeFileSync(__dirname + "/x", "x"); } catch (e) { write = e.code; }
let own = fs.existsSync("/node_modules/tsb-probe/package.json");
console.log(JSON.stringify({ argv: process.argv.slice(1), write, own, npmCache: fs.existsSync("/work/.npm") }));
process.stdin.on("data", (d) => process.stdout.write("echo " + d));
"""

ECHO_PY = """import os, sys
def main():
    print("venv", sys.prefix, sys.argv[1:], flush=True)
    try:
        open(os.path.join(sys.prefix, "x"), "w")
        print("wrote", flush=True)
    except OSError as e:
        print("refused", e.errno, flush=True)
    for line in sys.stdin:
        print("echo", line.strip(), flush=True)
"""


def write_policies(tmp, tarballs, wheel_dir):
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)
    base = os.path.join(F.REPO, "policies", "default.json")
    ts = {"node": "/usr/bin/node", "strip_types": "esbuild",
          "packages": {"allow": ["*"], "tarballs": tarballs, "build": {"wall_timeout": "600s"}}}
    pkgs = {"allow": ["*"], "wheels": wheel_dir}
    policies = {
        "pkgs": {"typescript": ts, "packages": pkgs},
        "narrow": {"typescript": dict(ts, packages=dict(ts["packages"], allow=["@modelcontextprotocol/*"])),
                   "packages": dict(pkgs, allow=["other"])},
        "nonpm": {"typescript": {"node": "/usr/bin/node", "strip_types": "esbuild", "packages": None},
                  "packages": pkgs},
        "nonode": {"typescript": ts, "packages": pkgs, "sessions": {"commands": ["/usr/bin/python3"]}},
    }
    for name, extra in policies.items():
        with open(os.path.join(pol, name + ".json"), "w") as f:
            json.dump({"version": 1, "include": base, **extra}, f)
    orgs = {"version": 1, "default": {"privileged": False, "policy": "pkgs", "allowed_policies": sorted(policies)}}
    with open(os.path.join(pol, "organizations.json"), "w") as f:
        json.dump(orgs, f)
    return pol


class SessionPackages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        F.require_daemon()
        if not os.path.isdir(os.path.join(MCP_DIR, "node_modules", "@modelcontextprotocol", "sdk")):
            raise AssertionError("%s lacks the MCP packages (scripts/lib.sh, install_test_mcp)" % MCP_DIR)
        cls.tmp = tempfile.mkdtemp(prefix="tsb-session-pkgs-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        os.chmod(cls.tmp, 0o755)
        tarballs = cls.tarballs = os.path.join(cls.tmp, "tarballs")
        wheel_dir = os.path.join(cls.tmp, "wheels")
        for d in (tarballs, wheel_dir):
            os.mkdir(d, 0o755)
        if npm_tarballs.pack_installed(os.path.join(MCP_DIR, "node_modules"), tarballs) < 20:
            raise AssertionError("the MCP packages were not packed")
        npm_tarballs.make_tarball(tarballs, "tsb-probe", "1.0.0", files={"probe.js": PROBE_JS},
                                  package_json={"bin": {"tsb-probe": "./probe.js"}})
        npm_tarballs.make_tarball(tarballs, "tsb-two-bins", "1.0.0", files={"a.js": "", "b.js": ""},
                                  package_json={"bin": {"a": "a.js", "b": "b.js"}})
        wheels.make_wheel(wheel_dir, "tsb-echo", "1.0", modules={"tsb_echo/__init__.py": ECHO_PY},
                          scripts={"tsb-echo": "tsb_echo:main"})
        policies = write_policies(cls.tmp, tarballs, wheel_dir)
        cls.daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"),
                              max_sessions=4, max_sessions_per_organization=4)
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()

    def setUp(self):
        self.addCleanup(self.daemon.wait_for, lambda st: st["sessions"]["open"] == 0, 5, "no session open")

    def raw(self, command, **kw):
        r = Raw(self.daemon.socket_path, command, org=ORG, **kw)
        self.addCleanup(r.close)
        return r

    def refused(self, command, code, words, **kw):
        r = self.raw(command, **kw)
        self.assertFalse(r.answer["ok"], r.answer)
        self.assertEqual(r.answer["error"]["code"], code, r.answer)
        self.assertIn(words, r.answer["error"]["message"])
        return r.answer["error"]["message"]

    def sdk(self, server, steps, opts=()):
        return run_sdk_client(self, self.tmp, ["--socket", self.daemon.socket_path, "--org", ORG, *opts],
                              ["-y", server], steps, launcher=("npx",))

    # --- npx ---------------------------------------------------------------------

    def test_the_sdk_client_drives_the_three_reference_servers_through_npx(self):
        # As letta-server's StdioServerConfig writes them: command "npx",
        # args ["-y", PACKAGE, ...], behind `toolsandbox session --`.
        # The package is read-only: the memory server keeps its graph where
        # it is told to, in the session's /work.
        builds = self.daemon.status()["venvs"]["builds"]
        memory = self.sdk(MEMORY, """
            await client.callTool({ name: "create_entities", arguments: { entities: [
                { name: "npx", entityType: "launcher", observations: ["built in a sandbox"] }] } });
            return (await client.callTool({ name: "read_graph", arguments: {} })).content;""",
                          opts=("--env", "MEMORY_FILE_PATH=/work/memory.jsonl"))
        self.assertIn("built in a sandbox", json.dumps(memory))
        everything = run_sdk_client(self, self.tmp, ["--socket", self.daemon.socket_path, "--org", ORG],
                                    ["-y", "@modelcontextprotocol/server-everything", "stdio"], """
            const r = await client.callTool({ name: "echo", arguments: { message: "via npx" } });
            return r.content;""", launcher=("npx",))
        self.assertIn("via npx", json.dumps(everything))
        files = run_sdk_client(self, self.tmp, ["--socket", self.daemon.socket_path, "--org", ORG],
                               ["-y", "@modelcontextprotocol/server-filesystem", "/work"], """
            await client.callTool({ name: "write_file", arguments: { path: "/work/a.txt", content: "kept here" } });
            return (await client.callTool({ name: "read_text_file", arguments: { path: "/work/a.txt" } })).content;""",
                               launcher=("npx",))
        self.assertIn("kept here", json.dumps(files))
        # Each built once, then found: the memory server again builds nothing.
        self.assertEqual(self.daemon.status()["venvs"]["builds"], builds + 3)
        self.sdk(MEMORY, "return (await client.listTools()).tools.length;")
        self.assertEqual(self.daemon.status()["venvs"]["builds"], builds + 3)

    def test_the_answer_and_the_record_name_the_program_and_its_tree(self):
        r = self.raw(["npx", "-y", "tsb-probe", "--flag", "x"])
        self.assertTrue(r.answer["ok"], r.answer)
        s = r.answer["session"]
        self.assertEqual(s["command"], ["/usr/bin/node", "/node_modules/tsb-probe/probe.js", "--flag", "x"])
        self.assertEqual(s["packages"]["kind"], "node_modules")
        self.assertEqual(s["packages"]["requirements"], ["tsb-probe"])
        self.assertEqual(len(s["packages"]["key"]), 64)
        self.assertTrue(r.read_until(lambda: b"\n" in r.out))
        seen = json.loads(r.out.splitlines()[0])
        self.assertEqual(seen["argv"], ["/node_modules/tsb-probe/probe.js", "--flag", "x"])
        self.assertNotEqual(seen["write"], "written", "the package is read-only")
        self.assertTrue(seen["own"])
        r.send(b"hi\n")
        self.assertTrue(r.read_until(lambda: b"echo hi" in r.out))
        r.end_stdin()
        rec = r.finish()
        self.assertEqual(rec["packages"]["key"], s["packages"]["key"])
        self.assertIn("packages=" + s["packages"]["key"][:16], self.daemon.log())
        # A session of the same package finds it built.
        again = self.raw(["npx", "--yes", "tsb-probe"])
        self.assertFalse(again.answer["session"]["packages"]["built"])
        again.end_stdin()
        again.finish()

    def test_npx_with_package_picks_the_named_program(self):
        r = self.raw(["npx", "-p", "tsb-two-bins", "b"])
        self.assertEqual(r.answer["session"]["command"], ["/usr/bin/node", "/node_modules/tsb-two-bins/b.js"])
        r.finish()
        self.refused(["npx", "-y", "tsb-two-bins"], "bad_request", "has no program")

    def test_what_npx_may_not_do(self):
        self.refused(["npx", "-c", "id"], "bad_request", "shell")
        self.refused(["npx", "-y", "https://example.com/x.tgz"], "policy_denied", "https://example.com/x.tgz")
        self.refused(["npx", "-y", "tsb-probe"], "policy_denied", "typescript.packages.allow", policy="narrow")
        self.refused(["npx", "-y", "tsb-probe"], "policy_denied", "installs no npm packages", policy="nonpm")
        self.refused(["npx", "-y", "tsb-probe"], "policy_denied", "does not allow /usr/bin/node", policy="nonode")
        msg = self.refused(["npx", "-y", "tsb-not-in-the-directory"], "bad_request", "npm failed")
        self.assertIn("tarball directory", msg)
        self.assertEqual(self.daemon.status()["sessions"]["open"], 0)

    def test_a_workspace_keeps_the_packages_of_its_first_session(self):
        ws = "pkgs-" + uuid.uuid4().hex[:6]
        first = self.raw(["npx", "-y", "tsb-probe"], workspace=ws)
        self.assertTrue(first.answer["ok"], first.answer)
        first.end_stdin()
        first.finish()
        second = self.raw(["npx", "-y", "tsb-probe"], workspace=ws)
        self.assertFalse(second.answer["session"]["workspace"]["new"])
        second.end_stdin()
        second.finish()
        # A plain command runs there too, with the package in reach.
        plain = self.raw(["node", "-e", "console.log(require('fs').existsSync('/node_modules/tsb-probe'))"],
                         workspace=ws)
        plain.finish()
        self.assertEqual(plain.out, b"true\n")
        self.refused(["npx", "-p", "tsb-two-bins", "a"], "bad_request", "other packages", workspace=ws)

    def test_a_plain_workspace_takes_no_packages_later(self):
        ws = "plain-" + uuid.uuid4().hex[:6]
        first = self.raw(["node", "-e", "0"], workspace=ws)
        first.finish()
        self.refused(["npx", "-y", "tsb-probe"], "bad_request", "other packages", workspace=ws)

    def test_a_build_goes_on_when_its_client_leaves(self):
        # An MCP client that gives up on a slow first start (and retries)
        # finds the build its first try started, not a new one.
        name = "tsb-late-" + uuid.uuid4().hex[:6]
        npm_tarballs.make_tarball(self.tarballs, name, "1.0.0", files={"cli.js": "console.log('late')"},
                                  package_json={"bin": "cli.js"})
        builds = self.daemon.status()["venvs"]["builds"]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.daemon.socket_path)
        s.sendall(json.dumps({"v": 1, "id": "gone", "type": "session", "organization_id": ORG,
                              "command": ["npx", "-y", name]}).encode() + b"\n")
        self.daemon.wait_for(lambda st: st["venvs"]["builds"] > builds, 10, "the build started")
        s.close()
        again = self.raw(["npx", "-y", name])
        self.assertTrue(again.answer["ok"], again.answer)
        self.assertFalse(again.answer["session"]["packages"]["built"], "the first build was not stopped")
        again.finish()
        self.assertEqual(again.out, b"late\n")

    # --- uvx ---------------------------------------------------------------------

    def test_uvx_runs_a_console_script_from_a_venv_of_its_own(self):
        r = self.raw(["uvx", "tsb-echo", "a1"])
        self.assertTrue(r.answer["ok"], r.answer)
        s = r.answer["session"]
        self.assertEqual(s["command"], ["/venv/bin/python3", "/venv/bin/tsb-echo", "a1"])
        self.assertEqual((s["packages"]["kind"], s["packages"]["requirements"]), ("venv", ["tsb-echo"]))
        self.assertTrue(r.read_until(lambda: r.out.count(b"\n") >= 2))
        self.assertEqual(r.out.splitlines()[0], b"venv /venv ['a1']")
        self.assertTrue(r.out.splitlines()[1].startswith(b"refused"), r.out)
        r.send(b"x\n")
        self.assertTrue(r.read_until(lambda: b"echo x" in r.out))
        r.end_stdin()
        self.assertEqual(r.finish()["exit_code"], 0)

    def test_what_uvx_may_not_do(self):
        self.refused(["uvx", "--python", "3.8", "tsb-echo"], "bad_request", "the Python is the policy's")
        self.refused(["uvx", "tsb-echo"], "policy_denied", "packages.allow", policy="narrow")
        self.refused(["uvx", "tsb-nothing-here"], "bad_request", "pip failed")
        self.refused(["uvx", "--from", "tsb-echo", "not-its-script"], "bad_request", "no program")

    def test_the_bridge_takes_npx_as_mcp_clients_write_it(self):
        p = __import__("subprocess").run(
            [tsb_cli(), "session", "--socket", self.daemon.socket_path, "--org", ORG, "--", "npx", "-y", "tsb-probe"],
            input=b"line\n", capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"echo line", p.stdout)


class ShippedDefaultPackages(unittest.TestCase):
    """The embedded default policy: npx and uvx are taken, and their
    packages come from /var/lib/toolsandbox/npm and /var/lib/toolsandbox/wheels
    only, built offline in a build sandbox (the names here are in neither)."""

    @classmethod
    def setUpClass(cls):
        F.require_daemon()
        if os.environ.get("TSB_TEST_POLICIES_DIR"):
            raise unittest.SkipTest("TSB_TEST_POLICIES_DIR replaces the shipped policies")
        cls.daemon = F.Daemon(max_sessions=2)
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()

    def refused(self, command):
        r = Raw(self.daemon.socket_path, command, org=ORG)
        self.addCleanup(r.close)
        self.assertFalse(r.answer["ok"], r.answer)
        return r.answer["error"]

    def test_npx_builds_from_the_shipped_tarball_directory(self):
        e = self.refused(["npx", "-y", "tsb-not-in-the-shipped-directory-" + uuid.uuid4().hex[:6]])
        self.assertEqual(e["code"], "bad_request", e)
        self.assertIn("npm failed (packages come only from the tarball directory /var/lib/toolsandbox/npm)",
                      e["message"])

    def test_uvx_builds_from_the_shipped_wheel_directory(self):
        e = self.refused(["uvx", "tsb-not-in-the-shipped-directory-" + uuid.uuid4().hex[:6]])
        self.assertEqual(e["code"], "bad_request", e)
        self.assertIn("pip failed (packages come only from the wheel directory /var/lib/toolsandbox/wheels)",
                      e["message"])


if __name__ == "__main__":
    unittest.main()
