"""The daemon as shipped: its embedded policies, with their warm pools.

    /usr/bin/python3 -m unittest tests/python/test_shipped_defaults.py -v

A daemon on the shipped policies (no policies directory: the ones compiled
into the binary) answers a tool's second and later calls, in both modes,
from a warm sandbox (record.warm), when the calls come as an agent makes
them: one at a time, a moment apart. The tests the README runs
(tests/readme/check_readme.py) see the same with no configuration file at
all; this tier sees it with the test daemon's own socket and uid range.

Needs root (see daemon_fixture.py): skipped otherwise, failed under CI=true.
"""

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402
import letta_reference as L  # noqa: E402

ORG = "org-shipped-defaults"
ADD = "def add(a: int, b: int) -> int:\n    return a + b\n"
SCHEMA = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                           "b": {"type": "integer"}},
                                        "required": ["a", "b"]}}
GAP = 1.5  # seconds between calls: an agent's calls come between model calls


class ShippedDefaults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.environ.get("TSB_TEST_POLICIES_DIR"):
            raise unittest.SkipTest("TSB_TEST_POLICIES_DIR replaces the shipped policies")
        cls.daemon = F.start_daemon(cls)
        cls.client = cls.daemon.client()

    def calls(self, call, n=4):
        records = []
        for _ in range(n):
            time.sleep(GAP)
            r = call()
            self.assertEqual(r.status, "success", r)
            records.append(r.record)
        return records

    def test_later_tool_calls_are_warm(self):
        recs = self.calls(lambda: self.client.run_tool(ADD, tool_name="add", args={"a": 2, "b": 3},
                                                       organization_id=ORG))
        self.assertEqual([r["policy"] for r in recs], ["default"] * len(recs))
        self.assertTrue(all(r["warm"] for r in recs[1:]), [r["warm"] for r in recs])

    def test_later_letta_scripts_are_warm(self):
        script = L.generate_script("add", ADD, {"a": 2, "b": 3}, SCHEMA)
        results = []

        def one():
            r = self.client.execute(script, tool_name="add", organization_id=ORG)
            results.append(r.func_return)
            return r
        recs = self.calls(one)
        self.assertTrue(all(r["warm"] for r in recs[1:]), [r["warm"] for r in recs])
        # Typed when the default venv has pydantic 2, which Debian 12 does
        # not package; else Letta's script falls back to str()
        # (docs/CONFIGURATION.md, "The default venv").
        probe = subprocess.run(["/var/lib/toolsandbox/venv/bin/python3", "-c",
                                "import pydantic, sys; sys.exit(int(pydantic.VERSION.split('.')[0]) < 2)"],
                               capture_output=True)
        self.assertEqual(results, [5 if probe.returncode == 0 else "5"] * len(results))


if __name__ == "__main__":
    unittest.main()
