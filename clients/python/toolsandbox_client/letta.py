"""Letta adapter: a drop-in for letta-server's AsyncToolSandboxLocal that runs
the tool in toolsandboxd instead of a local subprocess.

    sandbox = ToolSandboxDaemonSandbox(
        function_name, function_args, actor,
        tool_id=tool.id,
        agent_id=agent_state.id if agent_state else None,
        project_id=agent_state.project_id if agent_state else None,
        tool_object=tool,
        sandbox_config=sandbox_config,
        sandbox_env_vars=sandbox_env_vars,
    )
    result = await sandbox.run(agent_state=agent_state_copy)

The constructor takes AsyncToolSandboxLocal's arguments (see
letta/services/tool_executor/sandbox_tool_executor.py) plus the daemon's
(socket_path, mode, script, timeout, policy, client). `run()` returns Letta's
ToolExecutionResult when letta is importable, else a dataclass with the same
fields; `agent_state` is then Letta's AgentState (model_validate) or a dict.

Modes
-----
"tool" (default): run_tool. The daemon's trusted runner calls the function
    with the args as JSON data; agent_state is sent (model_dump(mode="json"))
    only when the function declares an `agent_state` parameter, and comes back
    only then. Inside the sandbox the tool receives Letta's AgentState when
    the venv has letta, else the runner's stand-in of its tool-facing API
    (attributes, memory.get_block, memory.update_block_value, ...); its
    changes come back as the result's agent_state. The agent_id a tool
    declaring one receives is agent_state.id, as in Letta's script.
"script": execute. `script` is the program letta already generated (e.g.
    with generate_execution_script(agent_state, wrap_print_with_markers=True));
    the daemon parses its Letta result frame.

Letta's multi-agent built-ins (tool_type letta_multi_agent_core, no stored
source) are not user code: they call letta-server. They are handed to Letta's
own AsyncToolSandboxLocal with the same arguments, as letta-server would run
them without the daemon.

Environment
-----------
Letta's layering (AsyncToolSandboxBase._gather_env_vars in
letta/services/tool_sandbox/base.py) minus the server's own
environment, which never reaches a tool: the sandbox config's variables, then
`sandbox_env_vars`, then the agent's variables
(agent_state.get_agent_env_vars_as_dict()), then `additional_env_vars`, then
LETTA_AGENT_ID / LETTA_PROJECT_ID / LETTA_TOOL_ID; names whose value is None
are dropped. Later layers win. The daemon's policy adds its fixed variables
(PATH, HOME, ...) on top (a request variable of such a name keeps the
policy's value), and may refuse names it does not allow.

E2B
---
A run the daemon delegates to E2B (an organization its policy does not run
locally) uses, as AsyncToolSandboxE2B does, the organization's E2B config
instead of the local one: its fingerprint, its pip requirements and its
variables as the first layer above. The adapter sends both (the request's
"e2b" member); the daemon uses the one that matches where the run goes. A
provided sandbox_config is used for both, as in Letta. Without Letta, pass
e2b_sandbox_config= (and e2b_sandbox_config_env_vars=) to get the same.
Looking it up costs two queries of Letta's database per call and sends that
config's variables to the daemon even for runs that stay local: where the
daemon has no E2B section, resolve_e2b_config=False leaves it out.

Errors
------
A tool that fails gives status "error", as in Letta. When the daemon refuses
the request (BusyError, PolicyDeniedError, ...) or cannot be reached, run()
raises the ToolSandboxError, as AsyncToolSandboxLocal raises on a timeout:
SandboxToolExecutor turns exceptions into the usual
"Error executing function X: BusyError: ..." result. With
raise_on_daemon_error=False, run() returns that result itself.

Nothing here logs env values, args or agent_state.
"""

from __future__ import annotations

import ast
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Set

from .aio import AsyncClient
from .errors import ToolSandboxError
from .protocol import DEFAULT_SOCKET_PATH, ToolResult, _enum_value, to_json_object

__all__ = [
    "ToolSandboxDaemonSandbox",
    "ToolExecutionResult",
    "gather_env_vars",
    "agent_env_vars",
    "declared_parameters",
    "friendly_error_msg",
    "letta_available",
    "warn_if_timeout_capped",
    "SOCKET_ENV",
    "AsyncToolSandboxDaemon",
]

log = logging.getLogger("toolsandbox_client.letta")

# Letta's ToolType.LETTA_MULTI_AGENT_CORE, and its tools of that type
# (letta/constants.py MULTI_AGENT_TOOLS): only these go to Letta's own sandbox.
MULTI_AGENT_TOOL_TYPE = "letta_multi_agent_core"
MULTI_AGENT_TOOLS = frozenset(["send_message_to_agent_and_wait_for_reply", "send_message_to_agents_matching_tags",
                               "send_message_to_agent_async"])

# (policy, requested, applied) timeouts already warned about: once each per
# process, not once per tool call.
_capped_timeouts: Set[Any] = set()


def warn_if_timeout_capped(record: Mapping[str, Any]) -> bool:
    """Logs a warning, once per (policy, requested, applied), when the daemon's
    policy ran a tool with a shorter timeout than Letta asked for (Letta's
    tool_sandbox_timeout is 180 s; the default policy's wall_timeout is 60 s).
    Returns whether the timeout was capped."""
    requested, applied = record.get("timeout_requested_s"), record.get("timeout_applied_s")
    if not isinstance(requested, (int, float)) or not isinstance(applied, (int, float)) or requested <= applied:
        return False
    key = (record.get("policy"), requested, applied)
    if key not in _capped_timeouts:
        _capped_timeouts.add(key)
        log.warning("toolsandboxd policy %r caps tool runs at %s s (Letta asked for %s s); raise the policy's "
                    "limits.wall_timeout to allow more", record.get("policy"), applied, requested)
    return True

SOCKET_ENV = "TOOLSANDBOXD_SOCKET"
MAX_ERROR_MESSAGE_CHAR_LIMIT = 1000  # letta/constants.py


@dataclass
class ToolExecutionResult:
    """The fields of letta.schemas.tool_execution_result.ToolExecutionResult,
    used when letta is not importable."""

    status: str
    func_return: Any = None
    agent_state: Any = field(default=None, repr=False)
    stdout: Optional[List[str]] = None
    stderr: Optional[List[str]] = None
    sandbox_config_fingerprint: Optional[str] = None


def letta_available() -> bool:
    try:
        import letta.schemas.tool_execution_result  # noqa: F401
    except ImportError:
        return False
    return True


def friendly_error_msg(function_name: str, exception_name: str, exception_message: str) -> str:
    """letta.utils.get_friendly_error_msg."""
    msg = "Error executing function %s: %s: %s" % (function_name, exception_name, exception_message)
    return msg[:MAX_ERROR_MESSAGE_CHAR_LIMIT]


def declared_parameters(source_code: str, function_name: str) -> Set[str]:
    """Parameter names of every def named `function_name` in the source (as
    Letta's parse_function_arguments finds them); empty if it does not parse."""
    try:
        tree = ast.parse(source_code)
    except (SyntaxError, ValueError):
        return set()
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function_name:
            # node.args.args only, as Letta's parse_function_arguments: a
            # positional-only or keyword-only agent_state is not injected.
            for arg in node.args.args:
                names.add(arg.arg)
    return names


def agent_env_vars(agent_state: Any) -> Dict[str, Any]:
    """agent_state.get_agent_env_vars_as_dict(), or the same read from a dict
    (its "secrets", else "tool_exec_environment_variables": [{key, value}])."""
    if agent_state is None:
        return {}
    getter = getattr(agent_state, "get_agent_env_vars_as_dict", None)
    if callable(getter):
        return dict(getter() or {})
    if isinstance(agent_state, Mapping):
        for key in ("secrets", "tool_exec_environment_variables"):
            items = agent_state.get(key)
            if items:
                out: Dict[str, Any] = {}
                for item in items:
                    if isinstance(item, Mapping) and isinstance(item.get("key"), str):
                        out[item["key"]] = item.get("value")
                return out
    return {}


def gather_env_vars(
    *,
    sandbox_config_env_vars: Optional[Mapping[str, Any]] = None,
    sandbox_env_vars: Optional[Mapping[str, Any]] = None,
    agent_state: Any = None,
    additional_env_vars: Optional[Mapping[str, Any]] = None,
    agent_id: Optional[str] = None,
    project_id: Optional[str] = None,
    tool_id: Optional[str] = None,
) -> Dict[str, str]:
    """Letta's env layering without os.environ (later layers win; None dropped)."""
    env: Dict[str, Any] = {}
    for layer in (sandbox_config_env_vars, sandbox_env_vars, agent_env_vars(agent_state), additional_env_vars):
        if layer:
            env.update(layer)
    env["LETTA_AGENT_ID"] = agent_id
    env["LETTA_PROJECT_ID"] = project_id
    env["LETTA_TOOL_ID"] = tool_id
    return {str(k): v if isinstance(v, str) else str(v) for k, v in env.items() if v is not None}


def _pip_requirements(tool: Any) -> Optional[List[Any]]:
    reqs = getattr(tool, "pip_requirements", None) if tool is not None else None
    return list(reqs) if reqs else None


def _npm_requirements(tool: Any) -> Optional[List[Any]]:
    reqs = getattr(tool, "npm_requirements", None) if tool is not None else None
    return list(reqs) if reqs else None


def tool_source_type(tool: Any) -> str:
    """Letta's Tool.source_type ("python" when absent): AsyncToolSandboxBase.
    is_typescript_tool()."""
    value = _enum_value(getattr(tool, "source_type", None)) if tool is not None else None
    return "typescript" if value == "typescript" else "python"


class ToolSandboxDaemonSandbox:
    """Runs one Letta tool call in toolsandboxd; see the module docstring."""

    def __init__(
        self,
        tool_name: str,
        args: Mapping[str, Any],
        user: Any = None,
        tool_object: Any = None,
        sandbox_config: Any = None,
        sandbox_env_vars: Optional[Mapping[str, Any]] = None,
        *,
        tool_id: Optional[str] = None,
        agent_id: Optional[str] = None,
        project_id: Optional[str] = None,
        organization_id: Optional[str] = None,
        source_code: Optional[str] = None,
        json_schema: Optional[Mapping[str, Any]] = None,
        pip_requirements: Optional[List[Any]] = None,
        source_type: Optional[str] = None,
        npm_requirements: Optional[List[Any]] = None,
        sandbox_config_env_vars: Optional[Mapping[str, Any]] = None,
        e2b_sandbox_config: Any = None,
        e2b_sandbox_config_env_vars: Optional[Mapping[str, Any]] = None,
        resolve_e2b_config: bool = True,
        mode: str = "tool",
        script: Optional[str] = None,
        socket_path: Optional[str] = None,
        timeout: Optional[float] = None,
        policy: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        raise_on_daemon_error: bool = True,
        resolve_from_letta: bool = True,
    ):
        if mode not in ("tool", "script"):
            raise ValueError("mode must be \"tool\" or \"script\"")
        self.tool_name = tool_name
        self.args = dict(args or {})
        self.user = user
        self.tool = tool_object
        self.mode = mode
        self.script = script
        self.provided_sandbox_config = sandbox_config
        self.provided_sandbox_env_vars = sandbox_env_vars
        self.sandbox_config_env_vars = sandbox_config_env_vars
        self.provided_e2b_sandbox_config = e2b_sandbox_config
        self.e2b_sandbox_config_env_vars = e2b_sandbox_config_env_vars
        self.resolve_e2b_config = resolve_e2b_config
        self.tool_id = tool_id if tool_id is not None else getattr(tool_object, "id", None)
        self.agent_id = agent_id
        self.project_id = project_id
        self.timeout = timeout
        self.policy = policy
        self.raise_on_daemon_error = raise_on_daemon_error
        self.resolve_from_letta = resolve_from_letta
        # A TypeScript tool (Letta 0.16's source_type "typescript"): no
        # agent_state or agent_id parameter (LETTA_AGENT_ID is its agent id),
        # and its npm requirements installed for it, in both modes.
        self.source_type = getattr(source_type, "value", source_type) or tool_source_type(tool_object)
        self.npm_requirements = (npm_requirements if npm_requirements is not None
                                 else _npm_requirements(tool_object) if self.source_type == "typescript" else None)

        if organization_id is None:
            organization_id = user if isinstance(user, str) else getattr(user, "organization_id", None)
        if not isinstance(organization_id, str) or not organization_id:
            raise ValueError("an organization id is needed: pass a user with .organization_id, or organization_id=")
        self.organization_id = organization_id

        # Letta's multi-agent built-ins (send_message_to_agent_and_wait_for_reply,
        # ...) have no stored source: Letta runs letta.functions.function_sets.
        # multi_agent, which talks to letta-server itself. They are not user
        # code, and they need letta-server's modules and network: they are
        # handed back to Letta's own sandbox (run() below).
        self.letta_builtin = (mode == "tool" and source_code is None and not getattr(tool_object, "source_code", None)
                              and _enum_value(getattr(tool_object, "tool_type", None)) == MULTI_AGENT_TOOL_TYPE
                              and tool_name in MULTI_AGENT_TOOLS)
        if self.letta_builtin:
            self.source_code, self.json_schema, self.pip_requirements, self.inject_agent_state = None, None, None, False
        elif mode == "script":
            if not isinstance(script, str):
                raise ValueError("mode \"script\" needs the script letta generated (script=...)")
            self.source_code = source_code if source_code is not None else getattr(tool_object, "source_code", None)
            self.json_schema = json_schema
            self.pip_requirements = None
            self.inject_agent_state = False
        else:
            self.source_code = source_code if source_code is not None else getattr(tool_object, "source_code", None)
            if not isinstance(self.source_code, str) or not self.source_code:
                raise ValueError("tool %s has no source code: pass tool_object or source_code=" % tool_name)
            self.json_schema = json_schema if json_schema is not None else getattr(tool_object, "json_schema", None)
            self.pip_requirements = pip_requirements if pip_requirements is not None else _pip_requirements(tool_object)
            # As Letta decides it: the tool gets agent_state only if it
            # declares it, and a TypeScript tool never does.
            self.inject_agent_state = (self.source_type == "python"
                                       and "agent_state" in declared_parameters(self.source_code, tool_name))

        self.socket_path = socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH
        self.client = client or AsyncClient(self.socket_path)

    # --- what Letta would look up itself --------------------------------------

    def _is_letta_user(self) -> bool:
        return self.user is not None and not isinstance(self.user, (str, Mapping)) and letta_available()

    async def _sandbox_config(self) -> Any:
        if self.provided_sandbox_config is not None or not self.resolve_from_letta or not self._is_letta_user():
            return self.provided_sandbox_config
        # AsyncToolSandboxLocal: the organization's default local config.
        from letta.schemas.enums import SandboxType
        from letta.services.sandbox_config_manager import SandboxConfigManager

        return await SandboxConfigManager().get_or_create_default_sandbox_config_async(
            sandbox_type=SandboxType.LOCAL, actor=self.user)

    async def _e2b_sandbox_config(self) -> Any:
        """The config a run the daemon delegates to E2B uses, as
        AsyncToolSandboxE2B picks it: the provided sandbox_config if there is
        one (then the daemon uses it for both, and None is returned here), else
        the organization's E2B config. The adapter does not know where the
        daemon places the run, so it does not create that config (Letta
        creates it on its first E2B run): without one, it sends the unsaved
        default Letta would create, which has the same fingerprint and no
        variables."""
        if self.provided_e2b_sandbox_config is not None:
            return self.provided_e2b_sandbox_config
        if (self.provided_sandbox_config is not None or not self.resolve_from_letta or not self.resolve_e2b_config
                or not self._is_letta_user()):
            return None
        from letta.schemas.enums import SandboxType
        from letta.schemas.sandbox_config import E2BSandboxConfig, SandboxConfig
        from letta.services.sandbox_config_manager import SandboxConfigManager

        config = await SandboxConfigManager().get_sandbox_config_by_type_async(SandboxType.E2B, actor=self.user)
        if config is None:
            config = SandboxConfig(type=SandboxType.E2B, config=E2BSandboxConfig().model_dump(exclude_none=True),
                                   organization_id=self.user.organization_id)
        return config

    async def _config_env_vars(self, sandbox_config: Any, provided: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
        """A config's own variables (Letta's first layer): `provided`, else
        Letta's stored ones for a stored config."""
        if provided is not None:
            return provided
        sbx_id = getattr(sandbox_config, "id", None)
        if sbx_id is None or not self.resolve_from_letta or not self._is_letta_user():
            return None
        from letta.services.sandbox_config_manager import SandboxConfigManager

        return await SandboxConfigManager().get_sandbox_env_vars_as_dict_async(
            sandbox_config_id=sbx_id, actor=self.user, limit=None)

    def _timeout(self) -> Optional[float]:
        if self.timeout is not None:
            return self.timeout
        try:
            from letta.settings import tool_settings
        except ImportError:
            return None  # the policy's wall_timeout
        return getattr(tool_settings, "tool_sandbox_timeout", None)

    # --- the run --------------------------------------------------------------

    async def run(self, agent_state: Any = None, additional_env_vars: Optional[Dict[str, Any]] = None) -> Any:
        if self.letta_builtin:
            return await self._run_in_letta(agent_state, additional_env_vars)
        sandbox_config = await self._sandbox_config()
        layers: Dict[str, Any] = dict(
            sandbox_env_vars=self.provided_sandbox_env_vars,
            agent_state=agent_state,
            additional_env_vars=additional_env_vars,
            agent_id=self.agent_id,
            project_id=self.project_id,
            tool_id=self.tool_id,
        )
        env = gather_env_vars(
            sandbox_config_env_vars=await self._config_env_vars(sandbox_config, self.sandbox_config_env_vars),
            **layers)
        # Letta's E2B sandbox layers the same variables over its own config's.
        e2b: Optional[Dict[str, Any]] = None
        e2b_config = await self._e2b_sandbox_config()
        if e2b_config is not None:
            e2b = {"sandbox_config": e2b_config,
                   "env": gather_env_vars(sandbox_config_env_vars=await self._config_env_vars(
                       e2b_config, self.e2b_sandbox_config_env_vars), **layers)}
        common: Dict[str, Any] = dict(
            tool_name=self.tool_name,
            organization_id=self.organization_id,
            env=env,
            timeout=self._timeout(),
            policy=self.policy,
            sandbox_config=sandbox_config,
            agent_id=self.agent_id,
            project_id=self.project_id,
            e2b=e2b,
            source_type=self.source_type,
            npm_requirements=self.npm_requirements,
        )
        try:
            if self.mode == "script":
                result = await self.client.execute(self.script, **common)
            else:
                state = to_json_object(agent_state, "agent_state") if self.inject_agent_state else None
                if agent_state is not None and self.source_type == "python":
                    # The agent_id a tool that declares one receives: Letta's
                    # script takes it from the agent state.
                    state_id = agent_state.get("id") if isinstance(agent_state, Mapping) else getattr(agent_state, "id", None)
                    common["agent_id"] = state_id if isinstance(state_id, str) and state_id else self.agent_id
                result = await self.client.run_tool(
                    self.source_code,
                    args=self.args,
                    json_schema=self.json_schema,
                    agent_state=state,
                    pip_requirements=self.pip_requirements,
                    **common,
                )
        except ToolSandboxError as e:
            log.info("toolsandboxd refused tool %s of organization %s: %s", self.tool_name, self.organization_id, e.code)
            if self.raise_on_daemon_error:
                raise
            return self._make_result(status="error",
                                     func_return=friendly_error_msg(self.tool_name, type(e).__name__, e.message),
                                     stderr=["%s: %s" % (type(e).__name__, e.message)])
        return self._from_tool_result(result)

    async def _run_in_letta(self, agent_state: Any, additional_env_vars: Optional[Dict[str, Any]]) -> Any:
        try:
            from letta.services.tool_sandbox.local_sandbox import AsyncToolSandboxLocal
        except ImportError:
            raise ValueError("tool %s is one of Letta's multi-agent built-ins, which only letta-server's own sandbox "
                             "runs (letta is not importable here)" % self.tool_name) from None
        log.info("tool %s is a Letta multi-agent built-in: run by Letta's own sandbox", self.tool_name)
        # A dict sandbox_config (which this adapter accepts) is not Letta's
        # SandboxConfig: Letta then looks up the organization's own.
        config = self.provided_sandbox_config
        if isinstance(config, Mapping):
            config = None
        sandbox = AsyncToolSandboxLocal(self.tool_name, self.args, self.user, tool_id=self.tool_id,
                                        agent_id=self.agent_id, project_id=self.project_id, tool_object=self.tool,
                                        sandbox_config=config, sandbox_env_vars=self.provided_sandbox_env_vars)
        return await sandbox.run(agent_state=agent_state, additional_env_vars=additional_env_vars)

    def _from_tool_result(self, r: ToolResult) -> Any:
        warn_if_timeout_capped(r.record)
        agent_state: Any = r.agent_state
        if agent_state and letta_available():
            from letta.schemas.agent import AgentState

            try:
                agent_state = AgentState.model_validate(agent_state)
            except Exception as e:  # Letta reports a result it cannot parse as an error
                return self._make_result(
                    status="error",
                    func_return=friendly_error_msg(self.tool_name, type(e).__name__, str(e)),
                    stdout=r.stdout, stderr=[str(e)], sandbox_config_fingerprint=r.sandbox_config_fingerprint)
        # A pickled result of an old script (the seed's) with the Python types
        # its pickle.loads gave letta-server (record.pickle_types).
        return self._make_result(status=r.status, func_return=r.python_func_return(), agent_state=agent_state or None,
                                 stdout=r.stdout, stderr=r.stderr,
                                 sandbox_config_fingerprint=r.sandbox_config_fingerprint)

    @staticmethod
    def _make_result(**fields: Any) -> Any:
        try:
            from letta.schemas.tool_execution_result import ToolExecutionResult as LettaResult
        except ImportError:
            return ToolExecutionResult(**fields)
        return LettaResult(**fields)


# The name letta-server's own classes follow.
AsyncToolSandboxDaemon = ToolSandboxDaemonSandbox
