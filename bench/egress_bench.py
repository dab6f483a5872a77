#!/usr/bin/python3
"""The per-run cost of network "egress" against "none", and of one HTTP
request through the daemon's proxy against the same request made directly.

Runs only inside the outer guard with a network namespace of its own, as the
egress tests do (it builds the same test network: tests/egress):

    tests/guard/run-guarded --net --mem $((4<<30)) --pids 4096 --ro . --ro build -- \\
        /usr/bin/python3 bench/egress_bench.py [--n 100] [--json FILE]

The outer process brings up the test network (a "daemon" and a "world"
namespace joined by one veth pair, routed nowhere else), then runs this
script again inside the daemon's namespace with the test's /etc/hosts, where
it starts a daemon and measures, in interleaved rounds (a fresh random order every
round, after warm-ups), each variant running the same Python program:

  noop: print("ok")
    bare             /usr/bin/python3 -
    bwrap            bwrap --unshare-all (its own network namespace)
    execute@none     through the daemon, policy network "none"
    execute@egress   through the daemon, policy network "egress" (no request)
  fetch: urllib GET http://other.public.test/whoami (198.51.100.11, the
  world namespace) and read the answer
    bare             directly (the daemon's namespace, no proxy)
    bwrap            --unshare-all --share-net, directly
    execute@egress   through the daemon's proxy (HTTP_PROXY is set)

It prints median and p95 per variant, the differences that matter
(egress - none; proxied fetch - direct fetch, each against its sandbox
twin) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "egress"))
sys.path.insert(0, str(REPO / "tests" / "python"))

import interleave  # noqa: E402  (bench/, beside this file)

NOOP = 'print("ok")\n'
FETCH = ('import urllib.request\n'
         'print(len(urllib.request.urlopen("http://other.public.test/whoami", timeout=10).read()))\n')
PY = "/usr/bin/python3"
BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"]
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def outer(args) -> int:
    import test_egress as E  # the test network, as the egress tests build it

    reason = E.unready_reason()
    if reason:
        print("egress_bench: " + reason, file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="tsb-egress-bench-")
    os.chmod(tmp, 0o755)
    topo = E.Topology(tmp)
    try:
        topo.up()
        cmd = topo.daemon_wrap() + [sys.executable, str(Path(__file__).resolve()), "--inner", "--n", str(args.n),
                                    "--tmp", tmp]
        if args.json:
            cmd += ["--json", str(args.json)]
        return subprocess.run(cmd).returncode
    finally:
        topo.down()


def inner(args) -> int:
    import daemon_fixture as F
    import test_egress as E

    policies = os.path.join(args.tmp, "policies")
    E.write_policies(policies)
    daemon = F.Daemon(policies_dir=policies, organizations=os.path.join(policies, "organizations.json"))
    daemon.start()
    client = daemon.client(timeout=60)
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}

    def local(prefix, script):
        def run():
            t0 = time.perf_counter_ns()
            r = subprocess.run(prefix + [PY, "-"], input=script.encode(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
            ms = (time.perf_counter_ns() - t0) / 1e6
            if r.returncode != 0 or not r.stdout.strip():
                raise RuntimeError("%s failed: %s" % (prefix or "bare", r.stderr.decode(errors="replace")[-500:]))
            return ms
        return run

    def daemon_run(policy, script):
        def run():
            t0 = time.perf_counter_ns()
            r = client.execute(script, tool_name="bench", organization_id=E.ORG, policy=policy)
            ms = (time.perf_counter_ns() - t0) / 1e6
            if r.status != "success" or not "".join(r.stdout or []).strip():
                raise RuntimeError("daemon run under %s failed: %s %s" % (policy, r.stderr, r.record))
            return ms
        return run

    variants = {
        "noop bare": local([], NOOP),
        "noop bwrap": local(BWRAP + ["--unshare-all"], NOOP),
        "noop execute@none": daemon_run("none", NOOP),
        "noop execute@egress": daemon_run("public", NOOP),
        "fetch bare": local([], FETCH),
        "fetch bwrap": local(BWRAP + ["--unshare-all", "--share-net"], FETCH),
        "fetch execute@egress": daemon_run("public", FETCH),
    }
    report = {"n": args.n, "load_before": os.getloadavg(), "machine": os.uname().release}
    try:
        names = list(variants)
        report["latency_ms"] = interleave.rounds(variants, args.n)
        report["load_after"] = os.getloadavg()
        med = {n: v["median"] for n, v in report["latency_ms"].items()}
        print("| variant | median ms | p95 ms | vs bare |")
        print("|---|---:|---:|---:|")
        for n in names:
            base = med[n.split()[0] + " bare"]
            print("| %s | %.2f | %.2f | %s |" % (n, med[n], report["latency_ms"][n]["p95"],
                                                "—" if n.endswith("bare") else "x%.2f" % (med[n] / base)))
        d = {
            "egress - none (no request)": med["noop execute@egress"] - med["noop execute@none"],
            "fetch through the proxy - noop, daemon (egress)": med["fetch execute@egress"] - med["noop execute@egress"],
            "fetch direct - noop, bare": med["fetch bare"] - med["noop bare"],
            "fetch direct - noop, bwrap": med["fetch bwrap"] - med["noop bwrap"],
        }
        report["differences_ms"] = d
        print()
        for k, v in d.items():
            print("%s: %+.2f ms" % (k, v))
        print("\nload average before %s, after %s" % (report["load_before"], report["load_after"]))
        status = daemon.status()["egress"]
        report["daemon_egress_status"] = status
        print("daemon egress counters: %s" % json.dumps(status))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
    finally:
        daemon.stop()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return inner(args) if args.inner else outer(args)


if __name__ == "__main__":
    sys.exit(main())
