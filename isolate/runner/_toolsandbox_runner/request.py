"""A request's checks, shared by the nonce and channel modes, and the
parameters its function declares (read from the source's syntax tree,
never by running it)."""

from .base import RequestError


_REQUEST_FIELDS = frozenset(
    ["nonce", "tool_name", "source_code", "args", "json_schema", "agent_state", "agent_id", "env"]
)


def _declared_params(source, tool_name):
    """Parameter names of every def named tool_name, as Letta's
    parse_function_arguments finds them (ast.walk over the whole module, the
    positional-or-keyword parameters of each def). The
    source is parsed, never executed. Unparsable source declares nothing; the
    child will report the SyntaxError."""
    # The C-level _ast module and compile(PyCF_ONLY_AST) are what ast.parse
    # uses; importing the ast module itself would cost ~10 ms of startup.
    import _ast

    try:
        tree = compile(source, "<tool>", "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names = set()
    stack = [tree]
    while stack:  # ast.walk, without recursion
        node = stack.pop()
        if isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef)) and node.name == tool_name:
            # node.args.args only, as Letta: a positional-only or
            # keyword-only agent_state is not injected (the call then fails
            # as it does in Letta).
            names.update(arg.arg for arg in node.args.args)
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, _ast.AST):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, _ast.AST))
    return names


def _validate_request(req, declared=None):
    """Check the request and build what the tool process receives (no
    nonce). declared: _declared_params of its source, when known already."""
    import keyword

    unknown = sorted(set(req) - _REQUEST_FIELDS)
    if unknown:
        raise RequestError("ValueError", "unknown request field(s): " + ", ".join(map(repr, unknown)))
    tool_name = req.get("tool_name")
    if not isinstance(tool_name, str) or not tool_name.isidentifier() or keyword.iskeyword(tool_name):
        raise RequestError("ValueError", "tool_name must be a Python identifier")
    source = req.get("source_code")
    if not isinstance(source, str):
        raise RequestError("ValueError", "source_code must be a string")
    args = req.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise RequestError("ValueError", "args must be an object")
    agent_state = req.get("agent_state")
    if agent_state is not None and not isinstance(agent_state, dict):
        raise RequestError("ValueError", "agent_state must be an object or null")
    agent_id = req.get("agent_id")
    if agent_id is not None and not isinstance(agent_id, str):
        raise RequestError("ValueError", "agent_id must be a string or null")
    env = req.get("env")
    if env is None:
        env = {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("ValueError", "env must be an object of strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise RequestError("ValueError", "env holds a name or value no environment can")

    schema = req.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise RequestError("ValueError", "json_schema must be an object or null")
        params = schema.get("parameters", {})
        props = params.get("properties", {}) if isinstance(params, dict) else None
        if not isinstance(props, dict):
            raise RequestError("ValueError", "json_schema.parameters.properties must be an object")
        extra = [name for name in args if name not in props]
        if extra:
            raise RequestError(
                "TypeError",
                "%s() got unexpected argument(s) not in its json_schema: %s"
                % (tool_name, ", ".join(map(repr, extra))),
            )

    if declared is None:
        declared = _declared_params(source, tool_name)
    inject_agent_state = "agent_state" in declared
    inject_agent_id = "agent_id" in declared
    for name, injected in (("agent_state", inject_agent_state), ("agent_id", inject_agent_id)):
        if injected and name in args:
            raise RequestError(
                "TypeError", "%s() argument %r is supplied by the sandbox, not by args" % (tool_name, name)
            )

    child_req = {
        "tool_name": tool_name,
        "source_code": source,
        "args": args,
        "inject_agent_state": inject_agent_state,
        # Only a tool that declares agent_state ever sees it: it carries secrets.
        "agent_state": agent_state if inject_agent_state else None,
        "inject_agent_id": inject_agent_id,
        "agent_id": agent_id if inject_agent_id else None,
        "env": env,
    }
    return child_req, inject_agent_state


def _validate_unpickle_request(req):
    unknown = sorted(set(req) - {"nonce", "unpickle"})
    if unknown:
        raise RequestError("ValueError", "an unpickle request has only nonce and unpickle, not " + ", ".join(map(repr, unknown)))
    if not isinstance(req["unpickle"], str):
        raise RequestError("ValueError", "unpickle must be a base64 string")
    return {"unpickle": req["unpickle"]}
