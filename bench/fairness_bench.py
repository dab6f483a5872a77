#!/usr/bin/python3
"""A well-behaved client's run latency beside a hostile client, against an
idle daemon (docs/SECURITY.md, "Per-peer fairness").

Starts two daemons of the same build on temporary sockets, configured
alike (the socket's group is that of gid 65534, which may connect):

  idle        only the well-behaved client (uid 0) uses it;
  contended   a hostile client, a forked child running as uid 65534, holds
              it at its limits the whole time: runs of a minute on as many
              connections as it can (sent again as soon as one is answered,
              busy included), request lines of --line-kib KiB left
              unfinished (opened again when the daemon closes them), and
              idle connections up to max_connections.

The well-behaved client keeps one persistent connection to each daemon
(as letta-server's pool does) and calls `run_tool` (add(2, 3)) on both in
interleaved rounds (bench/interleave.py: 5 warm-ups, a fresh random order
every round), pausing --gap seconds before each call (the idle gap). It
reports median/p95 of each, the ratio contended / idle of the medians, the
runs refused (`busy`, which a well-behaved client must never get), and the
load average before and after.

Standard library only, as root:
  /usr/bin/python3 bench/fairness_bench.py [--n 100] [--gap 0.05] [--build build]
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
from toolsandbox_client import Client, ToolSandboxError  # noqa: E402

import interleave  # noqa: E402  (bench/, beside this file)
from daemon_bench import start_daemon  # noqa: E402

HOSTILE_UID = 65534
TOOL = "def add(a, b):\n    return a + b\n"
SLEEP_TOOL = "import time\n\ndef sleeper(seconds: float) -> str:\n    time.sleep(seconds)\n    return 'woke'\n"


def sleep_line(i: int) -> bytes:
    return json.dumps({"v": 1, "id": "hostile-%d" % i, "type": "run_tool", "tool_name": "sleeper",
                       "organization_id": "bench", "source_code": SLEEP_TOOL, "args": {"seconds": 60}}).encode() + b"\n"


def hostile(sock_path: str, runs: int, lines: int, line_bytes: int, idle: int) -> None:
    """The hostile client, in a forked child: never returns."""
    try:
        os.setgroups([])
        os.setgid(HOSTILE_UID)
        os.setuid(HOSTILE_UID)
        head = b'{"v":1,"id":"partial","type":"execute","organization_id":"bench","script":"'
        partial = head + b"#" * (line_bytes - len(head))
        conns: dict[socket.socket, str] = {}

        def open_one(kind: str, i: int = 0) -> None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                s.setblocking(False)
                if kind == "run":
                    s.send(sleep_line(i))
                elif kind == "line":
                    s.settimeout(5)
                    s.sendall(partial)  # no newline, ever
                    s.setblocking(False)
                conns[s] = kind
            except OSError:
                s.close()

        def fill() -> None:
            have = {k: sum(1 for v in conns.values() if v == k) for k in ("run", "line", "idle")}
            for i in range(runs - have["run"]):
                open_one("run", i)
            for _ in range(lines - have["line"]):
                open_one("line")
            for _ in range(idle - have["idle"]):
                open_one("idle")

        fill()
        while True:
            ready, _, _ = select.select(list(conns), [], [], 0.1)
            for s in ready:
                try:
                    data = s.recv(1 << 16)
                except OSError:
                    data = b""
                if data and conns[s] == "run":
                    try:
                        s.send(sleep_line(0))  # answered (busy, mostly): at once again
                        continue
                    except OSError:
                        pass
                if not data or conns[s] != "run":
                    conns.pop(s, None)  # closed by the daemon (a line or a connection given up): again
                    s.close()
            fill()
    except BaseException:  # noqa: B902 - the child never returns into the benchmark
        pass
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--gap", type=float, default=0.05, help="idle seconds before each call (default 0.05)")
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--hostile-runs", type=int, default=48)
    ap.add_argument("--line-kib", type=int, default=900)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    group = grp.getgrgid(HOSTILE_UID).gr_name
    extra = {"socket": {"group": group, "mode": "0660"}, "allowed_uids": [0, HOSTILE_UID],
             "max_queued_runs": 32, "max_frame_bytes": "1MiB", "max_buffered_bytes": "8MiB", "max_connections": 128,
             "request_timeout": "600s"}
    rundir = "/run" if os.access("/run", os.W_OK) else None
    daemons, clients, child = [], {}, None
    report = {"n": args.n, "gap_s": args.gap, "load_before": os.getloadavg(), "machine": os.uname().release}
    try:
        for name, tag, uid_base in (("idle", "-fair-idle", 1 << 30), ("contended", "-fair-contended", 1 << 31)):
            tmp = Path(tempfile.mkdtemp(prefix="tsb-bench-fair-", dir=rundir))
            proc, sock = start_daemon(args.build, tmp, 8, tag, uid_base,
                                      {**extra, "socket": {**extra["socket"], "path": str(tmp / "d.sock")}})
            daemons.append((proc, tmp))
            clients[name] = Client(sock, persistent=True)
            clients[name].status()  # its connection opens now: a peer before the hostile one
        sock = str(daemons[1][1] / "d.sock")
        child = os.fork()
        if child == 0:
            hostile(sock, args.hostile_runs, 16, args.line_kib << 10, 128)
        time.sleep(3)  # the hostile client at its limits
        st = clients["contended"].status()
        print("contended daemon: %d runs in flight, %d queued, %d bytes buffered, %d connections open, peers %s"
              % (st["runs_in_flight"], st["runs_queued"], st["buffered_bytes"], st["connections_open"],
                 st.get("fairness", {}).get("peers", "?")))
        refused = {"idle": 0, "contended": 0}

        def call(name: str):
            def one() -> float:
                time.sleep(args.gap)
                t0 = time.perf_counter_ns()
                try:
                    r = clients[name].run_tool(TOOL, tool_name="add", args={"a": 2, "b": 3}, organization_id="bench")
                    if r.func_return != 5:
                        raise RuntimeError("wrong result: %r" % (r.func_return,))
                except ToolSandboxError as e:
                    refused[name] += 1
                    print("%s: refused: %s: %s" % (name, e.code, e.message), file=sys.stderr)
                return (time.perf_counter_ns() - t0) / 1e6
            return one

        lat = interleave.rounds({"idle": call("idle"), "contended": call("contended")}, args.n)
        report["latency_ms"] = lat
        report["refused"] = refused
        ratio = lat["contended"]["median"] / lat["idle"]["median"]
        report["ratio_median"] = ratio
        print("| daemon | median ms | p95 ms | refused |")
        print("|---|---:|---:|---:|")
        for name in ("idle", "contended"):
            print("| %s | %.2f | %.2f | %d |" % (name, lat[name]["median"], lat[name]["p95"], refused[name]))
        print("\ncontended / idle (medians): x%.2f; idle gap before each call %.3f s" % (ratio, args.gap))
        st = clients["contended"].status()
        report["contended_status"] = {k: st.get(k) for k in ("runs_in_flight", "runs_queued", "buffered_bytes",
                                                              "connections_open", "rejected_busy", "fairness")}
        report["load_after"] = os.getloadavg()
        print("load average before %s, after %s" % (report["load_before"], report["load_after"]))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        for proc, tmp in daemons:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if not refused_any(report) else 1


def refused_any(report: dict) -> bool:
    return any(report.get("refused", {}).values())


if __name__ == "__main__":
    sys.exit(main())
