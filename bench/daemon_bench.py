#!/usr/bin/python3
"""Daemon round trip and throughput, beside bare Python running the same work.

Starts its own toolsandboxd on a temporary socket (or uses --socket), then:

  1. Latency, interleaved rounds (a fresh random order every round, 5 warm-ups):
       bare-script   /venv/bin/python3 - < SCRIPT      (the work, no sandbox)
       execute       the same SCRIPT through the daemon (script mode)
       bare-tool     /venv/bin/python3 - < equivalent tool-call script
       run_tool      the same tool through the daemon (tool mode, runner)
     reporting median/p95 and the overhead over the bare twin, and the
     median CPU time of a run (bare: RUSAGE_CHILDREN; through the daemon:
     the run record's cpu_ms, the sandbox's whole cgroup) against the twin's.
  2. Throughput at concurrency 1, 8 and 32, in both modes: a fixed number
     of runs through the daemon vs the same number of bare runs of the
     twin with the same concurrency; runs per second and the ratio.

--compare OLD_BUILD runs a second daemon built from another revision (the
previous design) in the same interleaved rounds and throughput runs, and
prints the two side by side. --compare-config JSON merges JSON into the
second daemon's configuration; alone, the second daemon is of this build,
so one setting is measured against its default (in the tables, "old" is
then the daemon with JSON).

Standard library only: /usr/bin/python3 bench/daemon_bench.py [--n 200] [--compare OLD_BUILD]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))
from toolsandbox_client import Client  # noqa: E402

import interleave  # noqa: E402  (bench/, beside this file)

VENV_PY = "/var/lib/toolsandbox/venv/bin/python3"

# A trivial Letta-style script: compute, then emit Letta's binary frame.
SCRIPT = r'''
import sys, json, struct, hashlib
def add(a, b):
    return a + b
p = json.dumps({"results": add(2, 3), "agent_state": None}).encode("utf-8")
sys.stdout.buffer.write(bytes.fromhex("92c8e49843d35fb3919da69eb3e5c5c6") + struct.pack(">I", len(p)) + hashlib.md5(p).hexdigest().encode() + p)
sys.stdout.buffer.flush()
'''
TOOL = "def add(a, b):\n    return a + b\n"
BARE_TOOL = TOOL + "import json\nprint(json.dumps(add(**json.loads('{\"a\": 2, \"b\": 3}'))))\n"


# CPU time of each latency run, ms, by variant: a bare run's from
# RUSAGE_CHILDREN (the rounds run one process at a time), a daemon run's
# from its record (the sandbox's cgroup: the tool, the runner and init).
CPU_MS: dict[str, list[float]] = {}
# Wall time of each daemon run, ms, by variant and by the state of the
# sandbox that served it ("warm": taken from the policy's pool; "cold":
# spawned for the run). Back-to-back calls drain the pool faster than it
# refills, so the runs are a mix of the two, and a median over the mix
# jumps between them with the share of warm runs: the split is the
# comparable figure.
BY_STATE: dict[str, dict[str, list[float]]] = {}


def clear_samples() -> None:
    CPU_MS.clear()
    BY_STATE.clear()


def children_cpu_ms() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * 1e3


def bare(script: str, variant: str = "") -> float:
    c0 = children_cpu_ms()
    t0 = time.perf_counter_ns()
    r = subprocess.run([VENV_PY, "-"], input=script.encode(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = (time.perf_counter_ns() - t0) / 1e6
    if r.returncode != 0:
        raise RuntimeError("bare run failed")
    if variant:
        CPU_MS.setdefault(variant, []).append(children_cpu_ms() - c0)
    return wall


def _die_with_us() -> None:
    # A benchmark stopped by a signal leaves no daemon behind (its finally
    # does not run): SIGTERM when this process ends (PR_SET_PDEATHSIG).
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:
        os._exit(127)


def _merge(into: dict, more: dict) -> None:
    """`more` merged into `into`, objects key by key (so {"engine": {...}}
    adds to the engine section rather than replacing it)."""
    for k, v in more.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def start_daemon(build: Path, tmp: Path, concurrency: int, tag: str = "",
                 uid_base: int = 1 << 30, extra: dict | None = None) -> tuple[subprocess.Popen, str]:
    """A daemon of `build` in `tmp`, answering on its socket; `extra`: more
    of its configuration (policies_dir, organizations). Also used by the
    other daemon benchmarks."""
    sock = str(tmp / "d.sock")
    os.chmod(tmp, 0o711)
    cfg = {
        "version": 1,
        "socket": {"path": sock},
        "max_concurrent_runs": concurrency,
        "max_queued_runs": 1024,
        # Two daemons side by side (--compare) get their own cgroups and
        # their own uid ranges.
        "engine": {"state_dir": str(tmp / "state"), "cgroup_parent": "/toolsandbox-bench-daemon" + tag,
                   "uid_base": uid_base},
    }
    _merge(cfg, extra or {})
    (tmp / "config.json").write_text(json.dumps(cfg))
    log = open(tmp / "log", "wb")
    proc = subprocess.Popen([str(build / "bin" / "toolsandboxd"), "--config", str(tmp / "config.json")],
                            stdout=log, stderr=log, preexec_fn=_die_with_us)
    for _ in range(1000):
        if os.path.exists(sock):
            try:
                Client(sock).status()
                return proc, sock
            except Exception:
                pass
        time.sleep(0.01)
    raise RuntimeError("daemon did not start; see " + str(tmp / "log"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--throughput-runs", type=int, default=96)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", type=Path, metavar="OLD_BUILD",
                    help="also run a second daemon from OLD_BUILD (another design), interleaved in the same rounds")
    ap.add_argument("--compare-config", type=json.loads, metavar="JSON",
                    help="the second daemon's configuration gets this JSON object merged in; without --compare "
                         "it is a daemon of this build (an A/B of one setting, e.g. '{\"engine\": {\"landlock\": \"off\"}}')")
    args = ap.parse_args()
    rundir = "/run" if os.access("/run", os.W_OK) else None
    tmp = Path(tempfile.mkdtemp(prefix="tsb-bench-", dir=rundir))
    proc, sock = start_daemon(args.build, tmp, 32)
    client = Client(sock)
    old_proc = old_tmp = old_client = None
    if args.compare_config is not None and not args.compare:
        args.compare = args.build
    if args.compare:
        old_tmp = Path(tempfile.mkdtemp(prefix="tsb-bench-old-", dir=rundir))
        old_proc, old_sock = start_daemon(args.compare, old_tmp, 32, "-old", 1 << 31, args.compare_config)
        old_client = Client(old_sock)
    report = {"n": args.n, "load_before": os.getloadavg(), "machine": os.uname().release}
    try:
        def execute(c, variant=""):
            return lambda: timed(lambda: c.execute(SCRIPT, tool_name="add", organization_id="bench"), variant)

        def run_tool(c, variant=""):
            return lambda: timed(lambda: c.run_tool(TOOL, tool_name="add", args={"a": 2, "b": 3},
                                                    organization_id="bench"), variant)
        variants = {
            "bare-script": lambda: bare(SCRIPT, "bare-script"),
            "execute": execute(client, "execute"),
            "bare-tool": lambda: bare(BARE_TOOL, "bare-tool"),
            "run_tool": run_tool(client, "run_tool"),
        }
        if old_client:
            variants["execute@old"] = execute(old_client, "execute@old")
            variants["run_tool@old"] = run_tool(old_client, "run_tool@old")
        lat = interleave.rounds(variants, args.n, before_rounds=clear_samples)
        cpu = {name: statistics.median(v) for name, v in CPU_MS.items() if v}
        report["latency_ms"] = lat
        report["cpu_ms_median"] = cpu
        print("| variant | median ms | p95 ms | overhead vs bare twin | CPU ms, median | CPU vs bare twin |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, twin in (("bare-script", None), ("execute", "bare-script"), ("bare-tool", None), ("run_tool", "bare-tool")):
            m = lat[name]["median"]
            over = "" if twin is None else "%+.2f ms (x%.2f)" % (m - lat[twin]["median"], m / lat[twin]["median"])
            cpu_ratio = "" if twin is None else "x%.2f" % (cpu[name] / cpu[twin])
            print("| %s | %.2f | %.2f | %s | %.2f | %s |" % (name, m, lat[name]["p95"], over, cpu[name], cpu_ratio))
        if old_client:
            print("\n| variant | this build, median ms | %s, median ms | this / old | CPU ms, this / old |" % args.compare)
            print("|---|---:|---:|---:|---:|")
            for name in ("execute", "run_tool"):
                m, o = lat[name]["median"], lat[name + "@old"]["median"]
                print("| %s | %.2f | %.2f | %+.2f ms (x%.3f) | %.2f / %.2f |" % (name, m, o, m - o, m / o, cpu[name],
                                                                               cpu[name + "@old"]))

        def state_median(variant: str, state: str) -> tuple[int, float | None]:
            xs = BY_STATE.get(variant, {}).get(state, [])
            return len(xs), (statistics.median(xs) if xs else None)

        def ms(v: float | None) -> str:
            return "-" if v is None else "%.2f" % v

        by_state = {}
        print("\n| variant | warm runs | warm median ms | cold runs | cold median ms |")
        print("|---|---:|---:|---:|---:|")
        for name in [v for v in ("execute", "run_tool", "execute@old", "run_tool@old") if v in BY_STATE]:
            (nw, mw), (nc, mc) = state_median(name, "warm"), state_median(name, "cold")
            by_state[name] = {"warm": {"n": nw, "median": mw}, "cold": {"n": nc, "median": mc}}
            print("| %s | %d | %s | %d | %s |" % (name, nw, ms(mw), nc, ms(mc)))
        report["latency_by_state_ms"] = by_state
        if old_client:
            print("\n| variant | state | this build, median ms | old, median ms | this / old |")
            print("|---|---|---:|---:|---:|")
            for name in ("execute", "run_tool"):
                for state in ("warm", "cold"):
                    m, o = state_median(name, state)[1], state_median(name + "@old", state)[1]
                    ratio = "x%.3f" % (m / o) if m is not None and o is not None else "-"
                    print("| %s | %s | %s | %s | %s |" % (name, state, ms(m), ms(o), ratio))

        thr = {}
        print("\n| mode | concurrency | daemon runs/s | bare runs/s | daemon/bare |")
        print("|---|---:|---:|---:|---:|")
        calls = {
            "execute": (lambda c: c.execute(SCRIPT, tool_name="add", organization_id="bench"), SCRIPT),
            "run_tool": (lambda c: c.run_tool(TOOL, tool_name="add", args={"a": 2, "b": 3}, organization_id="bench"),
                         BARE_TOOL),
        }
        for mode, (call, twin) in calls.items():
            for c in (1, 8, 32):
                d = throughput(c, args.throughput_runs, lambda: call(client))
                b = throughput(c, args.throughput_runs, lambda: bare(twin))
                thr["%s@%d" % (mode, c)] = {"daemon": d, "bare": b, "ratio": d / b}
                line = "| %s | %d | %.1f | %.1f | %.0f %% |" % (mode, c, d, b, 100 * d / b)
                if old_client:
                    o = throughput(c, args.throughput_runs, lambda: call(old_client))
                    thr["%s@%d" % (mode, c)]["old"] = o
                    line += " old design: %.1f runs/s (this / old %.0f %%) |" % (o, 100 * d / o)
                print(line)
        report["throughput_runs_per_s"] = thr
        report["load_after"] = os.getloadavg()
        print("\nload average before %s, after %s" % (report["load_before"], report["load_after"]))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    finally:
        for p, t in ((proc, tmp), (old_proc, old_tmp)):
            if p:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
                shutil.rmtree(t, ignore_errors=True)
    return 0


def timed(fn, variant: str = "") -> float:
    t0 = time.perf_counter_ns()
    r = fn()
    wall = (time.perf_counter_ns() - t0) / 1e6
    if r.status != "success":
        raise RuntimeError("daemon run failed: %r" % (r.func_return,))
    if variant:
        CPU_MS.setdefault(variant, []).append(float(r.record["cpu_ms"]))
        state = "warm" if r.record.get("warm") else "cold"
        BY_STATE.setdefault(variant, {}).setdefault(state, []).append(wall)
    return wall


def throughput(concurrency: int, runs: int, fn) -> float:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as ex:
        list(ex.map(lambda _: fn(), range(runs)))
    return runs / (time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
