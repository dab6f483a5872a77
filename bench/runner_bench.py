#!/usr/bin/env python3
"""The tool runner alone, outside any sandbox, in both of its modes, beside
bare Python running the script Letta generates for the same call.

Variants, interleaved (bench/interleave.py: a fresh random order every
round, after warm-ups), each one process start per run:

  letta     /usr/bin/python3 - < Letta's generated script for add(2, 3)
            (tests/python/letta_reference.py, generate_script: what
            letta-server runs in its local sandbox)
  channel   the runner as a local sandbox starts it (kRunnerBoot:
            run_channel()), its request and result on a socket pair
  nonce     the runner as an E2B cell starts it (run()): the request with a
            nonce on a stdin pipe, the result in a frame on stdout

Reports the median wall time and the median CPU time (RUSAGE_CHILDREN: the
runner's processes, both of them in the nonce mode) of each, and each
against `letta`. It isolates what the runner costs from what the sandbox
costs (bench/daemon_bench.py measures both through the daemon).

The runner is the build's (--build, default build/): its directory
share/toolsandbox/runner holds the checked-hash .pyc the daemon's runs
import, so it is not compiled on every run, as in a sandbox.

Standard library only: /usr/bin/python3 bench/runner_bench.py [--n 200] [--build build] [--result-mb 0]
--result-mb M makes the tool return a string of M MiB instead (a large
returned value), and the Letta script returns the same.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))
from letta_reference import generate_script  # noqa: E402

import interleave  # noqa: E402  (bench/, beside this file)

PYTHON = "/usr/bin/python3"
FLAGS = ["-I", "-S", "-B", "-u", "-X", "utf8"]
BOOT = "import sys\nsys.path.append(%r)\nimport toolsandbox_runner\ntoolsandbox_runner.%s()\n"
SCHEMA = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                          "b": {"type": "integer"}}}}
CPU_MS: dict[str, list[float]] = {}


def children_cpu_ms() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * 1e3


def measured(name: str, fn) -> float:
    c0 = children_cpu_ms()
    t0 = time.perf_counter_ns()
    fn()
    wall = (time.perf_counter_ns() - t0) / 1e6
    CPU_MS.setdefault(name, []).append(children_cpu_ms() - c0)
    return wall


def part(obj) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--result-mb", type=float, default=0)
    args = ap.parse_args()
    runner_dir = args.build / "share" / "toolsandbox" / "runner"
    if not list((runner_dir / "__pycache__").glob("toolsandbox_runner.*.pyc")):
        sys.exit("no runner bytecode in %s (build the tree first)" % runner_dir)
    size = int(args.result_mb * (1 << 20))
    tool = ("def add(a, b):\n    return a + b\n" if not size else
            "def add(a, b):\n    return 'x' * %d\n" % size)
    call_args = {"a": 2, "b": 3}
    letta = generate_script("add", tool, call_args, SCHEMA).encode()
    expected = json.dumps(5 if not size else "x" * size)
    cwd = tempfile.mkdtemp(prefix="tsb-runner-bench-")

    def run_letta():
        r = subprocess.run([PYTHON, "-"], input=letta, capture_output=True, cwd=cwd)
        if r.returncode != 0:
            raise RuntimeError("Letta's script failed: %r" % r.stderr[-500:])

    def run_channel():
        a, b = socket.socketpair()
        p = subprocess.Popen([PYTHON, *FLAGS, "-c", BOOT % (str(runner_dir), "run_channel")], stdin=b,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
        b.close()
        a.sendall(part({"tool_name": "add", "source_code": tool}))
        if read_exact(a, 19) != b"TSB1 agent_state=0\n":
            raise RuntimeError("no declaration")
        a.sendall(part({"args": call_args, "json_schema": SCHEMA}))
        a.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := a.recv(1 << 20):
            chunks.append(chunk)
        a.close()
        p.wait()
        if json.loads(b"".join(chunks))["results"] != json.loads(expected):
            raise RuntimeError("the channel runner's result is wrong")

    def run_nonce():
        nonce = secrets.token_hex(16)
        req = json.dumps({"nonce": nonce, "tool_name": "add", "source_code": tool, "args": call_args,
                          "json_schema": SCHEMA}).encode()
        r = subprocess.run([PYTHON, *FLAGS, "-c", BOOT % (str(runner_dir), "run")], input=req, capture_output=True,
                           cwd=cwd)
        if r.returncode != 0 or ("<<TSB-RESULT-" + nonce).encode() not in r.stdout:
            raise RuntimeError("the nonce runner failed: %r" % r.stderr[-500:])

    variants = {
        "letta": lambda: measured("letta", run_letta),
        "channel": lambda: measured("channel", run_channel),
        "nonce": lambda: measured("nonce", run_nonce),
    }
    load_before = os.getloadavg()
    lat = interleave.rounds(variants, args.n, before_rounds=CPU_MS.clear)
    load_after = os.getloadavg()
    cpu = {name: statistics.median(v) for name, v in CPU_MS.items()}
    print("add(2, 3)" if not size else "a returned string of %g MiB" % args.result_mb,
          "- n = %d, load average %.2f before, %.2f after" % (args.n, load_before[0], load_after[0]))
    print("\n| variant | wall ms, median | p95 | vs letta | CPU ms, median | vs letta |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in variants:
        m = lat[name]["median"]
        print("| %s | %.2f | %.2f | x%.2f | %.2f | x%.2f |" % (name, m, lat[name]["p95"], m / lat["letta"]["median"],
                                                             cpu[name], cpu[name] / cpu["letta"]))
    shutil.rmtree(cwd, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
