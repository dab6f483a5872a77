"""TypeScript tools on the local backend, in both modes (policies/README.md,
"typescript"; isolate/runner/toolsandbox_ts_runner.js).

A daemon over the shipped default policy (included, so its "typescript"
section is the shipped one) and two test policies: one without TypeScript,
one whose Node runtime is missing on the host. Letta's own TypeScript cases
(tests/integration_test_typescript_tool_execution_sandbox.py of
letta-ai/letta) run here, and execute runs the script Letta's generator
writes, its result compared with what Letta's E2B sandbox makes of the same
completion value (letta_typescript_reference.py).

Needs root, node, esbuild and acorn (scripts/lib.sh installs them); skipped
without root, failed under CI=true.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402
import letta_typescript_reference as R  # noqa: E402
from toolsandbox_client import PolicyDeniedError  # noqa: E402
from toolsandbox_client import letta as L  # noqa: E402

ORG = "org-typescript-tests"
AGENT = "agent-00000000-0000-4000-8000-0000000000ts"


def schema(name, props, required=None):
    return {"name": name, "description": name,
            "parameters": {"type": "object", "properties": props,
                           "required": list(props) if required is None else required}}


# Letta's own cases (integration_test_typescript_tool_execution_sandbox.py):
# (name, source, schema, args, expected func_return).
LETTA_CASES = [
    ("add_numbers", "\nexport function add_numbers(x: number, y: number): number {\n    return x + y;\n}\n",
     schema("add_numbers", {"x": {"type": "number"}, "y": {"type": "number"}}), {"x": 10, "y": 5}, 15),
    ("concat_strings", "\nexport function concat_strings(a: string, b: string): string {\n    return a + b;\n}\n",
     schema("concat_strings", {"a": {"type": "string"}, "b": {"type": "string"}}), {"a": "Hello, ", "b": "World!"},
     "Hello, World!"),
    ("async_delay", "\nexport async function async_delay(message: string): Promise<string> {\n"
     "    await new Promise(resolve => setTimeout(resolve, 100));\n    return `Delayed: ${message}`;\n}\n",
     schema("async_delay", {"message": {"type": "string"}}), {"message": "test"}, "Delayed: test"),
    ("sum_array", "\nexport function sum_array(numbers: number[]): number {\n"
     "    return numbers.reduce((acc, curr) => acc + curr, 0);\n}\n",
     schema("sum_array", {"numbers": {"type": "array", "items": {"type": "number"}}}), {"numbers": [1, 2, 3, 4, 5]}, 15),
    ("get_name", "\nexport function get_name(person: { firstName: string; lastName: string }): string {\n"
     "    return `${person.firstName} ${person.lastName}`;\n}\n",
     schema("get_name", {"person": {"type": "object"}}), {"person": {"firstName": "John", "lastName": "Doe"}}, "John Doe"),
    ("check_client", "\nexport function check_client(): string {\n"
     "    return client === null ? \"client is null (no API key)\" : \"client is available\";\n}\n",
     schema("check_client", {}), {}, "client is null (no API key)"),
    ("ts_func", "\nexport function ts_func(a: number, b: string): string {\n    return b.repeat(a);\n}\n",
     schema("ts_func", {"a": {"type": "number"}, "b": {"type": "string"}}), {"a": 3, "b": "test"}, "testtesttest"),
]
THROW = ("throw_error", "\nexport function throw_error(): never {\n    throw new Error(\"This is an intentional test error\");\n}\n",
         schema("throw_error", {}), {})

HOSTILE = "'); process.exit(3); (`${process.exit(4)}` + \"\\\"); require('fs').writeFileSync('/work/x', '1'); //\n"
ECHO = ("echo", "export function echo(s: string, n?: number): string {\n  console.log('echoing', s.length);\n"
        "  console.error('to stderr');\n  return s;\n}\n",
        schema("echo", {"s": {"type": "string"}, "n": {"type": "number"}}, ["s"]))
AGENT_TOOL = ("who", "export function who(): string { return process.env.LETTA_AGENT_ID ?? 'none'; }\n", schema("who", {}))
BIGINT = ("big", "export function big(): bigint { return 2n ** 70n; }\n", schema("big", {}))
TYPED = ("typed", "import { join } from 'path';\ninterface P { a: number }\ntype Q = P & { b?: string };\n"
         "export const typed = async (p: Q): Promise<string> => join('x', String(p.a as number));\n",
         schema("typed", {"p": {"type": "object"}}))
# Starts a process that outlives the tool's own unless the whole tree is killed.
HANG = ("hang", "import { spawn } from 'child_process';\nexport async function hang(tag: string): Promise<void> {\n"
        "  spawn('/bin/sh', ['-c', 'exec sleep 1000 ' + tag], { detached: true, stdio: 'ignore' }).unref();\n"
        "  await new Promise(() => {});\n}\n", schema("hang", {"tag": {"type": "string"}}))


def write_policies(tmp):
    pol = os.path.join(tmp, "policies")
    os.mkdir(pol)
    base = os.path.join(F.REPO, "policies", "default.json")
    for name, extra in (("default", {}), ("nots", {"typescript": None}),
                        ("missing", {"typescript": {"node": "/usr/bin/node-not-installed-here"}})):
        with open(os.path.join(pol, name + ".json"), "w") as f:
            json.dump({"version": 1, "include": base, **extra}, f)
    orgs = {"version": 1,
            "default": {"privileged": False, "policy": "default", "allowed_policies": ["default"]},
            "organizations": {"org-nots": {"policy": "nots", "allowed_policies": ["nots"]},
                              "org-missing": {"policy": "missing", "allowed_policies": ["missing"]}}}
    with open(os.path.join(pol, "organizations.json"), "w") as f:
        json.dump(orgs, f)
    return pol


def sleepers(tag):
    out = subprocess.run(["pgrep", "-f", "sleep 1000 " + tag], capture_output=True, text=True).stdout
    return out.split()


class TypeScriptLocal(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        F.require_daemon()
        for path in ("/usr/bin/node", "/usr/bin/esbuild", "/usr/share/nodejs/acorn"):
            if not os.path.exists(path):
                raise AssertionError("%s is missing (scripts/lib.sh installs nodejs, esbuild and node-acorn)" % path)
        cls.tmp = tempfile.mkdtemp(prefix="tsb-ts-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        os.chmod(cls.tmp, 0o755)
        policies = write_policies(cls.tmp)
        cls.daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"),
                              max_concurrent_runs=4)
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()
        cls.client = cls.daemon.client()

    def run_tool(self, tool, args, org=ORG, **kw):
        name, source, sch = tool
        return self.client.run_tool(source, tool_name=name, args=args, json_schema=sch, organization_id=org,
                                    source_type="typescript", **kw)

    def execute(self, tool, args, org=ORG, **kw):
        name, source, sch = tool
        script = R.generate_typescript_execution_script(name, source, args, sch)
        return self.client.execute(script, tool_name=name, organization_id=org, source_type="typescript", **kw)

    # --- tool mode ------------------------------------------------------------

    def test_letta_cases_tool_mode(self):
        for name, source, sch, args, want in LETTA_CASES:
            with self.subTest(name):
                r = self.run_tool((name, source, sch), args)
                self.assertEqual((r.status, r.func_return), ("success", want), r)
                self.assertEqual(r.record.get("framing"), "typescript-json")
                self.assertIs(r.record.get("warm"), False)
                self.assertIsNone(r.agent_state)

    def test_letta_cases_execute_match_e2b(self):
        # Letta's generator, run here; the result as Letta's E2B sandbox
        # parses the same script's completion value (computed by node
        # outside any sandbox, the kernel's text of it).
        for name, source, sch, args, want in LETTA_CASES:
            with self.subTest(name):
                r = self.execute((name, source, sch), args)
                self.assertEqual((r.status, r.func_return), R.e2b_result(name, json.dumps(
                    {"results": want, "agent_state": None}, separators=(",", ":"))), r)
                self.assertEqual(r.func_return, want)
                self.assertEqual(r.record.get("framing"), "typescript-json")

    def test_throw_in_both_modes(self):
        name, source, sch, args = THROW
        want = R.e2b_result(name, error=("Error", "This is an intentional test error"))
        for r in (self.run_tool((name, source, sch), args), self.execute((name, source, sch), args)):
            self.assertEqual((r.status, r.func_return), want, r)
            self.assertIn("Error: This is an intentional test error", "".join(r.stderr))

    def test_arguments_stay_data(self):
        r = self.run_tool(ECHO, {"s": HOSTILE, "n": 2})
        self.assertEqual((r.status, r.func_return), ("success", HOSTILE), r)
        self.assertEqual(r.stdout, ["echoing %d\n" % len(HOSTILE)])
        self.assertEqual(r.stderr, ["to stderr\n"])
        self.assertEqual(r.record.get("exit_code"), 0)

    def test_letta_agent_id(self):
        r = self.run_tool(AGENT_TOOL, {}, agent_id=AGENT)
        self.assertEqual(r.func_return, AGENT, r)
        r = self.execute(AGENT_TOOL, {}, agent_id=AGENT)
        self.assertEqual(r.func_return, AGENT, r)

    def test_bigint_fails_as_json_stringify_does(self):
        want = R.e2b_result("big", error=("TypeError", "Do not know how to serialize a BigInt"))
        for r in (self.run_tool(BIGINT, {}), self.execute(BIGINT, {})):
            self.assertEqual((r.status, r.func_return), want, r)

    def test_types_imports_and_arrow_function(self):
        r = self.run_tool(TYPED, {"p": {"a": 7}})
        self.assertEqual((r.status, r.func_return), ("success", "x/7"), r)

    def test_execute_completion_value_parsed_as_letta_does(self):
        # parse_typescript_result: not JSON is the text; JSON that is not an
        # object fails as Python's .get does.
        r = self.client.execute("'plain text';\n", tool_name="t", organization_id=ORG, source_type="typescript")
        self.assertEqual((r.status, r.func_return), ("success", "plain text"), r)
        r = self.client.execute("const a: number[] = [1, 2];\nJSON.stringify(a);\n", tool_name="t",
                                organization_id=ORG, source_type="typescript")
        self.assertEqual((r.status, r.func_return),
                         ("error", R.get_friendly_error_msg("t", "AttributeError", "'list' object has no attribute 'get'")))

    def test_timeout_kills_the_whole_tree(self):
        tag = "%d" % (time.time_ns() % 10**9)
        t0 = time.monotonic()
        r = self.run_tool(HANG, {"tag": tag}, timeout=2)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual(r.status, "error")
        self.assertEqual(r.record.get("end_reason"), "timeout", r.record)
        self.assertIn("timed out", r.func_return)
        self.assertEqual(sleepers(tag), [], "a process of the run outlived it")

    # --- policy ---------------------------------------------------------------

    def test_policy_without_typescript_refuses(self):
        with self.assertRaises(PolicyDeniedError) as cm:
            self.run_tool(AGENT_TOOL, {}, org="org-nots")
        self.assertIn("no \"typescript\" section", str(cm.exception))

    def test_missing_runtime_fails_the_run_set_up(self):
        # The daemon started with this policy; the run says what is missing.
        for r in (self.run_tool(AGENT_TOOL, {}, org="org-missing"), self.execute(AGENT_TOOL, {}, org="org-missing")):
            self.assertEqual(r.status, "error")
            self.assertEqual(r.record.get("setup_stage"), "typescript-runtime", r.record)
            self.assertIn("/usr/bin/node-not-installed-here", r.func_return)
            self.assertIn("is not installed on this host", r.func_return)

    def test_npm_requirements_come_only_from_the_shipped_tarball_directory(self):
        # The shipped policy builds a tool's node_modules offline from
        # /var/lib/toolsandbox/npm alone: a package not there is a failed
        # build, said in the result, and nothing ran.
        r = self.run_tool(AGENT_TOOL, {}, npm_requirements=["tsb-not-in-the-shipped-directory"])
        self.assertEqual(r.status, "error", r)
        self.assertEqual(r.record.get("detail"), "node_modules_build_failed", r.record)
        self.assertIn("/var/lib/toolsandbox/npm", r.record["error"])

    # --- the Letta adapter ----------------------------------------------------

    def test_letta_adapter_both_modes(self):
        name, source, sch, args, want = LETTA_CASES[0]
        user = SimpleNamespace(id="user-1", organization_id=ORG)

        def tool(npm):
            return SimpleNamespace(id="tool-ts", name=name, source_code=source, json_schema=sch, pip_requirements=None,
                                   source_type="typescript", npm_requirements=npm)

        async def go(mode, npm):
            script = R.generate_typescript_execution_script(name, source, args, sch) if mode == "script" else None
            sb = L.ToolSandboxDaemonSandbox(name, args, user, tool_object=tool(npm), mode=mode, script=script,
                                           socket_path=self.daemon.socket_path, agent_id=AGENT,
                                           raise_on_daemon_error=False)
            self.assertFalse(sb.inject_agent_state)
            return await sb.run(agent_state=SimpleNamespace(id=AGENT, get_agent_env_vars_as_dict=lambda: {}))

        for mode in ("tool", "script"):
            with self.subTest(mode):
                r = asyncio.run(go(mode, []))
                self.assertEqual((r.status, r.func_return), ("success", want), r)
                self.assertIsNone(r.agent_state)
                # npm requirements travel with the tool; the shipped policy
                # finds none of these in its tarball directory.
                r = asyncio.run(go(mode, [SimpleNamespace(name="tsb-not-in-the-shipped-directory", version="1.3.0")]))
                self.assertEqual(r.status, "error", r)
                self.assertIn("npm", r.func_return)


if __name__ == "__main__":
    unittest.main()
