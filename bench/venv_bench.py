#!/usr/bin/python3
"""What a per-tool venv costs a run: a run_tool whose pip requirements name a
venv already in the cache, against the same run_tool with no requirements
(the policy's venv), and once, the first run with those requirements (the
build).

    sudo /usr/bin/python3 bench/venv_bench.py [--n 30] [--build DIR] [--json FILE]

Starts its own daemon (the client tests' fixture, tests/python/daemon_fixture.py)
over a temporary tree, as tests/python/test_venvs.py does: a directory of
wheels made by tests/python/wheels.py (tsbtool 1.5, which needs tsbdep>=2,
and tsbdep 2.0; small pure-Python packages), a policy "default" that includes
policies/default.json and installs from that directory only (no network at
all), and a venv cache owned by the front end's user (toolsandboxd, 0755).
Every run is the same Letta tool, called through the daemon from the client
to the result:

    def add(a: int, b: int) -> dict:
        return {"sum": a + b, "tsbtool": <is tsbtool importable>}

  build     the first run with pip_requirements ["tsbtool"]: the venv is
            built in a build sandbox, cached, then the tool runs in it.
            Timed once, before the rounds; build_ms comes from the run record.
  then in interleaved rounds (a fresh random order every round, after warm-ups):
    none    run_tool with no requirements: the policy's venv at /venv
    cached  run_tool with pip_requirements ["tsbtool"]: the cached venv at
            /venv (every run checks the record: the same key, not built)

It prints median and p95 per variant with the daemon's own wall_ms (the
record's: the sandbox, from its start to its end), the difference and ratio
cached / none, the build run apart, the load average before and after, and
the daemon's venv counters.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))

import interleave  # noqa: E402  (bench/, beside this file)

ORG = "org-venv-bench"
REQS = ["tsbtool"]
WARMUPS = 5
TOOL = (
    "import importlib.util\n\n"
    "def add(a: int, b: int) -> dict:\n"
    '    """Add two numbers; say whether the package tsbtool is importable."""\n'
    "    return {'sum': a + b, 'tsbtool': importlib.util.find_spec('tsbtool') is not None}\n"
)


def make_tree(tmp: str) -> tuple[str, str, str]:
    """Wheels, policies and the venv cache under tmp; returns their paths."""
    from wheels import make_wheel

    user = pwd.getpwnam("toolsandboxd")  # the front end's user (scripts/lib.sh, make_users)
    wheels = os.path.join(tmp, "wheels")
    os.mkdir(wheels)
    make_wheel(wheels, "tsbdep", "2.0")
    make_wheel(wheels, "tsbtool", "1.5", requires=["tsbdep>=2"])
    for n in os.listdir(wheels):
        os.chmod(os.path.join(wheels, n), 0o644)
    cache = os.path.join(tmp, "venvs")
    os.mkdir(cache, 0o755)
    os.chown(cache, user.pw_uid, user.pw_gid)
    policies = os.path.join(tmp, "policies")
    os.mkdir(policies)
    with open(os.path.join(policies, "default.json"), "w") as f:
        json.dump({"version": 1, "include": str(REPO / "policies" / "default.json"),
                   "packages": {"allow": ["tsb*"], "wheels": wheels, "build": {"wall_timeout": "300s"}}}, f)
    with open(os.path.join(policies, "organizations.json"), "w") as f:
        json.dump({"version": 1, "default": {"privileged": False, "policy": "default",
                                             "allowed_policies": ["default"]}}, f)
    return wheels, policies, cache


def remove_empty_dirs(top: str | None) -> None:
    """The daemon's state directory under /run, which the fixture leaves
    when the engine made more in it than it knows (engines/, empty/):
    empty directories only, bottom up, never a mount point."""
    if not top or not os.path.isdir(top):
        return
    for path, _, _ in os.walk(top, topdown=False):
        try:
            if not os.path.ismount(path):
                os.rmdir(path)
        except OSError:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="interleaved rounds (default 30)")
    ap.add_argument("--build", type=Path, help="the build tree (default $TSB_BUILD, else build/)")
    ap.add_argument("--json", type=Path, help="also write the full report here")
    args = ap.parse_args()
    if args.build:
        os.environ["TSB_BUILD"] = str(args.build.resolve())
    import daemon_fixture as F  # reads TSB_BUILD when it starts the daemon

    if os.geteuid() != 0:
        print("venv_bench: needs root (the daemon's sandboxes)", file=sys.stderr)
        return 2
    try:
        pwd.getpwnam("toolsandboxd")
    except KeyError:
        print("venv_bench: no toolsandboxd user (the set-up of scripts/start.sh or scripts/test.sh creates it)", file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="tsb-venv-bench-")
    os.chmod(tmp, 0o755)
    daemon = None
    try:
        _, policies, cache = make_tree(tmp)
        daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"),
                          venvs={"cache_dir": cache},
                          engine={"cgroup_parent": os.environ.get("TSB_CGROUP_PARENT", "/toolsandbox-bench-venv")})
        daemon.start()
        client = daemon.client(timeout=300)
        report = {"n": args.n, "warmups": WARMUPS, "requirements": REQS, "load_before": os.getloadavg(),
                  "machine": os.uname().release}

        def call(reqs):
            t0 = time.perf_counter_ns()
            r = client.run_tool(TOOL, tool_name="add", args={"a": 2, "b": 3}, organization_id=ORG,
                                pip_requirements=reqs)
            ms = (time.perf_counter_ns() - t0) / 1e6
            want = {"sum": 5, "tsbtool": bool(reqs)}
            if r.status != "success" or r.func_return != want:
                raise RuntimeError("run_tool with requirements %s failed: %s %s %s"
                                   % (reqs, r.func_return, r.stderr, r.record))
            return ms, r.record

        # (c) The first run with the requirements: the build, then the run.
        first_ms, rec = call(REQS)
        venv = rec.get("venv") or {}
        if not venv.get("built"):
            raise RuntimeError("the first run with %s did not build its venv: %s" % (REQS, rec))
        key = venv["key"]
        report["build_run"] = {"ms": first_ms, "build_ms": venv.get("build_ms"), "wall_ms": rec.get("wall_ms"),
                               "key": key}

        # The daemon's own wall_ms per variant, warm-ups left out.
        walls: dict[str, list[float]] = {}

        def variant(name, reqs):
            walls[name] = []
            calls = [0]

            def run():
                ms, rec = call(reqs)
                if reqs:
                    v = rec.get("venv") or {}
                    if v.get("key") != key or v.get("built"):
                        raise RuntimeError("a run with %s did not use the cached venv %s: %s" % (reqs, key, rec))
                elif "venv" in rec:
                    raise RuntimeError("a run without requirements got a venv of its own: %s" % rec)
                calls[0] += 1
                if calls[0] > WARMUPS:
                    walls[name].append(rec["wall_ms"])
                return ms
            return run

        NONE = "run_tool, no requirements (policy venv)"
        HIT = "run_tool, cached venv (%s)" % ", ".join(REQS)
        variants = {NONE: variant(NONE, None), HIT: variant(HIT, REQS)}
        lat = interleave.rounds(variants, args.n, WARMUPS)
        report["load_after"] = os.getloadavg()
        for name in variants:
            lat[name]["wall_ms_median"] = statistics.median(walls[name])
        report["latency_ms"] = lat

        print("| variant | median ms | p95 ms | daemon wall_ms (median) | vs no requirements |")
        print("|---|---:|---:|---:|---:|")
        for name in variants:
            print("| %s | %.2f | %.2f | %.1f | %s |" % (
                name, lat[name]["median"], lat[name]["p95"], lat[name]["wall_ms_median"],
                "—" if name == NONE else "x%.3f" % (lat[name]["median"] / lat[NONE]["median"])))
        d = lat[HIT]["median"] - lat[NONE]["median"]
        ratio = lat[HIT]["median"] / lat[NONE]["median"]
        report["cached_minus_none_ms"] = d
        report["ratio_cached_over_none"] = ratio
        print()
        print("cached venv - no requirements: %+.2f ms (ratio x%.3f; p10-p90 of no requirements %.2f-%.2f ms)"
              % (d, ratio, lat[NONE]["p10"], lat[NONE]["p90"]))
        b = report["build_run"]
        print("first run with the requirements (the build, once): %.2f ms end to end, build_ms %.2f (record), "
              "the rest %.2f ms (x%.1f a cached run)" % (b["ms"], b["build_ms"], b["ms"] - b["build_ms"],
                                                        b["ms"] / lat[HIT]["median"]))
        print("\nload average before %s, after %s" % (report["load_before"], report["load_after"]))
        status = client.status().get("venvs")
        report["daemon_venvs_status"] = status
        print("daemon venv counters: %s" % json.dumps(status))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    finally:
        run_dir = daemon.run_dir if daemon is not None else None
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_dirs(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
