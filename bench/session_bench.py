#!/usr/bin/python3
"""Sessions (protocol section 6.8): how long a session takes to answer its
first request, and what its stream costs per byte, against the same
command started bare (a child process on pipes, as letta-server starts an
MCP server today) and under bubblewrap.

Open to first response: from the start (the connect and the request; for
bare and bwrap, the spawn) to the first byte of the command's reply to one
line on its stdin, in a new session's own sandbox and in a session of a
kept workspace (its sandbox started by an earlier session: the keeper
starts the command). Two commands: python3 echoing one line (the floor), and
the MCP reference server server-everything answering `initialize` (an MCP
server's real start, node and its modules), when its package is installed
(scripts/lib.sh, install_test_mcp). The session runs under the shipped
default policy (the checkout's policies/, with the MCP packages bound
read-only for the second command). Interleaved rounds (bench/interleave.py)
with a quiet gap before each call (--gap); the load average is printed.

Per byte: --mib MiB through python3 copying its stdin to its stdout in 64
KiB writes, the client writing and reading at once; MiB/s and the time per
64 KiB through the session, against bare pipes.

Standard library only, as root:
  /usr/bin/python3 bench/session_bench.py [--build build] [--n 20] [--gap 0.5] [--mib 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import interleave  # noqa: E402
from daemon_bench import start_daemon  # noqa: E402
from toolsandbox_client import Client  # noqa: E402

MCP_DIR = "/var/lib/toolsandbox-test/mcp"
EVERYTHING = "/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
VENV_PY = "/var/lib/toolsandbox/venv/bin/python3"
ECHO = "import sys\nsys.stdout.write(sys.stdin.readline())\nsys.stdout.flush()\nsys.stdin.read()"
COPY = ("import os\nwhile True:\n    b = os.read(0, 65536)\n    if not b:\n        break\n"
        "    while b:\n        b = b[os.write(1, b):]")
INIT = (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "bench", "version": "1"}}}) + "\n").encode()
BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]


def stdout_of(session) -> bytes:
    """The session's next stdout payload (stderr skipped)."""
    while True:
        frame = session.read()
        if frame is None:
            raise RuntimeError("the session ended: %s" % session.record)
        if frame[0] == "stdout":
            return frame[1]


def first_response_session(sock: str, command: list[str], line: bytes) -> float:
    t0 = time.perf_counter()
    with Client(sock).open_session(command, organization_id="bench") as s:
        s.write(line)
        stdout_of(s)
        return (time.perf_counter() - t0) * 1000


def first_response_workspace(sock: str, command: list[str], line: bytes, workspace: str) -> float:
    """As first_response_session, in a kept workspace: no sandbox to start."""
    t0 = time.perf_counter()
    with Client(sock).open_session(command, organization_id="bench", workspace=workspace) as s:
        s.write(line)
        stdout_of(s)
        return (time.perf_counter() - t0) * 1000


def first_response_process(argv: list[str], line: bytes) -> float:
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdin.write(line)
    p.stdin.flush()
    os.read(p.stdout.fileno(), 65536)
    ms = (time.perf_counter() - t0) * 1000
    p.kill()
    p.wait()
    p.stdin.close()
    p.stdout.close()
    return ms


def throughput(send, recv_some, total: int) -> float:
    """Seconds to move `total` bytes: a thread sends, this one receives."""
    block = b"z" * 65536
    t0 = time.perf_counter()

    def writer():
        left = total
        while left > 0:
            send(block[:min(left, len(block))])
            left -= min(left, len(block))
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    got = 0
    while got < total:
        got += len(recv_some())
    t.join()
    return time.perf_counter() - t0


def write_policies(tmp: Path) -> Path:
    pol = tmp / "policies"
    shutil.copytree(REPO / "policies", pol)
    (pol / "mcp.json").write_text(json.dumps({"version": 1, "include": "default.json", "filesystem": {
        "binds": [{"source": MCP_DIR, "target": "/opt/mcp", "optional": True}]}}))
    (pol / "organizations.json").write_text(json.dumps({
        "version": 1, "default": {"privileged": False, "policy": "mcp", "allowed_policies": ["default", "mcp"]}}))
    return pol


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.5)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("session_bench.py runs the daemon: run it as root")
    tmp = Path(tempfile.mkdtemp(prefix="tsb-sess-", dir="/run"))
    pol = write_policies(tmp)
    proc, sock = start_daemon(args.build, tmp, 8, tag="-session", extra={
        "policies_dir": str(pol), "organizations": str(pol / "organizations.json"), "bind_allowlist": [MCP_DIR]})
    out: dict = {"gap_s": args.gap, "load_before": os.getloadavg()[0]}
    try:
        variants = {
            "bare python3": lambda: first_response_process([VENV_PY, "-c", ECHO], b"ping\n"),
            "bwrap python3": lambda: first_response_process(BWRAP + [VENV_PY, "-c", ECHO], b"ping\n"),
            "session python3": lambda: first_response_session(sock, ["python3", "-c", ECHO], b"ping\n"),
            "workspace python3": lambda: first_response_workspace(sock, ["python3", "-c", ECHO], b"ping\n", "py"),
        }
        if os.path.exists(MCP_DIR + EVERYTHING):
            variants.update({
                "bare server-everything": lambda: first_response_process(
                    ["/usr/bin/node", MCP_DIR + EVERYTHING, "stdio"], INIT),
                "bwrap server-everything": lambda: first_response_process(
                    BWRAP + ["/usr/bin/node", MCP_DIR + EVERYTHING, "stdio"], INIT),
                "session server-everything": lambda: first_response_session(
                    sock, ["node", "/opt/mcp" + EVERYTHING, "stdio"], INIT),
                "workspace server-everything": lambda: first_response_workspace(
                    sock, ["node", "/opt/mcp" + EVERYTHING, "stdio"], INIT, "node"),
            })
        gapped = {k: (lambda f: lambda: (time.sleep(args.gap), f())[1])(v) for k, v in variants.items()}
        res = interleave.rounds(gapped, args.n, warmups=2)
        out["first_response_ms"] = res
        print("# session_bench (%s, %d CPUs, gap %.2f s, n %d)" % (time.strftime("%Y-%m-%d %H:%M"),
                                                                  os.cpu_count() or 0, args.gap, args.n))
        print("%-28s %9s %9s %9s  %s" % ("open to first response", "median", "p10", "p90", "vs bare"))
        for k, v in res.items():
            base = res["bare " + k.split(" ", 1)[1]]["median"]
            print("%-28s %9.1f %9.1f %9.1f  %.2fx" % (k, v["median"], v["p10"], v["p90"], v["median"] / base))

        total = args.mib << 20
        rates = {}
        for name in ("bare pipes", "session"):
            samples = []
            for _ in range(3):
                if name == "session":
                    with Client(sock).open_session(["python3", "-c", COPY], organization_id="bench") as c:
                        secs = throughput(c.write, lambda: stdout_of(c), total)
                else:
                    p = subprocess.Popen([VENV_PY, "-c", COPY], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                    secs = throughput(p.stdin.write, lambda: os.read(p.stdout.fileno(), 1 << 16), total)
                    p.kill()
                    p.wait()
                samples.append(secs)
            secs = sorted(samples)[1]
            rates[name] = {"mib_per_s": args.mib / secs, "us_per_64kib": secs / (total / 65536) * 1e6}
        out["stream"] = rates
        print("%-28s %9s %12s" % ("stream, %d MiB each way" % args.mib, "MiB/s", "us/64KiB"))
        for k, v in rates.items():
            print("%-28s %9.0f %12.1f" % (k, v["mib_per_s"], v["us_per_64kib"]))
        out["load_after"] = os.getloadavg()[0]
        print("load average %.2f -> %.2f" % (out["load_before"], out["load_after"]))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
