#!/usr/bin/python3
"""Density: what an idle warm sandbox and a sleeping run cost, and whether
a daemon holding hundreds of sleeping runs still answers a new small run
as fast as an idle one.

Phases, one daemon (the shipped policies, copied as they are, plus "sleepy":
the shipped default with a longer wall timeout, for the sleepers):
  1. idle     --n small runs (the shipped default policy, warm when a warm
              sandbox is ready), --gap s of quiet before each
  2. fill     --sleepers runs of "sleepy", each on its own connection,
              that sleep until told to end (their stdin is never read; they
              end when their connection closes, as a client that goes away);
              the bench waits until the daemon's status counts them all in
              flight, then until the host is quiet (every sleeper asleep)
  3. held     --n small runs again, same gap, while every sleeper still runs
  4. drain    the sleepers' connections close; the bench times how long
              until the daemon counts no run in flight
The small runs of 1 and 3 are the same call; the report gives their
medians and the ratio held / idle, with the daemon's own record.wall_ms.

Costs, taken while the sleepers are held: host memory (MemAvailable)
per sleeping run and the descriptors the spawner and the front end hold
per run; the daemon's warm_pool status before any run is kept in the
report (an idle warm sandbox's own cost is in README.md and
docs/BENCHMARKS.md, not measured here).

Standard library only, as root:
  /usr/bin/python3 bench/density_bench.py [--build build] [--sleepers 500]
      [--n 12] [--gap 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
from toolsandbox_client import Client  # noqa: E402
from toolsandbox_client import protocol as P  # noqa: E402

from daemon_bench import start_daemon  # noqa: E402
from warm_bench import ARGS, SCHEMA, TOOL  # noqa: E402

ORG = "bench"
SLEEPER = "import time\ntime.sleep(3600)\n"


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def daemon_pids(top: int) -> dict[str, int]:
    """The spawner (the daemon's own process) and its front end, by name."""
    out = {"spawner": top}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == top and "toolsandboxd-fr" in stat:
                out["frontend"] = int(p.name)
    return out


def fds(pid: int) -> int:
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return -1


def write_policies(tmp: Path) -> Path:
    pol = tmp / "policies"
    shutil.copytree(REPO / "policies", pol)
    (pol / "sleepy.json").write_text(json.dumps({"version": 1, "include": "default.json",
                                                 "limits": {"wall_timeout": "3600s"}, "warm_pool": {"max": 0, "min": 0}}))
    (pol / "organizations.json").write_text(json.dumps({
        "version": 1, "default": {"privileged": False, "policy": "default", "allowed_policies": ["default", "sleepy"]}}))
    return pol


class Sleeper:
    """One sleeping run on its own connection: the request sent, the answer
    never awaited; closing the socket ends the run."""

    def __init__(self, sock_path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock_path)
        req = P.execute_request(SLEEPER, tool_name="sleep", organization_id=ORG, policy="sleepy")
        self.sock.sendall(P.encode_request(req))

    def close(self) -> None:
        self.sock.close()


def small_runs(client: Client, n: int, gap: float) -> list[dict]:
    out = []
    for _ in range(n):
        time.sleep(gap)
        t0 = time.perf_counter_ns()
        r = client.run_tool(TOOL, tool_name="add", args=ARGS, json_schema=SCHEMA, organization_id=ORG)
        wall = (time.perf_counter_ns() - t0) / 1e6
        if r.status != "success" or str(r.func_return) != "5":
            raise RuntimeError("a small run failed: %r %r" % (r.func_return, r.stderr))
        out.append({"wall_ms": wall, "warm": bool(r.record.get("warm")), "record_wall_ms": float(r.record["wall_ms"])})
    return out


def summary(samples: list[dict]) -> dict:
    walls = [s["wall_ms"] for s in samples]
    return {"n": len(samples), "warm": sum(s["warm"] for s in samples), "median_ms": statistics.median(walls),
            "record_median_ms": statistics.median(s["record_wall_ms"] for s in samples),
            "max_ms": max(walls)}


def cpu_busy(interval: float = 1.0) -> float:
    """The host's busy fraction over `interval` (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # all, idle + iowait
    t0, i0 = sample()
    time.sleep(interval)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def in_flight(client: Client) -> int:
    return int(client.status().get("runs_in_flight", 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--sleepers", type=int, default=500)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--gap", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("density_bench.py runs the daemon: run it as root")
    tmp = Path(tempfile.mkdtemp(prefix="tsb-density-", dir="/run" if os.access("/run", os.W_OK) else None))
    pol = write_policies(tmp)
    s = args.sleepers
    # Room for every sleeper, the small run and the warm pool: run slots,
    # connections and uid slots (every sandbox, warm or running, holds one).
    proc, sock = start_daemon(args.build, tmp, s + 8, tag="-density",
                              extra={"policies_dir": str(pol), "organizations": str(pol / "organizations.json"),
                                     "max_connections": s + 64, "max_queued_runs": s + 64,
                                     "engine": {"uid_slots": s + 32}})
    report: dict = {"sleepers": s, "gap_s": args.gap, "machine": os.uname().release, "cpus": os.cpu_count()}
    sleepers: list[Sleeper] = []
    try:
        client = Client(sock, timeout=120)
        pids = daemon_pids(proc.pid)
        time.sleep(2)  # the default pool fills
        st = client.status()
        report["idle"] = {"load": os.getloadavg(), "fds": {k: fds(v) for k, v in pids.items()},
                          "mem_available_kib": mem_available_kib(), "warm_pool": st.get("warm_pool")}
        report["idle_runs"] = summary(small_runs(client, args.n, args.gap))

        t0 = time.monotonic()
        for _ in range(s):
            sleepers.append(Sleeper(sock))
        while in_flight(client) < s:
            if time.monotonic() - t0 > 600:
                raise RuntimeError("only %d of %d sleepers started in 600 s" % (in_flight(client), s))
            time.sleep(0.5)
        report["fill_s"] = time.monotonic() - t0
        # Counted in flight once admitted: their interpreters may still be
        # starting. Held means asleep: the host quiet again (under 10 %
        # busy over a second), the pool refilled.
        while cpu_busy() > 0.10:
            if time.monotonic() - t0 > 900:
                raise RuntimeError("the host did not become quiet with the sleepers started")
        report["settled_s"] = time.monotonic() - t0
        held_mem = mem_available_kib()
        held_fds = {k: fds(v) for k, v in pids.items()}
        report["held"] = {"load": os.getloadavg(), "fds": held_fds, "mem_available_kib": held_mem,
                          "in_flight": in_flight(client)}
        report["held_runs"] = summary(small_runs(client, args.n, args.gap))
        if in_flight(client) < s:
            raise RuntimeError("sleepers ended while held: %d in flight" % in_flight(client))
        report["per_sleeper"] = {
            "mem_kib": (report["idle"]["mem_available_kib"] - held_mem) / s,
            "fds": {k: (held_fds[k] - report["idle"]["fds"][k]) / s for k in held_fds},
        }

        t0 = time.monotonic()
        for sl in sleepers:
            sl.close()
        sleepers.clear()
        while in_flight(client) > 0:
            if time.monotonic() - t0 > 120:
                raise RuntimeError("%d runs still in flight 120 s after their clients left" % in_flight(client))
            time.sleep(0.1)
        report["drain_s"] = time.monotonic() - t0
        report["ratio_held_idle"] = report["held_runs"]["median_ms"] / report["idle_runs"]["median_ms"]
    finally:
        for sl in sleepers:
            sl.close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(report, indent=2))
    print("\nsmall run, idle daemon: %.2f ms median (%d/%d warm, record %.2f ms)" % (
        report["idle_runs"]["median_ms"], report["idle_runs"]["warm"], args.n, report["idle_runs"]["record_median_ms"]))
    print("small run, %d sleeping runs held: %.2f ms median (%d/%d warm, record %.2f ms): %.2fx idle" % (
        s, report["held_runs"]["median_ms"], report["held_runs"]["warm"], args.n,
        report["held_runs"]["record_median_ms"], report["ratio_held_idle"]))
    print("per sleeping run: %.0f KiB of host memory, descriptors %s; admitted in %.1f s, all asleep (host quiet) "
          "after %.1f s, drained in %.1f s" % (report["per_sleeper"]["mem_kib"], report["per_sleeper"]["fds"],
                                              report["fill_s"], report["settled_s"], report["drain_s"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
