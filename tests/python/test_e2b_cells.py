"""The Python cells the E2B backend sends (daemon/frontend/e2b/cells/), as the
daemon embeds them: without their leading comment block, @BLOB@ replaced by
one base64 literal."""

import base64
import glob
import json
import os
import re
import subprocess
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CELLS = os.path.join(REPO, "daemon", "frontend", "e2b", "cells")


def cell(name, blob):
    with open(os.path.join(CELLS, name), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)  # what daemon/cmake/embed_text.cmake leaves out
    text = "".join(lines)
    assert text.count("@BLOB@") == 1, name
    return text.replace("@BLOB@", base64.b64encode(json.dumps(blob).encode()).decode())


class E2BCellsTest(unittest.TestCase):
    def test_env_cell_sets_exactly_the_environment_and_leaves_no_name(self):
        code = cell("env_cell.py", {"TSB_CELL_A": "1", "TSB_CELL_B": "x y\n'\""})
        out = subprocess.run([sys.executable, "-I", "-c", code + "\nimport os, json\n"
                              "print(json.dumps([os.environ.get('TSB_CELL_A'), os.environ.get('TSB_CELL_B'),"
                              " '_tsb_env_cell' in globals()]))"],
                             capture_output=True, text=True, check=True)
        self.assertEqual(json.loads(out.stdout), ["1", "x y\n'\"", False])

    def test_tool_cell_runs_the_runner_in_its_own_process_with_the_given_environment(self):
        # A stand-in runner: echoes its stdin and the environment it got.
        runner = ("import os, sys, json\n"
                  "data = sys.stdin.read()\n"
                  "print(json.dumps({'stdin': data, 'env': os.environ.get('TSB_CELL_ENV'),"
                  " 'home_set': 'HOME' in os.environ}))\n"
                  "sys.stderr.write('to-stderr')\n"
                  "sys.exit(3)\n")
        code = cell("tool_cell.py", {"runner": runner, "request": "the request \u00e9", "env": {"TSB_CELL_ENV": "v"},
                                     "timeout": 30, "heartbeat": 5, "beat": "."})
        r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
        got = json.loads(r.stdout)
        self.assertEqual(got["stdin"], "the request \u00e9")
        self.assertEqual(got["env"], "v")
        self.assertTrue(got["home_set"])
        self.assertIn("to-stderr", r.stderr)

    def test_tool_cell_runs_the_runner_with_its_package(self):
        # The daemon's runner and its package (daemon/frontend/e2b/e2b.cc sends
        # them as the cell's "runner" and "package"), a request in nonce
        # mode, and its frame in what the cell prints.
        runner_dir = os.path.join(REPO, "isolate", "runner")
        with open(os.path.join(runner_dir, "toolsandbox_runner.py"), encoding="utf-8") as f:
            runner = f.read()
        package = {}
        for path in glob.glob(os.path.join(runner_dir, "_toolsandbox_runner", "*.py")):
            with open(path, encoding="utf-8") as f:
                package[os.path.relpath(path, runner_dir)] = f.read()
        nonce = "e2" * 16
        request = {"nonce": nonce, "tool_name": "add", "source_code": "def add(a, b):\n    return a + b\n",
                   "args": {"a": 2, "b": 40}}
        code = cell("tool_cell.py", {"runner": runner, "package": package, "request": json.dumps(request),
                                     "env": {}, "timeout": 60, "heartbeat": 5, "beat": "."})
        # On stdin: the cell is larger than one argument may be.
        r = subprocess.run([sys.executable, "-I", "-"], input=code, capture_output=True, text=True)
        frame = re.search("<<TSB-RESULT-%s>>([A-Za-z0-9+/=]*)<<TSB-END-%s>>" % (nonce, nonce), r.stdout)
        self.assertIsNotNone(frame, (r.stdout, r.stderr))
        self.assertEqual(json.loads(base64.b64decode(frame.group(1))), {"results": 42, "agent_state": None})

    def test_a_blob_cannot_end_the_string_literal(self):
        hostile = {"runner": '")\nimport os\nos.system("id")\n#', "request": "\")", "env": {}, "timeout": 1,
                   "heartbeat": 1, "beat": ""}
        code = cell("tool_cell.py", hostile)
        blob_line = [line for line in code.splitlines() if line.startswith("_tsb_tool_cell(")]
        self.assertEqual(len(blob_line), 1)
        self.assertRegex(blob_line[0], r'^_tsb_tool_cell\("[A-Za-z0-9+/=]*"\)$')


if __name__ == "__main__":
    unittest.main()
