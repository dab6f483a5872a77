"""TypeScript tools on E2B (docs/E2B.md, "TypeScript tools"), against Letta.

The daemon runs on the fake E2B service (tests/fakes/e2b_fake.py, whose
TypeScript contexts are Node processes that behave as E2B's kernel does).
Letta's side is Letta's own code (tests/python/letta_reference.py restates
its TypeScript generator, parse_typescript_result and what its E2B sandbox
makes of an execution), run on the same fake: its script in a fresh
TypeScript context, as run_code(language="ts") runs it. Each case compares
what the daemon answers, in both modes (execute of Letta's script, run_tool of
the tool), with what Letta's E2B sandbox returns.

Needs root (the daemon) and node with Debian's node-typescript (the fake's
kernel; scripts/lib.sh installs it).
"""

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import letta_reference as lr  # noqa: E402
from daemon_fixture import REPO, Daemon, require_daemon  # noqa: E402
from toolsandbox_client import ToolSandboxError  # noqa: E402

KEY = "e2b_test_key_" + "7" * 24
FAKE = os.path.join(REPO, "tests", "fakes", "e2b_fake.py")
ORG_NET = "org-ts-net"   # not privileged, policy "privileged" (network: npm allowed)
ORG_NONE = "org-ts-none"  # not privileged, policy "default" (no network)


def have_kernel():
    return shutil.which("node") and os.path.isdir("/usr/share/nodejs/typescript")


class FakeE2B:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tsb-e2b-ts-")
        self.key_file = os.path.join(self.dir, "api-key")
        with open(self.key_file, "w") as f:
            f.write(KEY + "\n")
        os.chmod(self.key_file, 0o600)
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "fake.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, FAKE, "--api-key-file", self.key_file, "--port-file", port_file],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the fake E2B service did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read())
        self.url = "http://127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, method, path, body=None, headers=None):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=dict(headers or {}))
        if data is not None and "Content-Type" not in req.headers:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
        return text

    def control(self, path, body=None):
        text = self.call("GET" if body is None else "POST", "/_control/" + path, body)
        return json.loads(text) if text else None

    def processes(self):
        return self.control("pip")

    def letta_run(self, tool_name, script, envs):
        """Letta's AsyncToolSandboxE2B.run of a TypeScript tool's script: a
        sandbox, run_code(script, envs=envs, language="ts") (the server sets
        the variables in the context first), the execution read by Letta."""
        sb = json.loads(self.call("POST", "/sandboxes", {"templateID": "code-interpreter-v1", "timeout": 60,
                                                         "secure": True, "metadata": {"letta": "reference"}},
                                  {"X-API-KEY": KEY}))
        base = "/sbx/%s/49999" % sb["sandboxID"]
        h = {"X-Access-Token": sb["envdAccessToken"]}
        ctx = json.loads(self.call("POST", base + "/contexts", {"language": "ts", "cwd": "/home/user"}, h))

        def run(code):
            lines = [json.loads(x) for x in self.call("POST", base + "/execute",
                                                      {"code": code, "context_id": ctx["id"]}, h).splitlines() if x]
            return lines
        if envs:
            run("\n".join("process.env['%s'] = '%s'" % (k, v) for k, v in envs.items()))
        lines = run(script)
        self.call("DELETE", "/sandboxes/" + sb["sandboxID"], None, {"X-API-KEY": KEY})
        results = [m["text"] for m in lines if m["type"] == "result"]
        errors = [(m["name"], m["value"], m["traceback"]) for m in lines if m["type"] == "error"]
        stdout = [m["text"] for m in lines if m["type"] == "stdout"]
        stderr = [m["text"] for m in lines if m["type"] == "stderr"]
        try:
            return lr.e2b_typescript_result(tool_name, results, errors[0] if errors else None, stdout, stderr)
        except Exception as e:  # what Letta's manager reports
            return {"func_return": lr.get_friendly_error_msg(tool_name, type(e).__name__, str(e)), "agent_state": None,
                    "stdout": [], "stderr": [str(e)], "status": "error"}


def schema(name, props, required=None):
    return {"name": name, "description": name, "parameters": {"type": "object", "properties": props,
                                                              "required": list(props) if required is None else required}}


# Letta's own TypeScript cases (tests/integration_test_typescript_tool_execution_sandbox.py
# in letta-ai/letta) and the ones its parser makes interesting.
CASES = [
    ("add_numbers", "\nexport function add_numbers(x: number, y: number): number {\n    return x + y;\n}\n",
     {"x": 10, "y": 5}, schema("add_numbers", {"x": {"type": "number"}, "y": {"type": "number"}})),
    ("concat_strings", "\nexport function concat_strings(a: string, b: string): string {\n    return a + b;\n}\n",
     {"a": "Hello, ", "b": "World!"}, schema("concat_strings", {"a": {"type": "string"}, "b": {"type": "string"}})),
    ("async_delay", "\nexport async function async_delay(message: string): Promise<string> {\n"
     "    await new Promise(resolve => setTimeout(resolve, 100));\n    return `Delayed: ${message}`;\n}\n",
     {"message": "test"}, schema("async_delay", {"message": {"type": "string"}})),
    ("throw_error", "\nexport function throw_error(): never {\n    throw new Error(\"This is an intentional test error\");\n}\n",
     {}, schema("throw_error", {})),
    ("sum_array", "\nexport function sum_array(numbers: number[]): number {\n"
     "    return numbers.reduce((acc, curr) => acc + curr, 0);\n}\n",
     {"numbers": [1, 2, 3, 4.5]}, schema("sum_array", {"numbers": {"type": "array", "items": {"type": "number"}}})),
    ("get_name", "\nexport function get_name(person: { firstName: string; lastName: string }): string {\n"
     "    return `${person.firstName} ${person.lastName}`;\n}\n",
     {"person": {"firstName": "Ada", "lastName": "Lovelace"}}, schema("get_name", {"person": {"type": "object"}})),
    # Positional order: required first (in their order), then the others.
    ("order", "export function order(a: string, b: number, c: boolean): string {\n"
     "  console.log('called', a, b, c);\n  console.error('to stderr');\n  return `${a}|${b}|${c}`;\n}\n",
     {"c": 1, "a": "x", "b": 2}, schema("order", {"a": {"type": "string"}, "c": {"type": "boolean"},
                                                  "b": {"type": "number"}}, required=["a", "b"])),
    # What util.inspect and the server's quote stripping do to the text
    # Letta parses (PROTOCOL.md §13): both quote kinds -> backticks, not JSON.
    ("quotes", "export function quotes(): string { return `it's \"quoted\"`; }\n", {}, schema("quotes", {})),
    ("newline", "export function newline(): string { return 'a\\nb\\\\c'; }\n", {}, schema("newline", {})),
    ("undef", "export function undef(): void { }\n", {}, schema("undef", {})),
    ("obj", "export const obj = async (): Promise<object> => ({ n: 1.5, s: 'x', l: [null, true] });\n", {},
     schema("obj", {})),
    # A result JSON cannot hold, and a cycle.
    ("bigint", "export function bigint(): bigint { return 10n; }\n", {}, schema("bigint", {})),
    ("cycle", "export function cycle(): any { const a: any = {}; a.self = a; return a; }\n", {}, schema("cycle", {})),
    # The agent's id is in process.env (TypeScript tools get no agent_state).
    ("agent", "export function agent(): string { return String(process.env.LETTA_AGENT_ID); }\n", {},
     schema("agent", {})),
    # A source that does not compile: the kernel's SyntaxError, before any call.
    ("syntax", "export function syntax(: number { return 1; }\n", {}, schema("syntax", {})),
    # Imports are hoisted, `export` goes everywhere (in strings too).
    ("imports", "import os from 'os';\nimport * as path from 'path';\n\nexport function imports(): string {\n"
     "  return typeof os.hostname + path.join('export ', 'x');\n}\n", {}, schema("imports", {})),
]


def joined(v):
    return "".join(v) if isinstance(v, list) else v


@unittest.skipUnless(have_kernel(), "needs node and Debian's node-typescript (scripts/lib.sh installs them)")
class E2BTypeScriptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_daemon()
        cls.fake = FakeE2B()
        cls.tmp = tempfile.mkdtemp(prefix="tsb-e2b-ts-d-")
        orgs = os.path.join(cls.tmp, "organizations.json")
        with open(orgs, "w") as f:
            json.dump({"version": 1,
                       "default": {"privileged": False, "policy": "default", "allowed_policies": ["default"]},
                       "organizations": {ORG_NET: {"privileged": False, "policy": "privileged",
                                                   "allowed_policies": ["privileged"]}}}, f)
        cls.daemon = Daemon(policies_dir=os.path.join(REPO, "policies"), organizations=orgs,
                            e2b={"api_key_file": cls.fake.key_file, "api_url": cls.fake.url,
                                 "sandbox_url": cls.fake.url + "/sbx/{id}/{port}"}).start()
        cls.client = cls.daemon.client()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.fake.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def both(self, name, src, args, js, org=ORG_NET, agent_id="agent-7", npm=None, tag="cases"):
        script = lr.generate_typescript_execution_script(name, src, args, js)
        common = dict(tool_name=name, organization_id=org, agent_id=agent_id, source_type="typescript",
                      npm_requirements=npm, sandbox_config={"type": "e2b", "config": {"tag": tag}})
        ex = self.client.execute(script, **common)
        tool = self.client.run_tool(src, args=args, json_schema=js, **common)
        return script, ex, tool

    def test_letta_cases_match_letta_in_both_modes(self):
        for name, src, args, js in CASES:
            with self.subTest(name):
                script, ex, tool = self.both(name, src, args, js)
                want = self.fake.letta_run(name, script, {"LETTA_AGENT_ID": "agent-7"})
                for mode, got in (("execute", ex), ("run_tool", tool)):
                    self.assertEqual(got.status, want["status"], (mode, got.record))
                    self.assertEqual(got.func_return, want["func_return"], (mode, got.record))
                    self.assertIsNone(got.agent_state)
                    self.assertEqual(got.record["backend"], "e2b")
                self.assertEqual(ex.stdout, want["stdout"])
                self.assertEqual(ex.stderr, want["stderr"])
                self.assertEqual(joined(tool.stdout), joined(want["stdout"]))
                if want["status"] == "success":
                    self.assertEqual(joined(tool.stderr), joined(want["stderr"]))
                    self.assertEqual(tool.record["framing"], "nonce")
                    self.assertTrue(ex.record["framing"].startswith("typescript-"), ex.record)
                else:
                    # The stack's first line is the error's; its frames are the
                    # cell's, not those of Letta's script.
                    self.assertTrue(joined(tool.stderr).startswith(want["stderr"][-1].split("    at ")[0]),
                                    (tool.stderr, want["stderr"]))
        # Cases whose Letta answer the parser shapes, said outright.
        _, ex, tool = self.both(*CASES[7])
        self.assertEqual(ex.func_return, "`{\"results\":\"it's \\\\\"quoted\\\\\"\",\"agent_state\":null}`")
        self.assertEqual(tool.func_return, ex.func_return)
        _, ex, tool = self.both(*CASES[13])
        self.assertEqual((ex.func_return, tool.func_return), ("agent-7", "agent-7"))
        _, ex, tool = self.both(*CASES[11])
        self.assertEqual(tool.func_return, "Error executing function bigint: TypeError: Do not know how to serialize a BigInt")

    def test_npm_requirement_installed_once_and_letta_client_too(self):
        src = ("import { greet } from 'tsb-fake-npm-ok';\n\n"
               "export function greeter(who: string): string { return greet(who); }\n")
        js = schema("greeter", {"who": {"type": "string"}})
        before = len(self.fake.processes())
        _, ex, tool = self.both("greeter", src, {"who": "ts"}, js, npm=["tsb-fake-npm-ok"], tag="npm-once")
        self.assertEqual((ex.status, ex.func_return), ("success", "hello ts"), ex.record)
        self.assertEqual((tool.status, tool.func_return), ("success", "hello ts"), tool.record)
        calls = self.fake.processes()[before:]
        first = [c for c in calls if c["sandbox"] == ex.record["sandbox_id"]]
        self.assertEqual([c["argv"] for c in first][:2], [["npm", "install", "--", "tsb-fake-npm-ok"],
                                                          ["npm", "install", "--", "@letta-ai/letta-client"]])
        self.assertEqual({c["cwd"] for c in first}, {"/home/user"})
        self.assertEqual(ex.record["npm_installed"], ["tsb-fake-npm-ok", "@letta-ai/letta-client"])
        self.assertEqual(tool.record["sandbox_id"], ex.record["sandbox_id"], "one organization and config: reused")
        self.assertNotIn("npm_installed", tool.record, "installed once per sandbox")
        self.assertEqual(len(first), 2, calls)
        # Letta's client is there for the tool: `client` is a LettaClient with the key.
        src = "export function has_client(): string { return client ? client.constructor.name : 'none'; }\n"
        r = self.client.run_tool(src, args={}, json_schema=schema("has_client", {}), tool_name="has_client",
                                 organization_id=ORG_NET, source_type="typescript", env={})
        self.assertEqual(r.func_return, "none")  # no LETTA_API_KEY: null, as in Letta's script

    def test_failed_npm_install_is_setup_failed_with_lettas_message(self):
        r = self.client.run_tool("export function f(): number { return 1; }\n", args={}, json_schema=schema("f", {}),
                                 tool_name="f", organization_id=ORG_NET, source_type="typescript",
                                 npm_requirements=["no-such-npm-pkg@^2.0.0"])
        self.assertEqual(r.status, "error")
        self.assertEqual(r.record["end_reason"], "setup_failed", r.record)
        self.assertEqual(r.record["detail"], "npm_install_failed")
        self.assertTrue(r.func_return.startswith(
            "Error executing function f: RuntimeError: Failed to install tool npm requirement "
            "'no-such-npm-pkg@\"^2.0.0\"' for tool 'f' in E2B sandbox. This may be due to package version "
            "incompatibility. Error: Command exited with code 1 and error:\nnpm ERR! code E404"), r.func_return)

    def test_letta_client_failure_only_warns(self):
        self.fake.control("faults", {"op": "process", "kind": "stderr",
                                     "stderr_b64": base64.b64encode(b"npm ERR! \x1b[31mboom\x1b]0;x\x07\n").decode()})
        r = self.client.run_tool("export function f(): number { return 2; }\n", args={}, json_schema=schema("f", {}),
                                 tool_name="f", organization_id=ORG_NET, source_type="typescript",
                                 sandbox_config={"type": "e2b", "config": {"tag": "client-fails"}})
        self.assertEqual((r.status, r.func_return), ("success", 2), r.record)
        self.assertEqual(r.record["letta_client"], "failed")
        log = self.daemon.log()
        self.assertIn("@letta-ai/letta-client", log)
        self.assertNotIn("\x1b", log)
        self.assertNotIn("\x07", log)

    def test_npm_needs_network_and_the_name_must_be_an_identifier(self):
        with self.assertRaises(ToolSandboxError) as cm:
            self.client.run_tool("export function f() { return 1; }\n", args={}, json_schema=schema("f", {}),
                                 tool_name="f", organization_id=ORG_NONE, source_type="typescript",
                                 npm_requirements=["tsb-fake-npm-ok"])
        self.assertEqual(cm.exception.code, "policy_denied")
        with self.assertRaises(ToolSandboxError) as cm:
            self.client.run_tool("export function f() { return 1; }\n", args={}, json_schema=schema("f", {}),
                                 tool_name="f(process.exit(1))", organization_id=ORG_NET, source_type="typescript")
        self.assertEqual(cm.exception.code, "bad_request")
        # Without network a tool without npm requirements runs (Letta's client
        # is not tried: no registry is reachable).
        r = self.client.run_tool("export function f(): string { return 'ok'; }\n", args={},
                                 json_schema=schema("f", {}), tool_name="f", organization_id=ORG_NONE,
                                 source_type="typescript")
        self.assertEqual((r.status, r.func_return, r.record["letta_client"]), ("success", "ok", "skipped"), r.record)

    def test_arguments_stay_data(self):
        hostile = "'); process.exit(3); ('\u2028${x}`\\"
        src = "export function echo(s: string): string { return s; }\n"
        r = self.client.run_tool(src, args={"s": hostile}, json_schema=schema("echo", {"s": {"type": "string"}}),
                                 tool_name="echo", organization_id=ORG_NET, source_type="typescript")
        want = lr.parse_typescript_result(self.fake_inspect(json.dumps({"results": hostile, "agent_state": None},
                                                                       separators=(",", ":"), ensure_ascii=False)))[0]
        self.assertEqual((r.status, r.func_return), ("success", want), r.record)

    def fake_inspect(self, text):
        """util.inspect of a string, and the server's quote stripping, from node itself."""
        out = subprocess.run(["node", "-e", "const t = require('util').inspect(JSON.parse(process.argv[1]));"
                              "process.stdout.write(/^(['\"]).*\\1$/s.test(t) ? t.slice(1, -1) : t)", json.dumps(text)],
                             capture_output=True, text=True, check=True)
        return out.stdout

    def test_hostile_output_is_escaped_in_the_log(self):
        src = ("export function loud(): string {\n  process.stderr.write('\\x1b[2J\\x1b]0;pwn\\x07\\r\\n');\n"
               "  throw new Error('\\x1b[31mred\\nfake log line');\n}\n")
        r = self.client.run_tool(src, args={}, json_schema=schema("loud", {}), tool_name="loud",
                                 organization_id=ORG_NET, source_type="typescript")
        self.assertEqual(r.status, "error")
        self.assertEqual(r.func_return, "Error executing function loud: Error: \x1b[31mred\nfake log line")
        log = self.daemon.log()
        self.assertNotIn("\x1b", log)
        self.assertNotIn("\x07", log)

    def test_letta_adapter_runs_a_typescript_tool(self):
        from toolsandbox_client.letta import ToolSandboxDaemonSandbox
        tool = types.SimpleNamespace(
            id="tool-ts-1", name="greeter", source_type="typescript", tool_type="custom",
            source_code=("import { greet } from 'tsb-fake-npm-ok';\n"
                         "export async function greeter(who: string): Promise<string> { return greet(who); }\n"),
            json_schema=schema("greeter", {"who": {"type": "string"}}), pip_requirements=None,
            npm_requirements=[types.SimpleNamespace(name="tsb-fake-npm-ok", version="1.0.0")])
        for mode in ("tool", "script"):
            script = lr.generate_typescript_execution_script(tool.name, tool.source_code, {"who": "adapter"},
                                                             tool.json_schema)
            sb = ToolSandboxDaemonSandbox(tool.name, {"who": "adapter"}, tool_object=tool, organization_id=ORG_NET,
                                          socket_path=self.daemon.socket_path, mode=mode,
                                          script=script if mode == "script" else None,
                                          sandbox_config={"type": "e2b", "config": {"tag": "adapter"}},
                                          resolve_from_letta=False, resolve_e2b_config=False)
            res = asyncio.run(sb.run())
            self.assertEqual((res.status, res.func_return), ("success", "hello adapter"), (mode, res))
        calls = [c["argv"] for c in self.fake.processes()]
        self.assertIn(["npm", "install", "--", "tsb-fake-npm-ok@1.0.0"], calls)


if __name__ == "__main__":
    unittest.main()
