"""Protocol v1 of toolsandboxd: building requests and checking responses.

Newline-delimited JSON over a Unix stream socket: one request object per line,
one response object per line, answered in order on a connection.

    request   {"v": 1, "id": "<str, at most 128 bytes>", "type": "execute" | "run_tool" | "status", ...}
    response  {"v": 1, "id": ..., "ok": true, "result": {...}}      (execute, run_tool)
              {"v": 1, "id": ..., "ok": true, "status": {...}}      (status)
              {"v": 1, "id": ... | null, "ok": false, "error": {"code": ..., "message": ...}}

The daemon decodes strictly (unknown fields, wrong types and duplicate keys
are refused), so this module only ever sends the fields it knows, and leaves
optional fields out rather than sending null.

Nothing here does I/O; the sync and asyncio clients share it.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .errors import ResponseError, error_from_code

__all__ = [
    "PROTOCOL_VERSION",
    "DEFAULT_SOCKET_PATH",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "MAX_ID_LENGTH",
    "ToolResult",
    "new_request_id",
    "status_request",
    "execute_request",
    "run_tool_request",
    "encode_request",
    "decode_response",
    "describe_request",
    "rebuild_pickled_types",
]

PROTOCOL_VERSION = 1
DEFAULT_SOCKET_PATH = "/run/toolsandboxd/toolsandboxd.sock"
MAX_ID_LENGTH = 128
# A run's answer holds its captured stdout and stderr (JSON-escaped) and its
# result. The daemon's own request cap is 32 MiB; answers get more room.
DEFAULT_MAX_RESPONSE_BYTES = 128 << 20

# The fields of ToolExecutionResult (letta/schemas/tool_execution_result.py).
LETTA_RESULT_FIELDS = ("status", "func_return", "agent_state", "stdout", "stderr", "sandbox_config_fingerprint")


@dataclass
class ToolResult:
    """The result of one execute or run_tool request.

    The first six fields are Letta's ToolExecutionResult; ``record`` is the
    daemon's run record (run_id, end_reason, exit_code, signal, wall_ms,
    cpu_ms, peak_memory_bytes, stdout_truncated, ..., policy,
    policy_fingerprint, backend, framing). agent_state is left out of repr():
    it carries the agent's secrets.
    """

    status: str
    func_return: Any = None
    agent_state: Optional[Dict[str, Any]] = field(default=None, repr=False)
    stdout: Optional[List[str]] = field(default_factory=list)
    stderr: Optional[List[str]] = field(default_factory=list)
    sandbox_config_fingerprint: Optional[str] = None
    record: Dict[str, Any] = field(default_factory=dict)
    request_id: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned (status "success")."""
        return self.status == "success"

    @property
    def end_reason(self) -> Optional[str]:
        return self.record.get("end_reason")

    def python_func_return(self) -> Any:
        """func_return with the Python types a decoded pickle result had
        (record.pickle_types: tuples, sets, frozensets, bytes, bytearrays,
        keys that were not strings), as letta-server's pickle.loads gave
        them; func_return itself for any other result."""
        return rebuild_pickled_types(self.func_return, self.record.get("pickle_types"))

    def to_letta_dict(self) -> Dict[str, Any]:
        """The ToolExecutionResult fields only, as a dict."""
        return {k: getattr(self, k) for k in LETTA_RESULT_FIELDS}

    def to_dict(self) -> Dict[str, Any]:
        d = self.to_letta_dict()
        d["record"] = self.record
        return d

    @classmethod
    def from_json(cls, obj: Any, request_id: Optional[str] = None) -> "ToolResult":
        if not isinstance(obj, dict):
            raise ResponseError("\"result\" is not an object", request_id=request_id)
        status = obj.get("status")
        if status not in ("success", "error"):
            raise ResponseError("\"result.status\" is %r, not \"success\" or \"error\"" % (status,), request_id=request_id)
        for name in ("stdout", "stderr"):
            v = obj.get(name)
            if v is not None and not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
                raise ResponseError("\"result.%s\" is not a list of strings" % name, request_id=request_id)
        agent_state = obj.get("agent_state")
        if agent_state is not None and not isinstance(agent_state, dict):
            raise ResponseError("\"result.agent_state\" is not an object", request_id=request_id)
        fp = obj.get("sandbox_config_fingerprint")
        if fp is not None and not isinstance(fp, str):
            raise ResponseError("\"result.sandbox_config_fingerprint\" is not a string", request_id=request_id)
        record = obj.get("record")
        if record is None:
            record = {}
        if not isinstance(record, dict):
            raise ResponseError("\"result.record\" is not an object", request_id=request_id)
        return cls(
            status=status,
            func_return=obj.get("func_return"),
            agent_state=agent_state,
            stdout=obj.get("stdout", []),
            stderr=obj.get("stderr", []),
            sandbox_config_fingerprint=fp,
            record=record,
            request_id=request_id,
        )


# --- a decoded pickle's Python types (PROTOCOL.md 13.1) ----------------------

_KEY_TYPES = {
    "int": int,
    "float": float,
    "bool": lambda name: {"true": True, "false": False}[name],
    "none": lambda name: {"null": None}[name],
}


def rebuild_pickled_types(value: Any, types: Any) -> Any:
    """value (a result's func_return) with the types record.pickle_types
    names rebuilt: [path, "tuple"], [path, "key", "int"|"float"|"bool"|"none"],
    [path, "bytes"|"bytearray", base64], [path, "set"|"frozenset", JSON of
    the items as a list, their own entries]; a path is the member names and
    indices from func_return down. Nothing is evaluated or unpickled; an
    entry whose path does not lead to a value of the JSON type it names is
    skipped. value is not modified: containers on annotated paths are
    copied."""
    if not isinstance(types, list) or not types:
        return value
    tree: Dict[str, Any] = {}
    for entry in types:
        if not (isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[0], list)):
            continue
        node = tree
        for step in entry[0]:
            if isinstance(step, bool) or not isinstance(step, (int, str)):
                break
            node = node.setdefault("children", {}).setdefault(step, {})
        else:
            node.setdefault("tags", []).append(entry[1:])
    return _rebuild(value, tree)


def _rebuild(value: Any, node: Dict[str, Any]) -> Any:
    children = node.get("children")
    if children and isinstance(value, list):
        value = list(value)
        for step, sub in children.items():
            if isinstance(step, int) and 0 <= step < len(value):
                value[step] = _rebuild(value[step], sub)
    elif children and isinstance(value, dict):
        rebuilt = {}
        for name, v in value.items():
            sub = children.get(name)
            if sub is None:
                rebuilt[name] = v
                continue
            key = name
            for tag in sub.get("tags", ()):
                if len(tag) == 2 and tag[0] == "key" and tag[1] in _KEY_TYPES:
                    try:
                        key = _KEY_TYPES[tag[1]](name)
                    except (KeyError, ValueError):
                        pass
            rebuilt[key] = _rebuild(v, sub)
        value = rebuilt
    for tag in node.get("tags", ()):
        value = _retype(value, tag)
    return value


def _retype(value: Any, tag: List[Any]) -> Any:
    kind = tag[0] if tag else None
    if kind == "tuple" and isinstance(value, list):
        return tuple(value)
    if kind in ("bytes", "bytearray") and isinstance(value, str) and len(tag) == 2 and isinstance(tag[1], str):
        import base64
        import binascii

        try:
            raw = base64.b64decode(tag[1], validate=True)
        except (binascii.Error, ValueError):
            return value
        return bytearray(raw) if kind == "bytearray" else raw
    if kind in ("set", "frozenset") and isinstance(value, str) and len(tag) == 3 and isinstance(tag[1], str):
        try:
            items = rebuild_pickled_types(json.loads(tag[1]), tag[2])
            return frozenset(items) if kind == "frozenset" else set(items)
        except (ValueError, TypeError):
            return value
    return value  # "key" tags are their dict's; anything else is skipped


def new_request_id() -> str:
    return "py-" + uuid.uuid4().hex


# --- request building ---------------------------------------------------------


def _check_str(name: str, value: Any, *, optional: bool = False) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError("%s must be a string, not %s" % (name, type(value).__name__))
    return value


def _env(env: Optional[Mapping[str, Any]]) -> Optional[Dict[str, str]]:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError("env must be a mapping of str to str, not %s" % type(env).__name__)
    out: Dict[str, str] = {}
    for k, v in env.items():
        if not isinstance(k, str):
            raise TypeError("env names must be strings")
        # The value is never part of a message: it may be a secret.
        if not isinstance(v, str):
            raise TypeError("env[%r] must be a string, not %s" % (k, type(v).__name__))
        out[k] = v
    return out


def _timeout(timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be a number of seconds, not %s" % type(timeout).__name__)
    return float(timeout)


def _enum_value(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


def to_json_object(value: Any, what: str) -> Optional[Dict[str, Any]]:
    """A mapping, or a pydantic model (model_dump(mode="json")), as a JSON object."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        out = dump(mode="json")
    else:
        dump = getattr(value, "dict", None)  # pydantic v1
        if not callable(dump):
            raise TypeError("%s must be a dict or a pydantic model, not %s" % (what, type(value).__name__))
        out = json.loads(json.dumps(dump(), default=str))
    if not isinstance(out, dict):
        raise TypeError("%s did not dump to a JSON object" % what)
    return out


def sandbox_config_wire(sandbox_config: Any) -> Optional[Dict[str, Any]]:
    """{"type", "config", "organization_id"} from a dict or a Letta SandboxConfig.

    Letta's SandboxConfig also has id, ...; type, config and the config's own
    organization_id go into the fingerprint (SandboxConfig.fingerprint()),
    and the daemon refuses other fields. An organization_id that is None (a
    SandboxConfig's, or a mapping's "organization_id": None) is sent as null,
    which the fingerprint hashes as Letta does; without the field at all the
    daemon uses the request's.
    """
    if sandbox_config is None:
        return None
    if isinstance(sandbox_config, Mapping):
        typ, config = sandbox_config.get("type"), sandbox_config.get("config")
        has_org = "organization_id" in sandbox_config
        org = sandbox_config.get("organization_id")
    else:
        typ, config = getattr(sandbox_config, "type", None), getattr(sandbox_config, "config", None)
        has_org = hasattr(sandbox_config, "organization_id")
        org = getattr(sandbox_config, "organization_id", None)
    typ = _enum_value(typ)
    if not isinstance(typ, str):
        raise TypeError("sandbox_config.type must be a string (\"local\", \"e2b\", ...)")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        config = to_json_object(config, "sandbox_config.config")
    out = {"type": typ, "config": dict(config)}
    if org is not None:
        if not isinstance(org, str):
            raise TypeError("sandbox_config.organization_id must be a string")
        out["organization_id"] = org
    elif has_org:
        out["organization_id"] = None
    return out


def e2b_wire(e2b: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The request's "e2b" member: what a run the daemon delegates to E2B uses
    instead of the local sandbox_config and env, as Letta resolves a separate
    E2B config (its own fingerprint, pip requirements and variables). Either
    key may be left out; a run that stays local ignores the member."""
    if e2b is None:
        return None
    if not isinstance(e2b, Mapping):
        raise TypeError("e2b must be a mapping with \"sandbox_config\" and/or \"env\"")
    unknown = sorted(str(k) for k in e2b if k not in ("sandbox_config", "env"))
    if unknown:
        raise TypeError("e2b has unknown keys: %s (known: sandbox_config, env)" % ", ".join(unknown))
    out: Dict[str, Any] = {}
    config = sandbox_config_wire(e2b.get("sandbox_config"))
    if config is not None:
        out["sandbox_config"] = config
    env = _env(e2b.get("env"))
    if env is not None:
        out["env"] = env
    return out


def _requirements(field: str, reqs: Optional[Iterable[Any]], render: Any) -> Optional[List[str]]:
    """Strings as given; Letta's {name, version?} objects (PipRequirement,
    NpmRequirement, or dicts) rendered by `render(name, version)`."""
    if reqs is None:
        return None
    if isinstance(reqs, (str, bytes)):
        raise TypeError("%s must be a list of strings" % field)
    out = []
    for r in reqs:
        if isinstance(r, str):
            out.append(r)
            continue
        name = r.get("name") if isinstance(r, Mapping) else getattr(r, "name", None)
        version = r.get("version") if isinstance(r, Mapping) else getattr(r, "version", None)
        if not isinstance(name, str):
            raise TypeError("%s entries must be strings or {name, version}" % field)
        out.append(render(name, version) if version else name)
    return out


def _pip_requirements(reqs: Optional[Iterable[Any]]) -> Optional[List[str]]:
    # Letta's PipRequirement renders as name==version.
    return _requirements("pip_requirements", reqs, lambda n, v: "%s==%s" % (n, v))


def _npm_requirements(reqs: Optional[Iterable[Any]]) -> Optional[List[str]]:
    # Letta's NpmRequirement: npm's name@version (Letta quotes the version
    # for its shell; the daemon never uses one).
    return _requirements("npm_requirements", reqs, lambda n, v: "%s@%s" % (n, v))


SOURCE_TYPES = ("python", "typescript")


def _common(
    req: Dict[str, Any],
    *,
    tool_name: str,
    organization_id: str,
    env: Optional[Mapping[str, str]],
    timeout: Optional[float],
    policy: Optional[str],
    sandbox_config: Any,
    agent_id: Optional[str],
    project_id: Optional[str],
    e2b: Optional[Mapping[str, Any]],
    source_type: Optional[str] = None,
    npm_requirements: Optional[Iterable[Any]] = None,
) -> None:
    req["tool_name"] = _check_str("tool_name", tool_name)
    if source_type is not None:
        source_type = getattr(source_type, "value", source_type)  # Letta's ToolSourceType enum
        if source_type not in SOURCE_TYPES:
            raise ValueError("source_type must be \"python\" or \"typescript\"")
        if source_type != "python":
            req["source_type"] = source_type
    npm = _npm_requirements(npm_requirements)
    if npm:
        req["npm_requirements"] = npm
    req["organization_id"] = _check_str("organization_id", organization_id)
    optional = {
        "policy": _check_str("policy", policy, optional=True),
        "env": _env(env),
        "timeout": _timeout(timeout),
        "sandbox_config": sandbox_config_wire(sandbox_config),
        "e2b": e2b_wire(e2b),
        "agent_id": _check_str("agent_id", agent_id, optional=True),
        "project_id": _check_str("project_id", project_id, optional=True),
    }
    for k, v in optional.items():
        if v is not None:
            req[k] = v
    # The result as Python's json.dumps wrote it (NaN, Infinity, integers of
    # any size), which json.loads here reads back exactly.
    req["json_dialect"] = "python"


def _envelope(type_: str, request_id: Optional[str]) -> Dict[str, Any]:
    rid = request_id if request_id is not None else new_request_id()
    _check_str("request_id", rid)
    if len(rid.encode("utf-8")) > MAX_ID_LENGTH:
        raise ValueError("request ids are at most %d bytes" % MAX_ID_LENGTH)
    return {"v": PROTOCOL_VERSION, "id": rid, "type": type_}


def status_request(*, request_id: Optional[str] = None) -> Dict[str, Any]:
    return _envelope("status", request_id)


# The signals a session's command may be sent (PROTOCOL.md, section 6.8).
SESSION_SIGNALS = ("HUP", "INT", "QUIT", "USR1", "USR2", "TERM", "WINCH")


def session_signal_request(session_id: str, signal: str, *, request_id: Optional[str] = None) -> Dict[str, Any]:
    """session_kill with "signal": `signal` ("TERM", or "SIGTERM") for the
    command of session `session_id` (its own client's, or the operator's)."""
    _check_str("session_id", session_id)
    name = _check_str("signal", signal)
    name = name[3:] if name.startswith("SIG") else name
    if name not in SESSION_SIGNALS:
        raise ValueError("signal must be one of %s" % ", ".join(SESSION_SIGNALS))
    req = _envelope("session_kill", request_id)
    req["session_id"] = session_id
    req["signal"] = name
    return req


# A session's frames after its answer line (PROTOCOL.md, section 6.8): a
# kind byte, a 4-byte big-endian length, the payload.
SESSION_FRAME_KINDS = {ord("o"): "stdout", ord("e"): "stderr", ord("x"): "end"}
MAX_SESSION_FRAME = 1 << 16


def session_request(
    command: Iterable[str],
    *,
    organization_id: str,
    policy: Optional[str] = None,
    env: Optional[Mapping[str, Any]] = None,
    agent_id: Optional[str] = None,
    workspace: Optional[str] = None,
    request_id: Optional[str] = None,
) -> Dict[str, Any]:
    """A session request: `command` (a program the policy's sessions.commands
    names, by path or last component, and its arguments) in a long-lived
    sandbox whose stdio is the connection; in the organization's workspace
    `workspace` when given."""
    if isinstance(command, (str, bytes)):
        raise TypeError("a session's command is a list of strings (the program, then its arguments), not a string")
    cmd = list(command)
    if not cmd or not all(isinstance(a, str) for a in cmd) or not cmd[0]:
        raise ValueError("a session's command is a non-empty list of strings, the program first")
    req = _envelope("session", request_id)
    req["organization_id"] = _check_str("organization_id", organization_id)
    req["command"] = cmd
    if policy is not None:
        req["policy"] = _check_str("policy", policy)
    e = _env(env)
    if e:
        req["env"] = e
    if agent_id is not None:
        req["agent_id"] = _check_str("agent_id", agent_id)
    if workspace is not None:
        if not isinstance(workspace, str) or not _WORKSPACE_NAME.fullmatch(workspace):
            raise ValueError("a workspace is named by 1 to 128 of A-Z a-z 0-9 . _ : -, not %r" % (workspace,))
        req["workspace"] = workspace
    return req


_WORKSPACE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def decode_session_answer(line: bytes, request_id: str) -> Dict[str, Any]:
    """The payload of the answer to a session request (its "session" object);
    raises as decode_response does, or ResponseError when it is no object."""
    payload = decode_response(line, request_id, "session")
    if not isinstance(payload, dict):
        raise ResponseError("\"session\" is not an object", request_id=request_id)
    return payload


def take_session_frame(buf: bytearray) -> Optional[Tuple[str, bytes]]:
    """The first whole frame of `buf` as (kind, payload), removed from it; None
    while it is not whole. Raises ResponseError for what the protocol does not
    allow."""
    if len(buf) < 5:
        return None
    kind = SESSION_FRAME_KINDS.get(buf[0])
    n = int.from_bytes(buf[1:5], "big")
    if kind is None:
        raise ResponseError("the daemon sent an unknown session frame (kind %r)" % bytes(buf[:1]))
    if n > MAX_SESSION_FRAME:
        raise ResponseError("the daemon sent a session frame of %d bytes (at most %d)" % (n, MAX_SESSION_FRAME))
    if len(buf) < 5 + n:
        return None
    payload = bytes(buf[5:5 + n])
    del buf[:5 + n]
    return kind, payload


def execute_request(
    script: str,
    *,
    tool_name: str,
    organization_id: str,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    policy: Optional[str] = None,
    sandbox_config: Any = None,
    agent_id: Optional[str] = None,
    project_id: Optional[str] = None,
    e2b: Optional[Mapping[str, Any]] = None,
    request_id: Optional[str] = None,
    source_type: Optional[str] = None,
    npm_requirements: Optional[Iterable[Any]] = None,
) -> Dict[str, Any]:
    req = _envelope("execute", request_id)
    _common(req, tool_name=tool_name, organization_id=organization_id, env=env, timeout=timeout, policy=policy,
            sandbox_config=sandbox_config, agent_id=agent_id, project_id=project_id, e2b=e2b,
            source_type=source_type, npm_requirements=npm_requirements)
    req["script"] = _check_str("script", script)
    return req


def asks_for_packages(req: Mapping[str, Any]) -> bool:
    """Whether a request names pip or npm requirements (its own, or its
    sandbox config's): a local run may then wait for its packages to be
    built."""
    if req.get("pip_requirements") or req.get("npm_requirements"):
        return True
    sc = req.get("sandbox_config")
    config = sc.get("config") if isinstance(sc, Mapping) else None
    return isinstance(config, Mapping) and bool(config.get("pip_requirements"))


def run_tool_request(
    source_code: str,
    *,
    tool_name: str,
    args: Optional[Mapping[str, Any]],
    organization_id: str,
    json_schema: Optional[Mapping[str, Any]] = None,
    agent_state: Any = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    policy: Optional[str] = None,
    sandbox_config: Any = None,
    agent_id: Optional[str] = None,
    project_id: Optional[str] = None,
    pip_requirements: Optional[Iterable[Any]] = None,
    e2b: Optional[Mapping[str, Any]] = None,
    request_id: Optional[str] = None,
    source_type: Optional[str] = None,
    npm_requirements: Optional[Iterable[Any]] = None,
) -> Dict[str, Any]:
    req = _envelope("run_tool", request_id)
    _common(req, tool_name=tool_name, organization_id=organization_id, env=env, timeout=timeout, policy=policy,
            sandbox_config=sandbox_config, agent_id=agent_id, project_id=project_id, e2b=e2b,
            source_type=source_type, npm_requirements=npm_requirements)
    req["source_code"] = _check_str("source_code", source_code)
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        raise TypeError("args must be a mapping of argument name to JSON value")
    req["args"] = dict(args)
    if json_schema is not None:
        req["json_schema"] = to_json_object(json_schema, "json_schema")
    state = to_json_object(agent_state, "agent_state")
    if state is not None:
        req["agent_state"] = state
    reqs = _pip_requirements(pip_requirements)
    if reqs:
        req["pip_requirements"] = reqs
    return req


def encode_request(req: Mapping[str, Any]) -> bytes:
    """One request line. Raises TypeError/ValueError for values JSON cannot carry
    (NaN, infinities, lone surrogates, arbitrary objects)."""
    text = json.dumps(req, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8") + b"\n"


def describe_request(req: Mapping[str, Any]) -> str:
    """A log-safe one-line description: never env, args, agent_state or code."""
    parts = ["id=%s" % req.get("id"), "type=%s" % req.get("type")]
    for k in ("tool_name", "organization_id", "policy", "timeout", "agent_id"):
        if k in req:
            parts.append("%s=%s" % (k, req[k]))
    if "env" in req:
        parts.append("env_names=%d" % len(req["env"]))
    return " ".join(parts)


# --- response checking --------------------------------------------------------


def decode_response(line: bytes, request_id: str, expect: str) -> Any:
    """The payload under `expect` ("result" or "status") of a response to
    `request_id`; raises the ToolSandboxError subclass of an error response,
    or ResponseError when the line is not a valid answer to this request."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ResponseError("the daemon's answer is not JSON: %s" % e, request_id=request_id) from None
    if not isinstance(obj, dict):
        raise ResponseError("the daemon's answer is not a JSON object", request_id=request_id)
    if obj.get("v") != PROTOCOL_VERSION:
        raise ResponseError("the daemon answered with protocol version %r, not %d" % (obj.get("v"), PROTOCOL_VERSION),
                            request_id=request_id)
    ok = obj.get("ok")
    rid = obj.get("id")
    if ok is False:
        err = obj.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("code"), str):
            raise ResponseError("an error answer without an error code", request_id=request_id)
        # A null id: an error about the connection, not one request (the
        # daemon could not read an id, refused the peer, or timed out).
        if rid is not None and rid != request_id:
            raise ResponseError("an error answer for request %r, expected %r" % (rid, request_id), request_id=request_id)
        message = err.get("message")
        raise error_from_code(err["code"], message if isinstance(message, str) else "", request_id=request_id)
    if ok is not True:
        raise ResponseError("the daemon's answer has no \"ok\" flag", request_id=request_id)
    if rid != request_id:
        raise ResponseError("an answer for request %r, expected %r" % (rid, request_id), request_id=request_id)
    if expect not in obj:
        raise ResponseError("the daemon's answer has no %r" % expect, request_id=request_id)
    return obj[expect]


def response_id(line: bytes) -> Any:
    """The id of a response line, or None when it cannot be read."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return obj.get("id") if isinstance(obj, dict) else None


def is_idle_close(line: bytes) -> bool:
    """The daemon's unsolicited answer on a connection that stayed idle past its
    request_timeout (or that it closes on shutdown): the request just written
    was not read, so it is safe to send it again on a new connection."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    if not isinstance(obj, dict) or obj.get("ok") is not False or obj.get("id") is not None:
        return False
    err = obj.get("error")
    return isinstance(err, dict) and err.get("code") == "timeout"
