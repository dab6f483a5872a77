#!/usr/bin/python3
"""A tool call after quiet: the daemon as shipped (the shipped policies,
copied as they are, and their warm pool, nothing kept awake) against bare Python and
bubblewrap, after 0.02, 0.1, 1 and 10 s of an idle host between calls.

Letta's traffic is sparse: a tool call between two model calls, seconds
apart. Before every timed call this benchmark sleeps for the gap and does
nothing else (no status polls, no wait for the pools: the daemon refills
them on its own, as it does for users); at each gap the variants run in
interleaved rounds (bench/interleave.py: a fresh random order every round).

Variants:
  bare         the venv's python3 -c on a minimal script (the tool and one
               call of it): the reference of every ratio
  bare-letta   the venv's python3 on Letta's generated script for the same
               call (what letta-server runs; tests/python/letta_reference.py)
  bwrap        the minimal script under bwrap --unshare-all (a read-only /,
               its own /dev and /proc)
  run_tool     the tool through the daemon, policy "default" (warm when a
               warm sandbox is ready, else cold)
  execute      Letta's script through the daemon, "default"
  heavy-bare   a tool that imports a heavy module (--heavy, by default
               pkg_resources, which every venv has) and returns, bare
  heavy        the same tool through the daemon, policy "heavy": the shipped
               default with the module added to warm_pool.preload
  run_tool-cold, execute-cold
               run_tool and execute under policy "cold": the shipped default
               without a warm pool, so every call starts a sandbox

For the daemon's variants the table gives the median of every call, the
median of the warm ones and of the cold ones, how many were warm, and the
daemon's own record.wall_ms of the warm ones (from the hand-over to the
run's end); ratios are against bare of the same gap, but heavy's against
heavy-bare and the cold variants' against bare-letta: a cold call is
compared with the process letta-server would start for the same call. CPU: for the bare
variants the child's user+system time (getrusage), for the daemon's the
run's cgroup (record.cpu_ms: the sandbox's processes, not the daemon's;
of a warm run, from its hand-over). "CPU in all" adds, for a warm run,
what its sandbox used before the hand-over (record.warm_start_cpu_ms: the
interpreter's start, the runner, the preloads), to set against a cold
run's. The load average before and after each gap is printed.

Standard library only, as root:
  /usr/bin/python3 bench/gap_bench.py [--build build] [--n 20] [--n-long 8]
      [--gaps 0.02,0.1,1,10] [--json FILE]
(--n rounds at gaps under 1 s, --n-long at 1 s and more.)
"""

from __future__ import annotations

import argparse
import json
import os
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

import interleave  # noqa: E402
from daemon_bench import start_daemon  # noqa: E402
from warm_bench import ARGS, BWRAP, SCHEMA, TOOL, VENV_PY  # noqa: E402

MINIMAL = TOOL + "print(add(2, 3))\n"
LETTA_SCRIPT = generate_script("add", TOOL, ARGS, SCHEMA)
ORG = "bench"


def heavy_tool(module: str) -> str:
    return "def heavy() -> str:\n    import %s\n    return 'ok'\n" % module


class Bench:
    def __init__(self, client: Client, heavy: str):
        self.client = client
        self.heavy = heavy
        self.samples: dict[str, list[dict]] = {}

    def keep(self, name: str, wall: float, record: dict | None = None) -> float:
        s = {"wall_ms": wall}
        if record is not None:
            s.update(warm=bool(record.get("warm")), record_wall_ms=float(record.get("wall_ms", 0)),
                     cpu_ms=float(record.get("cpu_ms", 0)))
            s["all_cpu_ms"] = s["cpu_ms"] + float(record.get("warm_start_cpu_ms", 0))
        self.samples.setdefault(name, []).append(s)
        return wall

    def process(self, name: str, argv: list[str], stdin: bytes = b"", expect: bytes = b"5") -> float:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter_ns()
        r = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        wall = (time.perf_counter_ns() - t0) / 1e6
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0 or expect not in r.stdout:
            raise RuntimeError("%s: the run failed (status %d)" % (name, r.returncode))
        self.keep(name, wall)
        self.samples[name][-1]["cpu_ms"] = ((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) * 1e3
        return wall

    def daemon(self, name: str, mode: str, policy: str = "default") -> float:
        t0 = time.perf_counter_ns()
        if mode == "heavy":
            r = self.client.run_tool(heavy_tool(self.heavy), tool_name="heavy", args={}, organization_id=ORG,
                                     policy=policy, json_schema={"name": "heavy", "parameters": {"type": "object",
                                                                                                  "properties": {}}})
            ok = r.func_return == "ok"
        elif mode == "run_tool":
            r = self.client.run_tool(TOOL, tool_name="add", args=ARGS, json_schema=SCHEMA, organization_id=ORG,
                                     policy=policy)
            ok = str(r.func_return) == "5"
        else:
            r = self.client.execute(LETTA_SCRIPT, tool_name="add", organization_id=ORG, policy=policy)
            ok = str(r.func_return) == "5"
        wall = (time.perf_counter_ns() - t0) / 1e6
        if r.status != "success" or not ok:
            raise RuntimeError("%s: %r %r" % (name, r.func_return, r.stderr))
        return self.keep(name, wall, r.record)

    def variants(self) -> dict:
        heavy_script = heavy_tool(self.heavy) + "print(heavy())\n"
        return {
            "bare": lambda: self.process("bare", [VENV_PY, "-c", MINIMAL]),
            "bare-letta": lambda: self.process("bare-letta", [VENV_PY, "-"], LETTA_SCRIPT.encode()),
            "bwrap": lambda: self.process("bwrap", [*BWRAP, VENV_PY, "-c", MINIMAL]),
            "run_tool": lambda: self.daemon("run_tool", "run_tool"),
            "execute": lambda: self.daemon("execute", "execute"),
            "heavy-bare": lambda: self.process("heavy-bare", [VENV_PY, "-c", heavy_script], expect=b"ok"),
            "heavy": lambda: self.daemon("heavy", "heavy", policy="heavy"),
            "run_tool-cold": lambda: self.daemon("run_tool-cold", "run_tool", policy="cold"),
            "execute-cold": lambda: self.daemon("execute-cold", "execute", policy="cold"),
        }


def write_policies(tmp: Path, heavy: str) -> Path:
    """The shipped policies, as they are, and "heavy" beside them."""
    pol = tmp / "policies"
    shutil.copytree(REPO / "policies", pol)
    from_default = ["base64", "hashlib", "json", "pickle", "struct", "sys", "typing"]
    (pol / "heavy.json").write_text(json.dumps({"version": 1, "include": "default.json",
                                                "warm_pool": {"max": 4, "min": 1, "idle": "300s",
                                                              "preload": from_default + [heavy]}}))
    (pol / "cold.json").write_text(json.dumps({"version": 1, "include": "default.json",
                                               "warm_pool": {"max": 0, "min": 0}}))
    (pol / "organizations.json").write_text(json.dumps({
        "version": 1, "default": {"privileged": False, "policy": "default", "allowed_policies": ["default", "heavy", "cold"]}}))
    return pol


def median(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def summarize(gap: float, samples: dict[str, list[dict]]) -> dict:
    out: dict[str, dict] = {}
    bare = median([s["wall_ms"] for s in samples["bare"]])
    heavy_bare = median([s["wall_ms"] for s in samples["heavy-bare"]])
    bare_letta = median([s["wall_ms"] for s in samples["bare-letta"]])
    cpu_ref = {k: median([s["cpu_ms"] for s in samples[k]]) for k in ("bare", "bare-letta", "heavy-bare")}
    for name, ss in samples.items():
        ref_name = "heavy-bare" if name == "heavy" else "bare-letta" if name.endswith("-cold") else "bare"
        ref = {"heavy-bare": heavy_bare, "bare-letta": bare_letta}.get(ref_name, bare)
        walls = [s["wall_ms"] for s in ss]
        cpu = median([s["cpu_ms"] for s in ss if "cpu_ms" in s])
        e = {"n": len(ss), "median_ms": median(walls), "p90_ms": interleave.pct(walls, 0.9), "ratio": median(walls) / ref,
             "ref": ref_name, "cpu_ms": cpu, "cpu_ratio": cpu / cpu_ref[ref_name]}
        if ss and "warm" in ss[0]:
            warm = [s for s in ss if s["warm"]]
            cold = [s for s in ss if not s["warm"]]
            e.update(warm=len(warm), warm_ms=median([s["wall_ms"] for s in warm]),
                     warm_ratio=median([s["wall_ms"] for s in warm]) / ref,
                     warm_record_ms=median([s["record_wall_ms"] for s in warm]),
                     warm_cpu_ms=median([s["cpu_ms"] for s in warm]),
                     warm_all_cpu_ms=median([s["all_cpu_ms"] for s in warm]),
                     cold_all_cpu_ms=median([s["all_cpu_ms"] for s in cold]),
                     cold_ms=median([s["wall_ms"] for s in cold]), cold_ratio=median([s["wall_ms"] for s in cold]) / ref)
        out[name] = e
    return out


def print_gap(gap: float, res: dict, load: tuple) -> None:
    print("\n## after %g s of quiet (load %.2f before, %.2f after)\n" % (gap, load[0], load[1]))
    print("| variant | n | median ms | / ref | ref | CPU ms | CPU / ref | warm | warm ms | warm / ref | record ms (warm) "
          "| CPU in all (warm) | cold ms | cold / ref | CPU (cold) |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, e in res.items():
        head = "| %s | %d | %.2f | %.2f | %s | %.2f | %.2f |" % (name, e["n"], e["median_ms"], e["ratio"], e["ref"],
                                                                 e["cpu_ms"], e["cpu_ratio"])
        if "warm" in e:
            print(head + " %d | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                e["warm"], e["warm_ms"], e["warm_ratio"], e["warm_record_ms"], e["warm_all_cpu_ms"], e["cold_ms"],
                e["cold_ratio"], e["cold_all_cpu_ms"]))
        else:
            print(head + " | | | | | | | |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, default=REPO / "build")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--n-long", type=int, default=8)
    ap.add_argument("--gaps", default="0.02,0.1,1,10")
    ap.add_argument("--heavy", default="pkg_resources")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("gap_bench.py runs the daemon: run it as root")
    if shutil.which("bwrap") is None:
        sys.exit("bwrap is not installed (scripts/lib.sh installs bubblewrap)")
    gaps = [float(g) for g in args.gaps.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="tsb-gap-", dir="/run" if os.access("/run", os.W_OK) else None))
    pol = write_policies(tmp, args.heavy)
    proc, sock = start_daemon(args.build, tmp, 16, tag="-gap",
                              extra={"policies_dir": str(pol), "organizations": str(pol / "organizations.json")})
    results = {}
    try:
        print("# gap_bench: the daemon as shipped, after quiet (%s, %d CPUs)" % (time.strftime("%Y-%m-%d %H:%M"),
                                                                                 os.cpu_count() or 0))
        for gap in gaps:
            bench = Bench(Client(sock), args.heavy)
            variants = bench.variants()
            for name, fn in list(variants.items()):
                variants[name] = (lambda f: lambda: (time.sleep(gap), f())[1])(fn)
            load0 = os.getloadavg()[0]
            interleave.rounds(variants, args.n if gap < 1 else args.n_long, warmups=2)
            # The warm-ups' samples are not the rounds': drop the first 2 of each.
            samples = {k: v[2:] for k, v in bench.samples.items()}
            results[str(gap)] = res = summarize(gap, samples)
            print_gap(gap, res, (load0, os.getloadavg()[0]))
            sys.stdout.flush()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
