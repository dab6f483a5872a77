"""The whole of test_runner.py again, in the runner's channel and pooled modes.

For every test class of test_runner.py (each a RunnerCase) this module
defines a subclass named Channel<Name> with mode = "channel": run_tool then
starts the runner with run_channel() and speaks the result channel over a
socket pair (see test_runner.py); and Pooled<Name> with mode = "pooled": a
warm runner (run_pooled()), its hand-over, then the same channel. Tests of one mode only are skipped in the
other by their @nonce_only / @channel_only marks, each with its reason.

test_runner is imported as a module (not `from test_runner import *`), so
that its own classes, which run in nonce mode, are collected only there.

    /usr/bin/python3 -m pytest tests/python/test_runner_channel.py
    /usr/bin/python3 -m unittest discover -s tests/python -p test_runner_channel.py -v
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_runner as base  # noqa: E402


def _channel_classes():
    classes = {}
    for name, cls in sorted(vars(base).items()):
        if isinstance(cls, type) and issubclass(cls, base.RunnerCase) and cls is not base.RunnerCase:
            for mode in ("channel", "pooled"):
                sub = type(mode.capitalize() + name, (cls,), {"mode": mode, "__module__": __name__,
                                                           "__doc__": cls.__doc__})
                classes[sub.__name__] = sub
    return classes


globals().update(_channel_classes())

if __name__ == "__main__":
    unittest.main()
