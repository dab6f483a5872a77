#!/usr/bin/python3
"""Warm sandboxes (policies/README.md, "warm_pool"): a Letta tool call through
the daemon from client to result, warm and cold, beside bare Python and
bubblewrap running Letta's own script for the same call, in the same
interleaved rounds (bench/interleave.py: a fresh random order every round,
after warm-ups).

Variants:
  bare           /var/lib/toolsandbox/venv/bin/python3 - < Letta's generated
                 script for add(2, 3) (tests/python/letta_reference.py): what
                 letta-server runs in its local sandbox
  bwrap          the same, under bwrap --unshare-all (a read-only /, its own
                 /dev and /proc)
  unshare        the same, under unshare(1) with the seven namespaces a
                 sandbox here gets (user, pid, mount, net, ipc, uts,
                 cgroup) and nothing else: no root built, no cgroup leaf,
                 no seccomp filter, no init. The kernel's cost of fresh
                 namespaces alone, a floor no sandbox with them goes below
  run_tool       the tool through the daemon, policy "cold" (no pool)
  run_tool-warm  the same, policy "warm" (a pool of 4 per mode)
  execute        Letta's script through the daemon (script mode), "cold"
  execute-warm   the same, "warm"
  execute-warm-next  execute-warm right after an untimed warm run_tool:
                 a run that meets the pool's refill of the one before

Both policies are the shipped default.json, with its own warm pool turned
off for "cold" and resized for "warm" (a warm_pool {"max": 4, "min": 4}). Before every run of every variant the benchmark waits
until the warm pools are full again (status warm_pool), so a warm variant
measures a hit and no variant, bare included, runs beside a refill (the
daemon makes one once it has been quiet for a moment, docs/ARCHITECTURE.md
"Warm pools"); the wait is not timed. A burst larger than the pool follows: --burst runs at
once against a pool of 4, counting warm and cold runs and any error; and
with --throughput-runs R, runs per second at each --concurrency (R runs
each): bare, bwrap, unshare, and both modes under each policy (under "warm" a run
takes a warm sandbox when one is ready, else runs cold), each against
bare. Throughput is measured in --throughput-rounds rounds, each running
every variant once in a fresh random order; the table
gives each variant's median runs/s, its median ratio to the bare run of
the same round, and the lowest and highest of those ratios (on a busy
2-CPU host one phase alone moves by several percent).

Reports median, p10 and p90 of each, each against bare, the median CPU time
of a run (bare: RUSAGE_CHILDREN; the daemon's: the run record's cpu_ms, the
sandbox's cgroup from the hand-over on; unshare's includes its own, as it
waits for its child; none for bwrap, whose process is reaped inside its
own pid namespace), and the load average before and after. --json FILE keeps it all.

Standard library only, as root:
  /usr/bin/python3 bench/warm_bench.py [--n 100] [--build build] [--burst 16] [--throughput-runs 96]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
from toolsandbox_client import Client  # noqa: E402
from letta_reference import generate_script  # noqa: E402

import interleave  # noqa: E402  (bench/, beside this file)
from daemon_bench import start_daemon, throughput  # noqa: E402

VENV_PY = "/var/lib/toolsandbox/venv/bin/python3"
TOOL = "def add(a: int, b: int) -> int:\n    return a + b\n"
SCHEMA = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                          "b": {"type": "integer"}}}}
ARGS = {"a": 2, "b": 3}
LETTA_SCRIPT = generate_script("add", TOOL, ARGS, SCHEMA)
BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
           "--mount", "--net", "--ipc", "--uts", "--cgroup"]
CPU_MS: dict[str, list[float]] = {}
ORG = "bench"


def children_cpu_ms() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * 1e3


def process(name: str, prefix: list[str]) -> float:
    c0 = children_cpu_ms()
    t0 = time.perf_counter_ns()
    r = subprocess.run([*prefix, VENV_PY, "-"], input=LETTA_SCRIPT.encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL)
    wall = (time.perf_counter_ns() - t0) / 1e6
    if r.returncode != 0 or b"5" not in r.stdout:
        raise RuntimeError("%s: the run failed (status %d)" % (name, r.returncode))
    CPU_MS.setdefault(name, []).append(children_cpu_ms() - c0)
    return wall


def daemon_run(client: Client, name: str, mode: str, policy: str, warm: bool) -> float:
    t0 = time.perf_counter_ns()
    if mode == "run_tool":
        r = client.run_tool(TOOL, tool_name="add", args=ARGS, json_schema=SCHEMA, organization_id=ORG, policy=policy)
    else:
        r = client.execute(LETTA_SCRIPT, tool_name="add", organization_id=ORG, policy=policy)
    wall = (time.perf_counter_ns() - t0) / 1e6
    if r.status != "success" or str(r.func_return) != "5":  # (Letta's script returns str(result))
        raise RuntimeError("%s: %r %r" % (name, r.func_return, r.stderr))
    if r.record.get("warm") != warm:
        raise RuntimeError("%s: the run was %s" % (name, "warm" if r.record.get("warm") else "cold"))
    CPU_MS.setdefault(name, []).append(float(r.record["cpu_ms"]))
    return wall


def succeeded(r):
    if r.status != "success" or str(r.func_return) != "5":
        raise RuntimeError("a throughput run failed: %r %r" % (r.func_return, r.stderr))
    return r


def write_policies(tmp: Path) -> Path:
    pol = tmp / "policies"
    pol.mkdir()
    base = str(REPO / "policies" / "default.json")
    # The shipped default has a pool of its own: "cold" turns it off.
    (pol / "cold.json").write_text(json.dumps({"version": 1, "include": base, "warm_pool": {"max": 0, "min": 0}}))
    (pol / "warm.json").write_text(json.dumps({"version": 1, "include": base,
                                               "warm_pool": {"max": 4, "min": 4, "idle": "600s"}}))
    (pol / "organizations.json").write_text(json.dumps({
        "version": 1, "default": {"privileged": False, "policy": "cold", "allowed_policies": ["cold", "warm"]}}))
    return pol


def wait_full(client: Client, timeout: float = 60.0) -> None:
    """Until both pools of "warm" have their target ready and none starting."""
    deadline = time.monotonic() + timeout
    while True:
        pools = [p for p in client.status()["warm_pool"]["pools"] if p["policy"] == "warm"]
        if len(pools) == 2 and all(p["warm"] >= p["target"] and p["starting"] == 0 for p in pools):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pools did not fill: %r" % pools)
        time.sleep(0.01)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--burst", type=int, default=16)
    ap.add_argument("--throughput-runs", type=int, default=0, help="runs per throughput measurement (0: none)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--throughput-rounds", type=int, default=5, help="interleaved rounds of throughput phases")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bwrap is not installed (scripts/lib.sh installs bubblewrap)")
    tmp = Path(tempfile.mkdtemp(prefix="tsb-bench-warm-", dir="/run" if os.access("/run", os.W_OK) else None))
    pol = write_policies(tmp)
    proc, sock = start_daemon(args.build, tmp, 16, "-warm",
                              extra={"policies_dir": str(pol), "organizations": str(pol / "organizations.json")})
    client = Client(sock)
    report = {"n": args.n, "load_before": os.getloadavg(), "machine": os.uname().release}
    try:
        wait_full(client)
        timed = {
            "bare": lambda: process("bare", []),
            "bwrap": lambda: process("bwrap", BWRAP),
            "unshare": lambda: process("unshare", UNSHARE),
            "run_tool": lambda: daemon_run(client, "run_tool", "run_tool", "cold", False),
            "run_tool-warm": lambda: daemon_run(client, "run_tool-warm", "run_tool", "warm", True),
            "execute": lambda: daemon_run(client, "execute", "execute", "cold", False),
            "execute-warm": lambda: daemon_run(client, "execute-warm", "execute", "warm", True),
            "execute-warm-next": lambda: (daemon_run(client, "-", "run_tool", "warm", True),
                                          daemon_run(client, "execute-warm-next", "execute", "warm", True))[1],
        }
        variants = {name: (lambda run=run: (wait_full(client), run())[1]) for name, run in timed.items()}
        lat = interleave.rounds(variants, args.n, before_rounds=CPU_MS.clear)
        cpu = {name: statistics.median(v) for name, v in CPU_MS.items() if v and name != "-"}
        report["latency_ms"], report["cpu_ms_median"] = lat, cpu
        base = lat["bare"]["median"]
        print("| variant | median ms | p10 ms | p90 ms | / bare | CPU ms, median | CPU / bare |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name in variants:
            m = lat[name]  # (execute-warm-next: CPU of its timed run only)
            # bwrap's sandboxed process is reaped inside its pid namespace:
            # RUSAGE_CHILDREN does not see its CPU time.
            cpu_cols = "- | -" if name == "bwrap" else "%.2f | x%.2f" % (cpu[name], cpu[name] / cpu["bare"])
            print("| %s | %.2f | %.2f | %.2f | x%.3f | %s |" % (
                name, m["median"], m["p10"], m["p90"], m["median"] / base, cpu_cols))

        # Throughput: a fixed number of runs at a given concurrency, the
        # daemon's modes (cold policy, and the warm one: its pool of 4 is
        # what it is) against as many bare runs at the same concurrency.
        if args.throughput_runs:
            thr = {}
            print("\n| concurrency | variant | runs/s, median | / bare, median | / bare, lowest-highest |")
            print("|---:|---|---:|---:|---:|")
            for conc in args.concurrency:
                calls = {
                    "bare": lambda: process("bare", []),
                    "bwrap": lambda: process("bwrap", BWRAP),
                    "unshare": lambda: process("unshare", UNSHARE),
                    "run_tool": lambda: daemon_run(client, "t", "run_tool", "cold", False),
                    "run_tool-warm-policy": lambda: succeeded(client.run_tool(
                        TOOL, tool_name="add", args=ARGS, json_schema=SCHEMA, organization_id=ORG, policy="warm")),
                    "execute": lambda: daemon_run(client, "t", "execute", "cold", False),
                    "execute-warm-policy": lambda: succeeded(client.execute(
                        LETTA_SCRIPT, tool_name="add", organization_id=ORG, policy="warm")),
                }
                rounds = []
                for _ in range(args.throughput_rounds):
                    got = {}
                    for name in random.sample(list(calls), len(calls)):
                        wait_full(client)
                        got[name] = throughput(conc, args.throughput_runs, calls[name])
                    rounds.append(got)
                for name in calls:
                    ratios = [r[name] / r["bare"] for r in rounds]
                    print("| %d | %s | %.1f | %.0f %% | %.0f-%.0f %% |" % (
                        conc, name, statistics.median(r[name] for r in rounds), 100 * statistics.median(ratios),
                        100 * min(ratios), 100 * max(ratios)))
                thr[str(conc)] = rounds
            report["throughput_runs_per_s"] = thr

        # A burst larger than the pool: every run answers; those that found
        # no warm sandbox ran cold.
        wait_full(client)
        outcome = {"warm": 0, "cold": 0, "failed": 0}

        def one(i: int) -> None:
            try:
                r = client.run_tool(TOOL, tool_name="add", args={"a": i, "b": 1}, organization_id=ORG, policy="warm")
                ok = r.status == "success" and r.func_return == i + 1
                outcome["failed" if not ok else "warm" if r.record.get("warm") else "cold"] += 1
            except Exception:  # noqa: BLE001  (counted: the point is that none fails)
                outcome["failed"] += 1

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=args.burst) as ex:
            list(ex.map(one, range(args.burst)))
        outcome["seconds"] = time.perf_counter() - t0
        report["burst"] = dict(outcome, runs=args.burst, pool=4)
        print("\nburst of %d run_tool at once, pool of 4: %d warm, %d cold, %d failed, %.2f s" % (
            args.burst, outcome["warm"], outcome["cold"], outcome["failed"], outcome["seconds"]))
        report["load_after"] = os.getloadavg()
        print("load average before %s, after %s" % (report["load_before"], report["load_after"]))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        return 1 if outcome["failed"] else 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
