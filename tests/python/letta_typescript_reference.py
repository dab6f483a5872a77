"""Letta's TypeScript tool path, as the reference the daemon is compared with.

Written from letta-ai/letta, the last release of the server:
  letta/services/tool_sandbox/typescript_generator.py
      convert_param_to_ts_value, is_async_typescript_function,
      generate_typescript_execution_script, parse_typescript_result
  letta/services/tool_sandbox/e2b_sandbox.py  what the E2B sandbox makes of an
      execution (its first result's text, its error, or neither)
  letta/utils.py  get_friendly_error_msg

The generator's output is the script Letta's E2B sandbox runs with
run_code(language="ts"); the daemon's execute runs the same text locally.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Letta's generator, parser and error message, restated once in
# letta_reference.py (typescript_generator.py, utils.py).
from letta_reference import (  # noqa: E402,F401
    convert_param_to_ts_value,
    generate_typescript_execution_script,
    get_friendly_error_msg,
    is_async_typescript_function,
    parse_typescript_result,
)


def e2b_result(tool_name, completion_text=None, error=None):
    """What Letta's E2B sandbox returns for an execution whose first result's
    text is `completion_text`, or which raised `error` = (name, value):
    (status, func_return)."""
    if completion_text is not None:
        return "success", parse_typescript_result(completion_text)[0]
    if error is not None:
        return "error", get_friendly_error_msg(tool_name, error[0], error[1])
    raise ValueError(f"Tool {tool_name} returned execution with None")
