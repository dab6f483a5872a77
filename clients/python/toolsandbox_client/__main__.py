"""Command line: python3 -m toolsandbox_client status | exec FILE | call FILE --args JSON

    python3 -m toolsandbox_client status
    python3 -m toolsandbox_client exec script.py --org org-123
    python3 -m toolsandbox_client call tool.py --args '{"a": 1, "b": 2}' --env API_KEY

FILE may be "-" for stdin. The answer is printed as JSON on stdout.
--env NAME=VALUE sets a variable for the tool; --env NAME passes this
process's value of NAME (nothing else of this process's environment reaches
the tool). The socket is --socket, else $TOOLSANDBOXD_SOCKET, else
/run/toolsandboxd/toolsandboxd.sock.

Exit status: 0 the run succeeded (or status answered), 1 the tool failed
(status "error"), 2 bad usage, 3 the daemon refused the request or could not
be reached.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from typing import Any, Dict, List, Optional

from .client import Client
from .errors import ToolSandboxError
from .protocol import DEFAULT_SOCKET_PATH

EXIT_OK, EXIT_TOOL_FAILED, EXIT_USAGE, EXIT_DAEMON = 0, 1, 2, 3


class UsageError(Exception):
    pass


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UsageError("cannot read %s: %s" % (path, e.strerror or e)) from None


def _json_arg(text: str, what: str) -> Any:
    """JSON text, or @FILE for JSON read from a file."""
    if text.startswith("@"):
        text = _read(text[1:])
    try:
        return json.loads(text)
    except ValueError as e:
        raise UsageError("%s is not valid JSON: %s" % (what, e)) from None


def _env(items: Optional[List[str]]) -> Optional[Dict[str, str]]:
    if not items:
        return None
    env: Dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name:
            raise UsageError("--env wants NAME=VALUE or NAME, not %r" % item)
        if not sep:
            if name not in os.environ:
                raise UsageError("--env %s: no such variable in this environment" % name)
            value = os.environ[name]
        env[name] = value
    return env


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _guess_tool_name(source: str, path: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise UsageError("%s does not parse: %s (pass --tool-name to send it anyway)" % (path, e)) from None
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(set(names)) == 1:
        return names[0]
    if _stem(path) in names:
        return _stem(path)
    if not names:
        raise UsageError("%s defines no function; pass --tool-name" % path)
    raise UsageError("%s defines several functions (%s); pass --tool-name" % (path, ", ".join(sorted(set(names)))))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m toolsandbox_client", description="toolsandboxd client")
    p.add_argument("--socket", default=os.environ.get("TOOLSANDBOXD_SOCKET", DEFAULT_SOCKET_PATH),
                   help="the daemon's socket (default: $TOOLSANDBOXD_SOCKET or %s)" % DEFAULT_SOCKET_PATH)
    p.add_argument("--client-timeout", type=float, default=None, metavar="S",
                   help="give up waiting for the daemon after S seconds (default: wait)")
    sub = p.add_subparsers(dest="command", metavar="status|exec|call")
    sub.required = True
    sub.add_parser("status", help="print the daemon's status")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", metavar="FILE", help="Python file, or - for stdin")
        sp.add_argument("--tool-name", help="tool name (a Python identifier)")
        sp.add_argument("--org", "--organization-id", dest="org", default=os.environ.get("TOOLSANDBOX_ORG", "org-cli"),
                        help="organization id (default: $TOOLSANDBOX_ORG or org-cli)")
        sp.add_argument("--env", action="append", metavar="NAME[=VALUE]", help="a variable for the tool (repeatable)")
        sp.add_argument("--timeout", type=float, help="run timeout in seconds (lowered to the policy's)")
        sp.add_argument("--policy", help="policy name (must be allowed for the organization)")
        sp.add_argument("--sandbox-config", metavar="JSON", help='{"type": ..., "config": {...}} for the fingerprint')
        sp.add_argument("--agent-id")
        sp.add_argument("--project-id")

    ex = sub.add_parser("exec", help="run a complete script (Letta framing)")
    common(ex)
    call = sub.add_parser("call", help="call a tool function with JSON arguments")
    common(call)
    call.add_argument("--args", default="{}", metavar="JSON", help="arguments as a JSON object (or @FILE)")
    call.add_argument("--json-schema", metavar="JSON", help="the tool's json_schema (or @FILE)")
    call.add_argument("--agent-state", metavar="JSON", help="agent state object (or @FILE)")
    call.add_argument("--pip", action="append", metavar="REQ", help="pip requirement (E2B backend only; repeatable)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    client = Client(ns.socket, timeout=ns.client_timeout)
    try:
        if ns.command == "status":
            print(json.dumps(client.status(), indent=2, sort_keys=True))
            return EXIT_OK
        source = _read(ns.file)
        common: Dict[str, Any] = dict(
            organization_id=ns.org,
            env=_env(ns.env),
            timeout=ns.timeout,
            policy=ns.policy,
            sandbox_config=_json_arg(ns.sandbox_config, "--sandbox-config") if ns.sandbox_config else None,
            agent_id=ns.agent_id,
            project_id=ns.project_id,
        )
        if ns.command == "exec":
            name = ns.tool_name or (_stem(ns.file) if _stem(ns.file).isidentifier() and ns.file != "-" else "script")
            result = client.execute(source, tool_name=name, **common)
        else:
            args = _json_arg(ns.args, "--args")
            if not isinstance(args, dict):
                raise UsageError("--args must be a JSON object")
            result = client.run_tool(
                source,
                tool_name=ns.tool_name or _guess_tool_name(source, ns.file),
                args=args,
                json_schema=_json_arg(ns.json_schema, "--json-schema") if ns.json_schema else None,
                agent_state=_json_arg(ns.agent_state, "--agent-state") if ns.agent_state else None,
                pip_requirements=ns.pip,
                **common,
            )
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True, ensure_ascii=False))
        return EXIT_OK if result.ok else EXIT_TOOL_FAILED
    except UsageError as e:
        print("error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except (TypeError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except ToolSandboxError as e:
        print("error: %s: %s" % (e.code, e.message), file=sys.stderr)
        return EXIT_DAEMON
    except BrokenPipeError:  # stdout closed early (| head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
