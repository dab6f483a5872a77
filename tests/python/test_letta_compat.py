"""Letta compatibility: each tool through Letta's own local sandbox and
through the daemon, field by field.

The reference (letta_reference.py, written from letta-ai/letta) generates
Letta's current script for the tool and runs it bare with python3, the way
AsyncToolSandboxLocal does, and parses its output with Letta's rules. The
daemon runs the same tool two ways: the same generated script through
`execute`, and the tool itself in tool mode through the Letta adapter. Every
field of ToolExecutionResult must match, with one stated difference:

  stderr   Letta's traceback names its temporary script and the generated
           lines around the tool; the daemon's (tool mode) starts at the
           tool's own frame and script mode reads the script from stdin. So
           stderr is compared by its last line (the exception line, which is
           what Letta's error parsing reads) and by being empty or not.

Older generations go through `execute` too (SeedScripts): the seed's
ToolExecutionSandbox, whose pickled result the daemon decodes in a sandbox,
and the same generator after Letta switched to JSON (legacy-json); their
reference is that generator run bare and parsed as its server did. Timeouts,
environment names the policy fixes, fingerprints of local and E2B configs
and output past the cap have classes of their own.

Needs root (a real daemon, see daemon_fixture.py).

    /usr/bin/python3 -m unittest tests/python/test_letta_compat.py -v
"""

import asyncio
import json
import os
import shutil
import sys
import tempfile
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402
import letta_reference as ref  # noqa: E402
from toolsandbox_client import AsyncClient  # noqa: E402
from toolsandbox_client import letta as L  # noqa: E402

POLICIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "policies")
USER = SimpleNamespace(id="user-1", organization_id="org-00000000-0000-4000-8000-000000000000")
SANDBOX_CONFIG = {"type": "local", "organization_id": USER.organization_id,
                  "config": {"pip_requirements": [], "sandbox_dir": "/root/.letta/tool_execution_dir",
                             "use_venv": False, "venv_name": "venv"}}
# Letta's SandboxConfig.fingerprint() of SANDBOX_CONFIG (docs/PROTOCOL.md 13.3).
FINGERPRINT = "48408990033679363701484527775310645901996820373321982248109825766489622234136"


# AgentState.model_dump(mode="json") of an agent with two memory blocks and
# one secret, as letta-server hands it to a sandbox (tools and tool rules
# removed, as SandboxToolExecutor does).
def _block(label, value, block_id):
    return {"value": value, "limit": 5000, "project_id": None, "template_name": None, "is_template": False,
            "template_id": None, "base_template_id": None, "deployment_id": None, "entity_id": None,
            "preserve_on_migration": False, "label": label, "read_only": False, "description": "The " + label,
            "metadata": {}, "hidden": None, "id": block_id, "created_by_id": "user-1", "last_updated_by_id": "user-1",
            "tags": []}


AGENT_STATE_JSON = {
    "created_by_id": "user-1", "last_updated_by_id": "user-1", "created_at": "2026-11-30T09:00:00Z",
    "updated_at": "2026-11-30T09:05:00Z", "id": "agent-00000000-0000-4000-8000-000000000001", "name": "helper",
    "tool_rules": [], "message_ids": ["message-1"], "system": "You are helpful.", "agent_type": "letta_v1_agent",
    "llm_config": {"model": "gpt-4o-mini", "model_endpoint_type": "openai", "context_window": 128000,
                   "temperature": 0.7},
    "embedding_config": None, "model": "openai/gpt-4o-mini", "embedding": None, "description": None,
    "metadata": {"team": "support"},
    "memory": {"agent_type": "letta_v1_agent", "git_enabled": False,
               "blocks": [_block("human", "Name: Ada", "block-human"), _block("persona", "I am helpful.", "block-persona")],
               "file_blocks": [], "prompt_template": ""},
    "blocks": [_block("human", "Name: Ada", "block-human"), _block("persona", "I am helpful.", "block-persona")],
    "tools": [], "sources": [], "tags": ["prod"],
    "tool_exec_environment_variables": [],
    "secrets": [{"key": "WEATHER_KEY", "value": "w-123", "description": None, "agent_id": "agent-1"}],
    "project_id": None, "template_id": None, "identity_ids": [], "identities": [], "message_buffer_autoclear": False,
    "timezone": "UTC", "hidden": None,
}


class _AgentState:
    """Quacks like Letta's AgentState for the adapter."""

    id = AGENT_STATE_JSON["id"]
    project_id = None

    def model_dump(self, mode="python"):
        return json.loads(json.dumps(AGENT_STATE_JSON))

    def get_agent_env_vars_as_dict(self):
        return {v["key"]: v["value"] for v in AGENT_STATE_JSON["secrets"]}


AGENT_STATE = _AgentState()


def schema(name, **props):
    return {"name": name, "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}}


# name: (source, args, json_schema)
CASES = {
    "plain_int": ("def add(a: int, b: int) -> int:\n    print('adding', a, b)\n    return a + b\n",
                  {"a": 2, "b": 3}, schema("add", a="integer", b="integer")),
    "string_with_quotes": ("def echo(s: str) -> str:\n    return s + '!'\n",
                           {"s": "it's \"quoted\" \\ and\nnew line"}, schema("echo", s="string")),
    "structured": ("def data() -> dict:\n    return {'xs': [1, 2.5, None, True], 'name': 'n\u00e9', 'nested': {'k': []}}\n",
                   {}, schema("data")),
    "returns_none": ("def nothing():\n    print('side effect')\n", {}, schema("nothing")),
    "zero_division": ("def div(a: int, b: int) -> float:\n    return a / b\n", {"a": 1, "b": 0},
                      schema("div", a="integer", b="integer")),
    "empty_message": ("def f():\n    raise ValueError()\n", {}, schema("f")),
    "multi_line_message": ("def f():\n    raise RuntimeError('first line\\nsecond line')\n", {}, schema("f")),
    "class_not_named_error": ("class Boom(Exception):\n    pass\n\ndef f():\n    raise Boom('bang')\n", {}, schema("f")),
    "custom_error_class": ("class QuotaError(Exception):\n    pass\n\ndef f():\n    raise QuotaError('over quota')\n",
                           {}, schema("f")),
    "error_at_import": ("import no_such_module_for_letta_compat\n\ndef f():\n    return 1\n", {}, schema("f")),
    "stderr_then_return": ("import sys\n\ndef f():\n    print('careful', file=sys.stderr)\n    return 'ok'\n",
                           {}, schema("f")),
    "sys_exit_0": ("import sys\n\ndef f():\n    print('leaving')\n    sys.exit(0)\n", {}, schema("f")),
    "sys_exit_none": ("def f():\n    raise SystemExit\n", {}, schema("f")),
    "sys_exit_3": ("import sys\n\ndef f():\n    sys.exit(3)\n", {}, schema("f")),
    "sys_exit_message": ("import sys\n\ndef f():\n    sys.exit('bye now')\n", {}, schema("f")),
    "error_printed_then_exit": ("import sys\n\ndef f():\n    print('KeyError: missing', file=sys.stderr)\n    sys.exit(2)\n",
                                {}, schema("f")),
    "main_block_and_file": ("import os\nif __name__ == '__main__':\n    print('main block ran')\n\n"
                            "def f():\n    return [__name__, os.path.basename(__file__).endswith('.py'),"
                            " os.path.exists(__file__), os.path.dirname(__file__) == os.getcwd()]\n", {}, schema("f")),
    "async_tool": ("import asyncio\n\nasync def f(n: int) -> int:\n    await asyncio.sleep(0)\n    return n * 2\n",
                   {"n": 21}, schema("f", n="integer")),
    "keyword_only_agent_state": ("def f(*, agent_state=None):\n    return agent_state is None\n", {}, schema("f")),
    # Output that is not UTF-8: Letta's strict decode fails the run.
    "non_utf8_stdout": ("import sys\n\ndef f():\n    sys.stdout.buffer.write(b'ok \\xff\\xfe done\\n')\n    return 1\n",
                        {}, schema("f")),
    "non_utf8_stderr": ("import sys\n\ndef f():\n    sys.stderr.buffer.write(b'warn \\xe2\\x82\\n')\n    return 1\n",
                        {}, schema("f")),
    "lone_surrogate_printed": ("def f():\n    print('x\\udcff y')\n    return 1\n", {}, schema("f")),
    # Values json.dumps writes and json.loads reads back exactly, and
    # strict JSON cannot hold: the reply keeps them as the tool's Python
    # wrote them.
    "big_ints": ("def f():\n    return [2**70, -2**64 - 1, 10**30, {'n': 3**90}]\n", {}, schema("f")),
    # Past Python's digit limit json.dumps raises in Letta's script.
    "int_past_the_digit_limit": ("def f():\n    return 10**5000\n", {}, schema("f")),
    "non_finite_floats": ("def f():\n    return [float('nan'), float('inf'), -float('inf'), 1.5, {'x': float('nan')}]\n",
                          {}, schema("f")),
    "float_spelling": ("def f():\n    return [0.1 + 0.2, 1e300 * 10, 5e-324, 123456789012345678.0, 1.0, -0.0]\n",
                       {}, schema("f")),
    "lone_surrogate_returned": ("def f():\n    return ['x\\udcff y', {'k\\ud800': 1}]\n", {}, schema("f")),
    "keys_of_other_types": ("def f():\n    return {1: 'a', 2.5: 'b', None: 'c', True: 'd', '1': 'e'}\n", {}, schema("f")),
    # agent_state: Letta's AgentState in Letta's script, the same API in
    # tool mode (letta's own model where the venv has letta, else the
    # runner's stand-in); the tool's changes come back.
    "agent_state_read": ("def f(agent_state, agent_id):\n"
                         "    m = agent_state.memory\n"
                         "    return [type(agent_state).__name__, agent_state.id == agent_id, agent_state.name,\n"
                         "            m.get_block('human').value, m.list_block_labels(), len(m.get_blocks()),\n"
                         "            agent_state.llm_config.model, agent_state.metadata, agent_state.tags,\n"
                         "            agent_state.get_agent_env_vars_as_dict(), type(m.blocks[0]).__name__,\n"
                         "            sorted(dict(agent_state))[:3], m.get_block('persona').limit]\n", {}, schema("f")),
    "agent_state_write": ("def f(agent_state, note: str):\n"
                          "    m = agent_state.memory\n"
                          "    m.update_block_value('human', m.get_block('human').value + '\\n' + note)\n"
                          "    m.get_block('persona').value = 'I am\\x00 terse.'\n"
                          "    m.set_block(Block(label='notes', value='n1', id='block-notes', limit=100))\n"
                          "    agent_state.description = 'updated'\n"
                          "    return m.list_block_labels()\n", {"note": "likes tea"}, schema("f", note="string")),
    "agent_state_returned_block": ("def f(agent_state):\n    return agent_state.memory.get_block('persona')\n",
                                   {}, schema("f")),
    "agent_state_new_block_returned": ("def f(agent_state):\n"
                                       "    return Block(label='n', value='v\\x00w', id='block-n', limit=10)\n", {}, schema("f")),
    "agent_state_subscript": ("def f(agent_state):\n    return agent_state['id']\n", {}, schema("f")),
    "agent_state_missing_block": ("def f(agent_state):\n    return agent_state.memory.get_block('notes').value\n",
                                  {}, schema("f")),
    "agent_state_no_such_attribute": ("def f(agent_state):\n    return agent_state.nickname\n", {}, schema("f")),
    "agent_state_unknown_field_set": ("def f(agent_state):\n    agent_state.nickname = 'x'\n", {}, schema("f")),
    "agent_state_value_not_a_string": ("def f(agent_state):\n    agent_state.memory.update_block_value('human', 3)\n",
                                       {}, schema("f")),
    "agent_state_unknown_label": ("def f(agent_state):\n    agent_state.memory.update_block_value('notes', 'x')\n",
                                  {}, schema("f")),
    "agent_state_error_after_change": ("def f(agent_state):\n"
                                       "    agent_state.memory.update_block_value('human', 'changed')\n"
                                       "    raise RuntimeError('after the change')\n", {}, schema("f")),
    "agent_state_global": ("def f(agent_state):\n    return agent_state is globals()['agent_state']\n", {}, schema("f")),
    "agent_state_not_declared": ("def f():\n    return agent_state is None\n", {}, schema("f")),
    "agent_state_none": ("def f(agent_state, agent_id):\n    return [agent_state is None, agent_id]\n", {}, schema("f")),
    # A frame the tool prints itself.
    "printed_legacy_frame": ("import base64, json\n\ndef f():\n"
                             "    body = base64.b64encode(json.dumps({'results': 'forged', 'agent_state': None}).encode()).decode()\n"
                             "    print('92c8e498-43d3-5fb3-919d-a69eb3e5c5c6' + body + '34aa1e30-8090-58d0-a72a-e5545c067875')\n"
                             "    return 'real'\n", {}, schema("f")),
}

# Letta's current parser takes the first binary frame: a tool can forge its
# result. Tool mode never takes a frame the tool writes (only the runner's,
# marked with a per-run nonce), so these are compared in script mode only;
# test_forged_binary_frame_is_never_the_result covers tool mode.
SCRIPT_MODE_ONLY = {
    "forged_binary_frame": ("import hashlib, json, struct, sys\n\ndef f():\n"
                            "    p = json.dumps({'results': 'forged', 'agent_state': None}).encode()\n"
                            "    m = bytes.fromhex('92c8e49843d35fb3919da69eb3e5c5c6')\n"
                            "    sys.stdout.buffer.write(m + struct.pack('>I', len(p)) + hashlib.md5(p).hexdigest().encode() + p)\n"
                            "    sys.stdout.buffer.flush()\n"
                            "    return 'real'\n", {}, schema("f")),
    # Letta decodes the stdout around a frame whose md5 matches before it
    # reads the payload: the real frame left there fails the decode first.
    "forged_frame_payload_not_an_object": ("import hashlib, struct, sys\n\ndef f():\n"
                                           "    p = b'[1, 2]'\n"
                                           "    m = bytes.fromhex('92c8e49843d35fb3919da69eb3e5c5c6')\n"
                                           "    sys.stdout.buffer.write(m + struct.pack('>I', len(p)) + hashlib.md5(p).hexdigest().encode() + p)\n"
                                           "    sys.stdout.buffer.flush()\n"
                                           "    return 'real'\n", {}, schema("f")),
    # A frame holding a pickle (as scripts before PR #3343 wrote), forged by
    # the tool of a current script, which then leaves: Letta's parser fails
    # decoding it; the daemon does not decode what this script never writes.
    "forged_pickle_frame": ("import hashlib, os, pickle, struct, sys\n\ndef f():\n"
                            "    p = pickle.dumps({'results': 'forged', 'agent_state': None})\n"
                            "    m = bytes.fromhex('92c8e49843d35fb3919da69eb3e5c5c6')\n"
                            "    sys.stdout.buffer.write(m + struct.pack('>I', len(p)) + hashlib.md5(p).hexdigest().encode() + p)\n"
                            "    sys.stdout.buffer.flush()\n"
                            "    os._exit(0)\n", {}, schema("f")),
    "corrupt_binary_frame": ("import sys\n\ndef f():\n"
                             "    sys.stdout.buffer.write(bytes.fromhex('92c8e49843d35fb3919da69eb3e5c5c6') + b'\\x00\\x00\\x00\\x05' + b'0' * 32 + b'hello')\n"
                             "    sys.stdout.buffer.flush()\n"
                             "    return 'real'\n", {}, schema("f")),
}
CASES.update(SCRIPT_MODE_ONLY)

# Output that is not UTF-8 costs a Letta tool its result (a strict decode of
# the output that carries it); tool mode keeps the result and decodes the
# output as Python's errors="replace" does.
READ_LENIENTLY_IN_TOOL_MODE = {"non_utf8_stdout", "non_utf8_stderr", "lone_surrogate_printed"}

# The agent state each case is called with (Letta passes the agent's, or None
# for a tool run without an agent).
NO_AGENT = {"agent_state_none"}
AGENT_STATE_CASES = sorted(n for n in CASES if n.startswith("agent_state"))


def agent_state_json(name):
    return None if name in NO_AGENT else json.loads(json.dumps(AGENT_STATE_JSON))


def exact(value):
    return json.dumps(value, allow_nan=True)


def typed(value):
    """value with its types spelled out, sets in a stable order: equal only
    for equal values of equal types (1, 1.0 and True, a tuple and a list, a
    set and a frozenset, bytes and bytearray differ)."""
    if isinstance(value, dict):
        return ["dict", [[typed(k), typed(v)] for k, v in value.items()]]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [typed(v) for v in value]]
    if isinstance(value, (set, frozenset)):
        return [type(value).__name__, sorted((typed(v) for v in value), key=repr)]
    return [type(value).__name__, repr(value)]


def last_line(stderr):
    if not stderr:
        return None
    return stderr[0].rstrip("\n").split("\n")[-1]


class Harness(unittest.TestCase):
    """A daemon and the reference; no tests of its own."""

    # Whether the daemon's venv has letta (the stand-in): the reference's
    # always has it, as letta-server's own environment does.
    LETTA_IN_DAEMON_VENV = True

    @classmethod
    def setUpClass(cls):
        # The reference's venv (letta_reference.make_venv), the same for the
        # daemon unless LETTA_IN_DAEMON_VENV is false, and the shipped
        # policies pointed at the daemon's.
        F.require_daemon()
        cls.tmp = tempfile.mkdtemp(prefix="tsb-compat-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        os.chmod(cls.tmp, 0o755)
        venv = os.path.join(cls.tmp, "venv")
        cls.python = ref.make_venv(venv)
        if not cls.LETTA_IN_DAEMON_VENV:
            venv = os.path.join(cls.tmp, "venv-without-letta")
            ref.make_venv(venv, letta=False)
        policies = os.path.join(cls.tmp, "policies")
        os.mkdir(policies)
        os.chmod(policies, 0o755)
        for name in ("default.json", "privileged.json"):
            with open(os.path.join(POLICIES, name)) as f:
                text = f.read()
            assert name != "default.json" or "\"/var/lib/toolsandbox/venv\"" in text, name
            with open(os.path.join(policies, name), "w") as f:
                f.write(text.replace('"/var/lib/toolsandbox/venv"', json.dumps(venv)))
            os.chmod(os.path.join(policies, name), 0o644)
        shutil.copytree(os.path.join(POLICIES, "seccomp"), os.path.join(policies, "seccomp"))
        for root, dirs, files in os.walk(policies):
            for n in dirs + files:
                os.chmod(os.path.join(root, n), 0o755 if n in dirs else 0o644)
        cls.daemon = F.start_daemon(cls, policies_dir=policies)
        cls.references = {}

    def reference(self, name, decode_errors="strict"):
        if (name, decode_errors) not in self.references:
            source, args, json_schema = CASES[name]
            tool_name = json_schema["name"]
            state = agent_state_json(name)
            # Letta's environment layers include the agent's secrets.
            env = {v["key"]: v["value"] for v in state["secrets"]} if state else {}
            self.references[name, decode_errors] = ref.run_local(tool_name, source, args, json_schema, self.python,
                                                                  env=env, agent_state=state,
                                                                  decode_errors=decode_errors)
        return self.references[name, decode_errors]

    def through_adapter(self, name):
        source, args, json_schema = CASES[name]
        tool_name = json_schema["name"]
        tool = SimpleNamespace(id="tool-1", name=tool_name, source_code=source, json_schema=json_schema,
                               pip_requirements=None)

        async def go():
            client = AsyncClient(self.daemon.socket_path, timeout=60)
            sb = L.ToolSandboxDaemonSandbox(tool_name, args, USER, tool_object=tool, sandbox_config=SANDBOX_CONFIG,
                                            client=client, resolve_from_letta=False)
            # An agent state with every call: only a tool that declares it
            # (as Letta decides it) may receive it.
            return await sb.run(agent_state=None if name in NO_AGENT else AGENT_STATE)

        return asyncio.run(go())

    def through_execute(self, name):
        source, args, json_schema = CASES[name]
        tool_name = json_schema["name"]
        script = ref.letta_script(tool_name, source, args, json_schema, self.python, agent_state_json(name))
        state = agent_state_json(name)
        env = {v["key"]: v["value"] for v in state["secrets"]} if state else None

        async def go():
            client = AsyncClient(self.daemon.socket_path, timeout=60)
            return await client.execute(script, tool_name=tool_name, organization_id=USER.organization_id,
                                        sandbox_config=SANDBOX_CONFIG, env=env)

        return asyncio.run(go())

    def assert_same(self, name, got, how, decode_errors="strict"):
        want = self.reference(name, decode_errors)
        fields = {k: getattr(got, k) for k in ("status", "func_return", "agent_state", "stdout", "stderr")}
        where = "%s through %s" % (name, how)
        self.assertEqual(fields["status"], want["status"], (where, fields, want))
        # Exact: by their JSON text (1 and 1.0 differ, NaN equals NaN, keys
        # in order).
        self.assertEqual(exact(fields["func_return"]), exact(want["func_return"]), (where, fields, want))
        self.assertEqual(fields["agent_state"], want["agent_state"], (where, fields, want))
        self.assertEqual(fields["stdout"], want["stdout"], (where, fields, want))
        self.assertEqual(bool(fields["stderr"]), bool(want["stderr"]), (where, fields, want))
        self.assertEqual(last_line(fields["stderr"]), last_line(want["stderr"]), (where, fields, want))
        self.assertEqual(got.sandbox_config_fingerprint, FINGERPRINT, where)



class LettaCompat(Harness):
    def test_reference_is_lettas_behaviour(self):
        # The reference itself, on cases whose Letta result is known.
        self.assertEqual(self.reference("plain_int")["func_return"], 5)
        self.assertEqual(self.reference("sys_exit_0"),
                         {"status": "success", "func_return": None, "agent_state": None, "stdout": ["leaving\n"],
                          "stderr": []})
        self.assertEqual(self.reference("empty_message")["func_return"], "Error executing function f: : ")
        self.assertEqual(self.reference("main_block_and_file")["func_return"], ["__main__", True, True, True])


def letta_fingerprint(config):
    return ref.sandbox_config_fingerprint(config)


class Timeouts(Harness):
    """Letta's local sandbox raises TimeoutError past tool_sandbox_timeout;
    its manager reports it (stdout: PROTOCOL.md 13.2)."""

    SOURCE = "import time\n\ndef f():\n    print('starting', flush=True)\n    time.sleep(30)\n"

    def test_the_timeout_message_and_status_are_lettas(self):
        want = ref.run_local("f", self.SOURCE, {}, schema("f"), self.python, timeout=1.0)
        for how in ("tool", "script"):
            async def go():
                client = AsyncClient(self.daemon.socket_path, timeout=60)
                if how == "script":
                    script = ref.letta_script("f", self.SOURCE, {}, schema("f"), self.python)
                    return await client.execute(script, tool_name="f", organization_id=USER.organization_id,
                                                timeout=1.0)
                return await client.run_tool(self.SOURCE, tool_name="f", args={}, organization_id=USER.organization_id,
                                             timeout=1.0)

            got = asyncio.run(go())
            self.assertEqual((got.status, got.func_return, got.agent_state),
                             (want["status"], want["func_return"], want["agent_state"]), how)
            self.assertEqual(last_line(got.stderr), last_line(want["stderr"]), how)
            self.assertEqual(got.record["end_reason"], "timeout")
            self.assertEqual((got.record["timeout_requested_s"], got.record["timeout_applied_s"]), (1.0, 1.0))

    def test_a_timeout_above_the_policy_is_capped_and_said(self):
        L._capped_timeouts.clear()  # warned once per process: whatever ran before
        sb = L.ToolSandboxDaemonSandbox("f", {}, USER, source_code="def f():\n    return 1\n", timeout=180.0,
                                        socket_path=self.daemon.socket_path, resolve_from_letta=False)
        with self.assertLogs("toolsandbox_client", "WARNING") as logs:
            r = asyncio.run(sb.run())
        self.assertEqual(r.func_return, 1)
        self.assertTrue(any("180" in line and "60" in line for line in logs.output), logs.output)


class EnvironmentAndFingerprints(Harness):
    def test_a_config_setting_a_policy_fixed_name_runs_and_the_policy_value_wins(self):
        # Letta passes LANG through; the daemon keeps the policy's LANG
        # (PROTOCOL.md 6.6) and says so, and the call runs.
        source = "import os\n\ndef f():\n    return [os.environ.get('A'), os.environ.get('LANG')]\n"
        want = ref.run_local("f", source, {}, schema("f"), self.python, env={"LANG": "xx_XX.UTF-8", "A": "config"})
        self.assertEqual(want["func_return"], ["config", "xx_XX.UTF-8"])
        sb = L.ToolSandboxDaemonSandbox("f", {}, USER, source_code=source, socket_path=self.daemon.socket_path,
                                        sandbox_config=SANDBOX_CONFIG, resolve_from_letta=False,
                                        sandbox_config_env_vars={"LANG": "xx_XX.UTF-8", "A": "config"})
        got = asyncio.run(sb.run())
        self.assertEqual(got.status, want["status"])
        self.assertEqual(got.func_return[0], "config")
        self.assertNotEqual(got.func_return[1], "xx_XX.UTF-8")

        async def go():
            client = AsyncClient(self.daemon.socket_path, timeout=60)
            return await client.run_tool(source, tool_name="f", args={}, organization_id=USER.organization_id,
                                         env={"LANG": "xx_XX.UTF-8", "A": "config"})

        self.assertEqual(asyncio.run(go()).record["env_overridden"], ["LANG"])

    def test_fingerprints_of_local_and_e2b_configs_are_lettas(self):
        e2b = {"type": "e2b", "organization_id": "org-of-the-config",
               "config": {"template": "t-1", "timeout": 300, "pip_requirements": ["six==1.16.0"]}}
        local = dict(SANDBOX_CONFIG, config=dict(SANDBOX_CONFIG["config"], sandbox_dir="/srv/tools \u00e9"))
        self.assertEqual(letta_fingerprint(SANDBOX_CONFIG), FINGERPRINT)
        for config in (SANDBOX_CONFIG, local, e2b):
            async def go():
                client = AsyncClient(self.daemon.socket_path, timeout=60)
                return await client.run_tool("def f():\n    return 1\n", tool_name="f", args={},
                                             organization_id=USER.organization_id, sandbox_config=config)

            got = asyncio.run(go())
            self.assertEqual(got.sandbox_config_fingerprint, letta_fingerprint(config), config)

    def test_a_config_without_an_organization_has_lettas_fingerprint(self):
        # SandboxConfig.organization_id is Optional: None is hashed as null,
        # not replaced by the request's organization.
        config = dict(SANDBOX_CONFIG, organization_id=None)
        want = letta_fingerprint(config)
        self.assertNotEqual(want, FINGERPRINT)

        import enum

        class SandboxType(enum.Enum):
            LOCAL = "local"

        class Config:  # as Letta's SandboxConfig, through the adapter
            id = "sandbox-config-1"
            type = SandboxType.LOCAL
            organization_id = None

        Config.config = config["config"]
        sb = L.ToolSandboxDaemonSandbox("f", {}, USER, source_code="def f():\n    return 1\n",
                                        socket_path=self.daemon.socket_path, sandbox_config=Config(),
                                        resolve_from_letta=False)
        got = asyncio.run(sb.run())
        self.assertEqual((got.func_return, got.sandbox_config_fingerprint), (1, want))

        async def go():
            client = AsyncClient(self.daemon.socket_path, timeout=60)
            return await client.run_tool("def f():\n    return 1\n", tool_name="f", args={},
                                         organization_id=USER.organization_id, sandbox_config=config)

        self.assertEqual(asyncio.run(go()).sandbox_config_fingerprint, want)


class OutputPastTheCap(Harness):
    """Letta returns the result however much the tool printed; so does the
    daemon, with stdout cut at the policy's cap (PROTOCOL.md 13.2)."""

    CAP = 1 << 20  # policies/default.json limits.stdout
    SOURCE = ("import sys\n\ndef f(n: int):\n    line = 'x' * 1023 + '\\n'\n"
              "    for _ in range(n):\n        sys.stdout.write(line)\n    print('tail', file=sys.stderr)\n"
              "    return {'printed': n * 1024, 'big': 2**80}\n")

    def check(self, got, want, how):
        self.assertEqual(want["status"], "success")
        self.assertEqual(len(want["stdout"][0]), 3 * self.CAP)
        self.assertEqual(got.status, want["status"], how)
        self.assertEqual(exact(got.func_return), exact(want["func_return"]), how)
        self.assertEqual(got.stderr, want["stderr"], how)
        self.assertEqual(len(got.stdout), 1, how)
        self.assertEqual(got.stdout[0], want["stdout"][0][:self.CAP], how)

    def test_tool_and_script_mode_keep_the_result(self):
        CASES["output_past_the_cap"] = (self.SOURCE, {"n": 3 * 1024}, schema("f", n="integer"))
        try:
            want = self.reference("output_past_the_cap")
            self.check(self.through_adapter("output_past_the_cap"), want, "tool mode")
            got = self.through_execute("output_past_the_cap")
            self.check(got, want, "script mode")
            self.assertTrue(got.record["stdout_truncated"])
            self.assertEqual(got.record["end_reason"], "exited")
            self.assertGreater(got.record["stdout_bytes"], 3 * self.CAP)
        finally:
            del CASES["output_past_the_cap"]


class LettasLargestReturn(Harness):
    """Letta keeps a return whole up to its largest return_char_limit,
    1,000,000 characters, then cuts it; here the characters take 4 bytes of
    UTF-8 and 12 of the JSON's escapes, past the 1 MiB stdout cap. The
    result has a limit of its own (limits.result, PROTOCOL.md 13.2)."""

    SOURCE = "def f(n: int):\n    print('big')\n    return '\\U0001F600' * n\n"

    def test_a_million_four_byte_characters_come_back_whole(self):
        CASES["largest_return"] = (self.SOURCE, {"n": 1_000_000}, schema("f", n="integer"))
        try:
            want = self.reference("largest_return")
            self.assertEqual((want["status"], len(want["func_return"])), ("success", 1_000_000))
            self.assertEqual(len(want["func_return"].encode("utf-8")), 4_000_000)
            for how, got in (("tool mode", self.through_adapter("largest_return")),
                             ("script mode", self.through_execute("largest_return"))):
                self.assertEqual((got.status, got.stdout, got.stderr), (want["status"], want["stdout"], want["stderr"]),
                                 how)
                self.assertTrue(got.func_return == want["func_return"], how)
        finally:
            del CASES["largest_return"]


class ToolModeIsSaferThanLetta(Harness):
    """Where Letta is unsafe, tool mode differs on purpose (PROTOCOL.md 13.2)."""

    def test_forged_binary_frame_is_never_the_result(self):
        # Letta takes the forged frame, and then fails on the real one left
        # in stdout (not UTF-8). Tool mode ignores it: the forged bytes stay
        # stdout (not UTF-8 either: shown as errors="replace" shows them),
        # and the tool's own result is returned.
        want = self.reference("forged_binary_frame")
        self.assertEqual(want["status"], "error")
        self.assertTrue(want["func_return"].startswith("Error executing function f: UnicodeDecodeError: "), want)
        got = self.through_adapter("forged_binary_frame")
        self.assertEqual((got.status, got.func_return), ("success", "real"), got)
        self.assertIn('{"results": "forged"', got.stdout[0])
        self.assertIn("\ufffd", got.stdout[0])

    def test_corrupt_frame_printed_by_the_tool_is_plain_output(self):
        got = self.through_adapter("corrupt_binary_frame")
        # Letta says "Function ran, but output is corrupted." only for its
        # own frame whose checksum does not match; a frame the runner did
        # not write is the tool's output, and the result is the tool's.
        want = self.reference("corrupt_binary_frame", decode_errors="replace")
        self.assertIn("output is corrupted", want["func_return"])
        self.assertEqual((got.status, got.func_return), ("success", "real"), got)
        self.assertTrue(got.stdout[0].endswith("hello"), got.stdout)
        self.assertIn("\ufffd", got.stdout[0])  # the marker, not UTF-8


# Tools run through the seed's own generator (ToolExecutionSandbox before
# PR #3343): its result is base64(pickle) between the text markers, which the
# seed's server pickle.loads-ed; and through the same generator after it
# (legacy-json: base64 of JSON between the same markers). The daemon decodes it in a sandbox, into
# plain data (PROTOCOL.md 13.1); the reference is the seed's server, whose
# result is compared as the JSON it becomes.
# The seed injects agent_state only (no agent_id).
SEED_ONLY = {
    "seed_agent_state_read": ("def f(agent_state):\n"
                              "    m = agent_state.memory\n"
                              "    return [type(agent_state).__name__, agent_state.id, agent_state.name,\n"
                              "            m.get_block('human').value, m.list_block_labels(), agent_state.llm_config.model,\n"
                              "            agent_state.metadata, agent_state.get_agent_env_vars_as_dict()]\n", {}, schema("f")),
    "seed_agent_state_none": ("def f(agent_state):\n    return agent_state is None\n", {}, schema("f")),
    "seed_tuple_result": ("def f():\n    return (1, ('a', None), [2.5])\n", {}, schema("f")),
}
NO_AGENT.add("seed_agent_state_none")
# Values JSON has no type for: the seed's server held them as they were.
SEED_PYTHON_TYPES = {
    "seed_python_types": ("def f():\n"
                          "    return (1, ('a', None), [2.5, b'\\x00\\xff'], bytearray(b'xy'), set(),\n"
                          "            {1: 'a', 2.5: 'b', None: 'c', False: 'd', float('inf'): 'e',\n"
                          "             'k': {frozenset({(1, 2)}), 3, b'z'}, (1, 2): 'tuple key'})\n", {}, schema("f")),
}
SEED_CASES = ["plain_int", "string_with_quotes", "structured", "returns_none", "stderr_then_return", "big_ints",
              "non_finite_floats", "float_spelling", "lone_surrogate_returned", "keys_of_other_types",
              "agent_state_write", "agent_state_returned_block"] + sorted(SEED_ONLY)


class SeedScripts(Harness):
    def seed_reference(self, name, json_result=False):
        source, args, json_schema = SEED_ONLY.get(name) or CASES[name]
        state = agent_state_json(name)
        env = {v["key"]: v["value"] for v in state["secrets"]} if state else {}
        return ref.run_seed(json_schema["name"], source, args, json_schema, self.python, env=env, agent_state=state,
                            json_result=json_result)

    def seed_through_execute(self, name, script=None, json_result=False):
        source, args, json_schema = (SEED_ONLY.get(name) or CASES[name]) if name else ("", {}, {"name": "f"})
        state = agent_state_json(name) if name else None
        if script is None:
            script = ref.seed_script(json_schema["name"], source, args, json_schema, self.python, state, json_result)
        env = {v["key"]: v["value"] for v in state["secrets"]} if state else None

        async def go():
            client = AsyncClient(self.daemon.socket_path, timeout=60)
            return await client.execute(script, tool_name=json_schema["name"], organization_id=USER.organization_id,
                                        sandbox_config=SANDBOX_CONFIG, env=env)

        return asyncio.run(go())

    def test_a_forged_pickle_runs_nothing_and_comes_back_as_data(self):
        # The seed's server would run os.system on this (the first frame
        # wins). The daemon's decoder builds no class the payload names.
        import base64
        import pickle

        class Evil:
            def __reduce__(self):
                return (os.system, ("touch /tmp/pwned",))

        forged = base64.b64encode(pickle.dumps({"results": Evil(), "agent_state": None})).decode()
        source = ("def f():\n    print(%r + %r + %r)\n    return 'real'\n" % (ref.LEGACY_START, forged, ref.LEGACY_END))
        CASES["seed_forged_pickle"] = (source, {}, schema("f"))
        try:
            got = self.seed_through_execute("seed_forged_pickle")
        finally:
            del CASES["seed_forged_pickle"]
        self.assertEqual(got.status, "success", got)
        self.assertEqual(got.func_return, "touch /tmp/pwned")  # the call's argument, never called
        self.assertTrue(got.record["pickle_decoded"], got.record)
        self.assertIsInstance(got.record["pickle_decode_run_id"], str)

    def test_a_binary_frame_of_a_pickle_is_decoded_too(self):
        # Letta's asyncio sandbox before PR #3343 wrote the pickle in the
        # binary frame (md5-checked), its stdout strict UTF-8.
        script = ("import hashlib, pickle, struct, sys\nprint('before')\n"
                  "p = pickle.dumps({'results': [1, 2**70, {'k': (None, 1.5)}], 'agent_state': None})\n"
                  "sys.stdout.buffer.write(%r + struct.pack('>I', len(p)) + hashlib.md5(p).hexdigest().encode() + p)\n"
                  % (ref.START_MARKER,))
        got = self.seed_through_execute(None, script)
        self.assertEqual(got.status, "success", got)
        self.assertEqual(exact(got.func_return), exact([1, 2**70, {"k": [None, 1.5]}]))
        self.assertEqual(got.stdout, ["before\n"])
        self.assertTrue(got.record["pickle_decoded"])

    def test_output_that_is_not_utf8_fails_as_in_the_seeds_server(self):
        # Its server read the output with subprocess.run(text=True): a
        # UnicodeDecodeError raised out of the sandbox, which the manager
        # reports (stderr: the daemon's captured output and the exception's
        # line, PROTOCOL.md 13.2).
        for name in ("non_utf8_stdout", "non_utf8_stderr"):
            for json_result in (False, True):
                want = self.seed_reference(name, json_result)
                self.assertTrue(want["func_return"].startswith("Error executing function f: UnicodeDecodeError: "),
                                want)
                got = self.seed_through_execute(name, json_result=json_result)
                where = (name, json_result, got, want)
                self.assertEqual((got.status, got.func_return), (want["status"], want["func_return"]), where)
                self.assertEqual(got.stderr[-1], last_line(want["stderr"]), where)
                self.assertIsNone(got.agent_state, where)
                self.assertEqual(got.record["utf8_error"], want["func_return"].split("UnicodeDecodeError: ", 1)[1])

    def test_pickled_python_types_come_back_through_the_adapter(self):
        # The seed's server held the pickle's own values: tuples, sets,
        # bytes, keys of other types. The daemon's plain data says which they
        # were (record.pickle_types); the adapter rebuilds them. A tuple key
        # stays its str() (PROTOCOL.md 13.1).
        source, args, json_schema = SEED_PYTHON_TYPES["seed_python_types"]
        want = ref.run_seed("f", source, args, json_schema, self.python, python_values=True)["func_return"]
        script = ref.seed_script("f", source, args, json_schema, self.python)
        sb = L.ToolSandboxDaemonSandbox("f", {}, USER, mode="script", script=script, sandbox_config=SANDBOX_CONFIG,
                                        socket_path=self.daemon.socket_path, resolve_from_letta=False)
        got = asyncio.run(sb.run())
        self.assertEqual(got.status, "success", got)
        want_key = "(1, 2)"
        self.assertIn((1, 2), want[5])
        want[5][want_key] = want[5].pop((1, 2))
        self.assertEqual(typed(got.func_return), typed(want))
        through = self.seed_through_execute(None, script)
        self.assertEqual(through.func_return[:3], [1, ["a", None], [2.5, "b'\\x00\\xff'"]])  # plain data, as before
        self.assertEqual(typed(through.python_func_return()), typed(want))
        self.assertTrue(through.record["pickle_types"])

    def test_a_payload_that_is_not_a_pickle_fails_as_pickle_loads(self):
        import base64
        import pickle

        junk = b"\x80\x04\x95 not really a pickle"
        try:
            pickle.loads(junk)
        except Exception as e:
            want = L.friendly_error_msg("f", type(e).__name__, str(e))
        script = "import sys\nsys.stdout.write(%r + %r + %r)\n" % (
            ref.LEGACY_START, base64.b64encode(junk).decode(), ref.LEGACY_END)
        got = self.seed_through_execute(None, script)
        self.assertEqual(got.status, "error")
        self.assertEqual(got.func_return, want)
        self.assertTrue(got.record["opaque_pickle"])
        self.assertIn("pickle_error", got.record)


def _add_seed_case(name):
    def check(self, json_result):
        want = self.seed_reference(name, json_result)
        got = self.seed_through_execute(name, json_result=json_result)
        where = "%s through execute (the %s script)" % (name, "legacy-json" if json_result else "seed's")
        self.assertEqual(got.status, want["status"], (where, got, want))
        self.assertEqual(exact(got.func_return), exact(want["func_return"]), (where, got, want))
        self.assertEqual(got.agent_state, want["agent_state"], where)
        self.assertEqual(got.stdout, want["stdout"], where)
        self.assertEqual(got.stderr, want["stderr"], where)
        self.assertEqual(got.sandbox_config_fingerprint, FINGERPRINT, where)
        self.assertEqual(got.record["framing"], "legacy-text", where)
        if json_result:
            self.assertNotIn("opaque_pickle", got.record, where)
        else:
            self.assertTrue(got.record["pickle_decoded"], where)

    setattr(SeedScripts, "test_%s_seed" % name, lambda self: check(self, False))
    # A model returned by a legacy-json script is json.dumps(default=str)-ed
    # there: its repr, with an address that differs from run to run.
    if name != "agent_state_returned_block":
        setattr(SeedScripts, "test_%s_legacy_json" % name, lambda self: check(self, True))


for _name in SEED_CASES:
    _add_seed_case(_name)


class AgentStateWithoutLettaInTheVenv(Harness):
    """The daemon's venv has no letta: tool mode gives the tool the runner's
    stand-in of AgentState, which must behave as Letta's own."""

    LETTA_IN_DAEMON_VENV = False


def _add_case(name):
    def tool_mode(self):
        if name in READ_LENIENTLY_IN_TOOL_MODE:
            # Different on purpose (PROTOCOL.md 13.2): Letta's strict decode
            # loses the tool's result; tool mode's result does not travel
            # through the output, which is shown as errors="replace" shows it.
            strict = self.reference(name)
            self.assertEqual(strict["status"], "error")
            self.assertIn("UnicodeDecodeError", strict["func_return"])
            self.assert_same(name, self.through_adapter(name), "the adapter (tool mode)", decode_errors="replace")
            return
        self.assert_same(name, self.through_adapter(name), "the adapter (tool mode)")

    if name in AGENT_STATE_CASES:
        setattr(AgentStateWithoutLettaInTheVenv, "test_%s_tool_mode" % name, tool_mode)

    def script_mode(self):
        self.assert_same(name, self.through_execute(name), "execute (Letta's script)")

    if name not in SCRIPT_MODE_ONLY:
        setattr(LettaCompat, "test_%s_tool_mode" % name, tool_mode)
    setattr(LettaCompat, "test_%s_script_mode" % name, script_mode)


for _name in CASES:
    _add_case(_name)


if __name__ == "__main__":
    unittest.main()
