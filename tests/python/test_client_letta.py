"""The Letta adapter (toolsandbox_client.letta).

Env layering, parameter detection and construction are tested without a
daemon; runs go to a real toolsandboxd (root needed, see daemon_fixture.py).
letta itself is not needed: a minimal stand-in package checks the path taken
when it is importable.

    /usr/bin/python3 -m unittest tests/python/test_client_letta.py -v
"""

import asyncio
import contextlib
import enum
import os
import sys
import types
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402
from toolsandbox_client import AsyncClient, PolicyDeniedError  # noqa: E402
from toolsandbox_client import letta as L  # noqa: E402

ORG = "org-letta-tests"

GREET_SOURCE = (
    "def greet(name: str) -> str:\n"
    "    \"\"\"Greet someone.\"\"\"\n"
    "    print('greeting', name)\n"
    "    return 'hello ' + name\n"
)
GREET_SCHEMA = {"name": "greet", "description": "Greet someone.",
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}
ENV_NAMES = ["A", "B", "C", "D", "NONE", "LETTA_AGENT_ID", "LETTA_PROJECT_ID", "LETTA_TOOL_ID", "SECRET_FROM_AGENT"]
ENV_SOURCE = "import os\n\ndef envs(names: list) -> dict:\n    return {n: os.environ.get(n) for n in names}\n"
MEMORY_SOURCE = (
    "def core_memory_note(text: str, agent_state: 'AgentState') -> None:\n"
    "    blocks = agent_state.memory.blocks\n"
    "    blocks[0].value = blocks[0].value + '\\n' + text\n"
    "    return None\n"
)


def tool(source, name, schema=None, tool_id="tool-00000000-0000-4000-8000-00000000000a", pip=None):
    return SimpleNamespace(id=tool_id, name=name, source_code=source, json_schema=schema,
                           pip_requirements=pip)


class FakeAgentState:
    """Quacks like letta's AgentState: model_dump(mode="json") and the env getter."""

    def __init__(self, env=None):
        self.id = "agent-00000000-0000-4000-8000-000000000099"
        self.project_id = "project-7"
        self._env = env or {}

    def get_agent_env_vars_as_dict(self):
        return dict(self._env)

    def model_dump(self, mode="python"):
        assert mode == "json"
        return {"id": self.id, "memory": {"blocks": [{"label": "persona", "value": "I am helpful"}]},
                "secrets": [{"key": k, "value": v} for k, v in self._env.items()]}


USER = SimpleNamespace(id="user-1", organization_id=ORG)


class EnvLayering(unittest.TestCase):
    def test_precedence_and_none(self):
        env = L.gather_env_vars(
            sandbox_config_env_vars={"A": "config", "B": "config", "C": "config", "D": "config", "LETTA_TOOL_ID": "x"},
            sandbox_env_vars={"B": "sandbox", "C": "sandbox", "D": "sandbox", "NONE": None},
            agent_state=FakeAgentState({"C": "agent", "D": "agent"}),
            additional_env_vars={"D": "additional", "N": 5},
            agent_id="agent-1", project_id=None, tool_id="tool-1")
        self.assertEqual(env, {"A": "config", "B": "sandbox", "C": "agent", "D": "additional", "N": "5",
                               "LETTA_AGENT_ID": "agent-1", "LETTA_TOOL_ID": "tool-1"})

    def test_never_os_environ(self):
        os.environ["TSB_LETTA_TEST_SERVER_VAR"] = "server-only"
        try:
            self.assertNotIn("TSB_LETTA_TEST_SERVER_VAR", L.gather_env_vars())
            self.assertEqual(L.gather_env_vars(), {})
        finally:
            del os.environ["TSB_LETTA_TEST_SERVER_VAR"]

    def test_agent_env_from_dict(self):
        self.assertEqual(L.agent_env_vars({"secrets": [{"key": "K", "value": "v"}]}), {"K": "v"})
        self.assertEqual(L.agent_env_vars({"tool_exec_environment_variables": [{"key": "K2", "value": "v2"}]}),
                         {"K2": "v2"})
        self.assertEqual(L.agent_env_vars({"id": "a"}), {})
        self.assertEqual(L.agent_env_vars(None), {})

    def test_declared_parameters(self):
        self.assertEqual(L.declared_parameters(MEMORY_SOURCE, "core_memory_note"), {"text", "agent_state"})
        # Positional-or-keyword parameters only, as Letta's parse_function_arguments.
        self.assertEqual(L.declared_parameters("async def f(a, /, c, *, b): pass\n", "f"), {"c"})
        self.assertEqual(L.declared_parameters("def (", "f"), set())

    def test_friendly_error_msg(self):
        self.assertEqual(L.friendly_error_msg("f", "E", "m"), "Error executing function f: E: m")
        self.assertEqual(len(L.friendly_error_msg("f", "E", "m" * 5000)), 1000)

    def test_construction(self):
        s = L.ToolSandboxDaemonSandbox("greet", {"name": "x"}, USER, tool_object=tool(GREET_SOURCE, "greet"),
                                       socket_path="/nonexistent.sock")
        self.assertEqual(s.organization_id, ORG)
        self.assertEqual(s.tool_id, "tool-00000000-0000-4000-8000-00000000000a")
        self.assertFalse(s.inject_agent_state)
        s = L.ToolSandboxDaemonSandbox("core_memory_note", {}, "org-str", source_code=MEMORY_SOURCE)
        self.assertTrue(s.inject_agent_state)
        self.assertEqual(s.organization_id, "org-str")
        with self.assertRaises(ValueError):
            L.ToolSandboxDaemonSandbox("greet", {}, None, source_code=GREET_SOURCE)  # no organization
        with self.assertRaises(ValueError):
            L.ToolSandboxDaemonSandbox("greet", {}, USER)  # no source
        with self.assertRaises(ValueError):
            L.ToolSandboxDaemonSandbox("greet", {}, USER, mode="script")  # no script
        with self.assertRaises(ValueError):
            L.ToolSandboxDaemonSandbox("greet", {}, USER, source_code=GREET_SOURCE, mode="other")

    def test_socket_from_environment(self):
        os.environ[L.SOCKET_ENV] = "/tmp/from-env.sock"
        try:
            s = L.ToolSandboxDaemonSandbox("greet", {}, USER, source_code=GREET_SOURCE)
            self.assertEqual(s.socket_path, "/tmp/from-env.sock")
        finally:
            del os.environ[L.SOCKET_ENV]


@contextlib.contextmanager
def modules_replaced(mods):
    """sys.modules with `mods` in place (None: not importable), restored after."""
    saved = {k: sys.modules.get(k) for k in mods}
    try:
        sys.modules.update(mods)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def fake_letta_modules():
    """A stand-in for the few letta modules the adapter imports."""

    class ToolExecutionResult:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class AgentState:
        def __init__(self, data):
            self.data = data

        @classmethod
        def model_validate(cls, data):
            if not isinstance(data.get("memory"), dict):
                raise ValueError("memory: field required")
            return cls(data)

    mods = {name: types.ModuleType(name) for name in (
        "letta", "letta.schemas", "letta.schemas.tool_execution_result", "letta.schemas.agent", "letta.settings")}
    mods["letta.schemas.tool_execution_result"].ToolExecutionResult = ToolExecutionResult
    mods["letta.schemas.agent"].AgentState = AgentState
    mods["letta.settings"].tool_settings = SimpleNamespace(tool_sandbox_timeout=7.5)
    return mods


class FakeSandboxType(enum.Enum):
    LOCAL = "local"
    E2B = "e2b"


def fake_letta_config_modules(stored_e2b):
    """fake_letta_modules plus a SandboxConfigManager over an in-memory store:
    the organization's local config (created on demand, as Letta does) and,
    if `stored_e2b`, an E2B config; each with its own variables. Records the
    calls it gets."""
    mods = fake_letta_modules()
    calls = []

    class SandboxConfig:
        def __init__(self, type, config, organization_id, id=None):
            self.type, self.config, self.organization_id, self.id = type, config, organization_id, id

    class E2BSandboxConfig:
        def model_dump(self, exclude_none=False):
            assert exclude_none
            return {"timeout": 300}  # what Letta's default dumps to

    store = {FakeSandboxType.LOCAL: SandboxConfig(FakeSandboxType.LOCAL, {"sandbox_dir": "/x"}, "org-of-local",
                                                  id="sandbox-local")}
    if stored_e2b:
        store[FakeSandboxType.E2B] = SandboxConfig(FakeSandboxType.E2B, {"template": "t1"}, "org-of-e2b",
                                                   id="sandbox-e2b")
    variables = {"sandbox-local": {"A": "local-config", "ONLY_LOCAL": "1"},
                 "sandbox-e2b": {"A": "e2b-config", "ONLY_E2B": "1"}}

    class SandboxConfigManager:
        async def get_or_create_default_sandbox_config_async(self, sandbox_type, actor):
            calls.append(("get_or_create", sandbox_type))
            return store[sandbox_type]

        async def get_sandbox_config_by_type_async(self, type, actor):
            calls.append(("get", type))
            return store.get(type)

        async def get_sandbox_env_vars_as_dict_async(self, sandbox_config_id, actor, limit):
            calls.append(("env", sandbox_config_id))
            return dict(variables[sandbox_config_id])

    for name in ("letta.services", "letta.services.sandbox_config_manager", "letta.schemas.enums",
                 "letta.schemas.sandbox_config"):
        mods[name] = types.ModuleType(name)
    mods["letta.services.sandbox_config_manager"].SandboxConfigManager = SandboxConfigManager
    mods["letta.schemas.enums"].SandboxType = FakeSandboxType
    mods["letta.schemas.sandbox_config"].SandboxConfig = SandboxConfig
    mods["letta.schemas.sandbox_config"].E2BSandboxConfig = E2BSandboxConfig
    return mods, calls


class RecordingClient:
    """An AsyncClient stand-in that keeps each request's keyword arguments."""

    def __init__(self):
        self.requests = []

    async def run_tool(self, source_code, **kw):
        self.requests.append(kw)
        return L.ToolResult(status="success", func_return=None)


class LettaResolution(unittest.TestCase):
    """What the adapter looks up in Letta and sends, without a daemon."""

    def sent(self, stored_e2b, **kw):
        if L.letta_available():
            self.skipTest("the real letta is installed; the stand-in would shadow it")
        mods, calls = fake_letta_config_modules(stored_e2b)
        client = RecordingClient()
        with modules_replaced(mods):
            sb = L.ToolSandboxDaemonSandbox("envs", {"names": []}, USER, source_code=ENV_SOURCE, client=client,
                                            sandbox_env_vars={"B": "sandbox"}, tool_id="tool-1", **kw)
            asyncio.run(sb.run(additional_env_vars={"C": "additional"}))
        (req,), = [client.requests]
        return req, calls

    def test_stored_e2b_config_and_its_variables(self):
        req, calls = self.sent(stored_e2b=True)
        self.assertEqual(req["sandbox_config"].id, "sandbox-local")
        self.assertEqual(req["env"], {"A": "local-config", "ONLY_LOCAL": "1", "B": "sandbox", "C": "additional",
                                      "LETTA_TOOL_ID": "tool-1"})
        e2b = req["e2b"]
        self.assertEqual(e2b["sandbox_config"].id, "sandbox-e2b")
        # The same layers over the E2B config's own variables, as Letta's E2B sandbox.
        self.assertEqual(e2b["env"], {"A": "e2b-config", "ONLY_E2B": "1", "B": "sandbox", "C": "additional",
                                      "LETTA_TOOL_ID": "tool-1"})
        # It is looked up, never created: the run may well stay local.
        self.assertNotIn(("get_or_create", FakeSandboxType.E2B), calls)
        self.assertIn(("get", FakeSandboxType.E2B), calls)

    def test_no_e2b_config_sends_lettas_unsaved_default(self):
        req, calls = self.sent(stored_e2b=False)
        cfg = req["e2b"]["sandbox_config"]
        self.assertIsNone(cfg.id)
        self.assertEqual((cfg.type, cfg.config, cfg.organization_id), (FakeSandboxType.E2B, {"timeout": 300}, ORG))
        from toolsandbox_client import protocol as P
        self.assertEqual(P.sandbox_config_wire(cfg), {"type": "e2b", "config": {"timeout": 300}, "organization_id": ORG})
        self.assertEqual(req["e2b"]["env"], {"B": "sandbox", "C": "additional", "LETTA_TOOL_ID": "tool-1"})
        self.assertEqual([c for c in calls if c[0] == "env"], [("env", "sandbox-local")])

    def test_a_provided_config_serves_both(self):
        req, calls = self.sent(stored_e2b=True, sandbox_config={"type": "local", "config": {}})
        self.assertIsNone(req["e2b"])
        self.assertEqual(calls, [])

    def test_the_e2b_lookup_can_be_turned_off(self):
        req, calls = self.sent(stored_e2b=True, resolve_e2b_config=False)
        self.assertIsNone(req["e2b"])
        self.assertNotIn(("get", FakeSandboxType.E2B), calls)
        self.assertEqual(req["sandbox_config"].id, "sandbox-local")

    def test_explicit_e2b_config_without_letta_lookups(self):
        req, calls = self.sent(stored_e2b=True, sandbox_config={"type": "local", "config": {}},
                               e2b_sandbox_config={"type": "e2b", "config": {"template": "x"}},
                               e2b_sandbox_config_env_vars={"A": "given"})
        self.assertEqual(req["e2b"]["sandbox_config"], {"type": "e2b", "config": {"template": "x"}})
        self.assertEqual(req["e2b"]["env"]["A"], "given")
        self.assertEqual(calls, [])


class AdapterEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = F.start_daemon(cls)

    def sandbox(self, name, args, **kw):
        kw.setdefault("socket_path", self.daemon.socket_path)
        return L.ToolSandboxDaemonSandbox(name, args, USER, **kw)

    def run_async(self, coro):
        return asyncio.run(coro)

    def test_tool_mode(self):
        sb = self.sandbox("greet", {"name": "Ada"}, tool_object=tool(GREET_SOURCE, "greet", GREET_SCHEMA),
                          sandbox_config={"type": "local", "config": {"sandbox_dir": "/tmp"}})
        r = self.run_async(sb.run())
        if not L.letta_available():
            self.assertIsInstance(r, L.ToolExecutionResult)
        self.assertEqual(r.status, "success", r)
        self.assertEqual(r.func_return, "hello Ada")
        self.assertEqual(r.stdout, ["greeting Ada\n"])
        self.assertEqual(r.stderr, [])
        self.assertIsNone(r.agent_state)
        self.assertTrue(r.sandbox_config_fingerprint.isdigit())

    def test_env_layering_end_to_end(self):
        agent = FakeAgentState({"C": "agent", "D": "agent", "SECRET_FROM_AGENT": "agent-secret"})
        sb = self.sandbox("envs", {"names": ENV_NAMES}, tool_object=tool(ENV_SOURCE, "envs"),
                          sandbox_config_env_vars={"A": "config", "B": "config", "C": "config", "D": "config"},
                          sandbox_env_vars={"B": "sandbox", "C": "sandbox", "D": "sandbox", "NONE": None},
                          agent_id=agent.id, project_id=agent.project_id)
        r = self.run_async(sb.run(agent_state=agent, additional_env_vars={"D": "additional"}))
        self.assertEqual(r.status, "success", r)
        self.assertEqual(r.func_return, {
            "A": "config", "B": "sandbox", "C": "agent", "D": "additional", "NONE": None,
            "LETTA_AGENT_ID": agent.id, "LETTA_PROJECT_ID": "project-7",
            "LETTA_TOOL_ID": "tool-00000000-0000-4000-8000-00000000000a", "SECRET_FROM_AGENT": "agent-secret"})
        # The undeclared agent_state was not sent, and is not returned.
        self.assertIsNone(r.agent_state)

    def test_server_environment_never_reaches_the_tool(self):
        sb = self.sandbox("envs", {"names": [F.HOST_ONLY_VAR]}, tool_object=tool(ENV_SOURCE, "envs"))
        r = self.run_async(sb.run())
        self.assertEqual(r.func_return, {F.HOST_ONLY_VAR: None})

    def test_agent_state_declared(self):
        agent = FakeAgentState()
        sb = self.sandbox("core_memory_note", {"text": "likes tea"}, source_code=MEMORY_SOURCE)
        r = self.run_async(sb.run(agent_state=agent))
        self.assertEqual(r.status, "success", r)
        self.assertIsNone(r.func_return)
        self.assertEqual(r.agent_state["memory"]["blocks"][0]["value"], "I am helpful\nlikes tea")
        # A dict agent state works as well.
        r = self.run_async(sb.run(agent_state=agent.model_dump(mode="json")))
        self.assertEqual(r.agent_state["memory"]["blocks"][0]["value"], "I am helpful\nlikes tea")

    def test_tool_failure_and_timeout(self):
        sb = self.sandbox("boom", {}, source_code="def boom():\n    return 1 / 0\n")
        r = self.run_async(sb.run())
        self.assertEqual(r.status, "error")
        self.assertEqual(r.func_return, "Error executing function boom: ZeroDivisionError: division by zero")
        self.assertIn("ZeroDivisionError: division by zero", r.stderr[0])
        sb = self.sandbox("spin", {}, source_code="def spin():\n    while True:\n        pass\n", timeout=1)
        r = self.run_async(sb.run())
        self.assertEqual(r.status, "error")
        self.assertEqual(r.func_return, "Error executing function spin: TimeoutError: Executing tool spin timed out after 1.0 seconds.")

    def test_policy_cap_on_the_timeout_is_warned_once(self):
        L._capped_timeouts.clear()
        sb = self.sandbox("greet", {"name": "Ada"}, source_code=GREET_SOURCE, timeout=3600)
        with self.assertLogs("toolsandbox_client.letta", "WARNING") as logs:
            r = self.run_async(sb.run())
        self.assertEqual(r.status, "success", r)
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertIn("raise the policy's limits.wall_timeout", logs.output[0])
        with self.assertNoLogs("toolsandbox_client.letta", "WARNING"):
            self.run_async(sb.run())
        # Within the policy's limit: nothing to say.
        L._capped_timeouts.clear()
        with self.assertNoLogs("toolsandbox_client.letta", "WARNING"):
            self.run_async(self.sandbox("greet", {"name": "Ada"}, source_code=GREET_SOURCE, timeout=5).run())

    def test_config_setting_a_policy_fixed_name_still_runs(self):
        # A Letta sandbox config that sets LANG (which the policy fixes): the
        # call runs, with the policy's value.
        sb = self.sandbox("envs", {"names": ["LANG", "A"]}, tool_object=tool(ENV_SOURCE, "envs"),
                          sandbox_config_env_vars={"LANG": "xx_XX.UTF-8", "A": "config"})
        r = self.run_async(sb.run())
        self.assertEqual(r.status, "success", r)
        self.assertEqual(r.func_return, {"LANG": "C.UTF-8", "A": "config"})

    def test_script_mode(self):
        script = F.binary_frame_script({"results": {"from": "script"}, "agent_state": None})
        sb = self.sandbox("greet", {"name": "x"}, mode="script", script=script, tool_object=tool(GREET_SOURCE, "greet"),
                          sandbox_env_vars={"K": "v"})
        r = self.run_async(sb.run())
        self.assertEqual(r.status, "success", r)
        self.assertEqual(r.func_return, {"from": "script"})
        self.assertEqual(r.stdout, ["before the frame\nafter the frame\n"])

    def test_daemon_errors(self):
        sb = self.sandbox("greet", {"name": "x"}, source_code=GREET_SOURCE, policy="no-such-policy")
        with self.assertRaises(PolicyDeniedError):
            self.run_async(sb.run())
        sb = self.sandbox("greet", {"name": "x"}, source_code=GREET_SOURCE, policy="no-such-policy",
                          raise_on_daemon_error=False)
        r = self.run_async(sb.run())
        self.assertEqual(r.status, "error")
        self.assertTrue(r.func_return.startswith("Error executing function greet: PolicyDeniedError: "), r.func_return)

    def test_shared_client_concurrent_runs(self):
        client = AsyncClient(self.daemon.socket_path, timeout=60)

        async def main():
            sbs = [L.ToolSandboxDaemonSandbox("greet", {"name": "n%d" % i}, USER, source_code=GREET_SOURCE, client=client)
                   for i in range(10)]
            return await asyncio.gather(*[sb.run() for sb in sbs])

        results = self.run_async(main())
        self.assertEqual([r.func_return for r in results], ["hello n%d" % i for i in range(10)])

    def test_multi_agent_builtins_go_to_lettas_own_sandbox(self):
        class ToolType(enum.Enum):
            LETTA_MULTI_AGENT_CORE = "letta_multi_agent_core"

        builtin = SimpleNamespace(id="tool-ma", name="send_message_to_agent_async", source_code=None,
                                  tool_type=ToolType.LETTA_MULTI_AGENT_CORE, json_schema=None)
        calls = []

        class AsyncToolSandboxLocal:
            def __init__(self, *args, **kw):
                calls.append((args, kw))

            async def run(self, agent_state=None, additional_env_vars=None):
                return {"ran_by": "letta", "agent_state": agent_state, "extra": additional_env_vars}

        mod = types.ModuleType("letta.services.tool_sandbox.local_sandbox")
        mod.AsyncToolSandboxLocal = AsyncToolSandboxLocal
        names = ["letta", "letta.services", "letta.services.tool_sandbox", "letta.services.tool_sandbox.local_sandbox"]
        sb = self.sandbox("send_message_to_agent_async", {"message": "hi", "other_agent_id": "agent-2"},
                          tool_object=builtin, sandbox_env_vars={"K": "v"})
        # Without letta there is nothing to hand it to: a clear error, no daemon call.
        with modules_replaced({k: None for k in names}):
            with self.assertRaises(ValueError) as cm:
                self.run_async(sb.run())
            self.assertIn("multi-agent built-ins", str(cm.exception))
        stand_ins = {k: types.ModuleType(k) for k in names[:-1]}
        stand_ins[names[-1]] = mod
        with modules_replaced(stand_ins):
            r = self.run_async(sb.run(agent_state="STATE", additional_env_vars={"X": "1"}))
        self.assertEqual(r, {"ran_by": "letta", "agent_state": "STATE", "extra": {"X": "1"}})
        (args, kw), = calls
        self.assertEqual(args, ("send_message_to_agent_async", {"message": "hi", "other_agent_id": "agent-2"}, USER))
        self.assertEqual(kw["tool_id"], "tool-ma")
        self.assertIs(kw["tool_object"], builtin)
        self.assertEqual(kw["sandbox_env_vars"], {"K": "v"})
        # A tool of another type, or of that type but not one of Letta's
        # multi-agent tools, without source is still refused at once.
        with self.assertRaises(ValueError):
            self.sandbox("x", {}, tool_object=SimpleNamespace(id="t", source_code=None, tool_type="custom"))
        with self.assertRaises(ValueError):
            self.sandbox("my_tool", {}, tool_object=SimpleNamespace(id="t", source_code=None,
                                                                    tool_type=ToolType.LETTA_MULTI_AGENT_CORE))

    def test_with_letta_importable(self):
        if L.letta_available():
            self.skipTest("the real letta is installed; the stand-in would shadow it")
        mods = fake_letta_modules()
        with modules_replaced(mods):
            self.assertTrue(L.letta_available())
            sb = self.sandbox("core_memory_note", {"text": "t"}, source_code=MEMORY_SOURCE,
                              sandbox_config={"type": "local", "config": {}}, resolve_from_letta=False)
            self.assertEqual(sb._timeout(), 7.5)  # letta's tool_sandbox_timeout
            r = self.run_async(sb.run(agent_state=FakeAgentState()))
            self.assertIsInstance(r, mods["letta.schemas.tool_execution_result"].ToolExecutionResult)
            self.assertEqual(r.status, "success")
            self.assertIsInstance(r.agent_state, mods["letta.schemas.agent"].AgentState)
            self.assertEqual(r.agent_state.data["memory"]["blocks"][0]["value"], "I am helpful\nt")
            # A returned state letta cannot validate becomes an error result.
            bad = self.sandbox("wipe", {}, source_code="def wipe(agent_state):\n    agent_state.memory = None\n",
                               resolve_from_letta=False)
            r = self.run_async(bad.run(agent_state=FakeAgentState()))
            self.assertEqual(r.status, "error")
            self.assertIn("ValueError: memory: field required", r.func_return)
        self.assertFalse(L.letta_available())


if __name__ == "__main__":
    unittest.main()
