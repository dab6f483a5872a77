#!/usr/bin/python3
"""Startup cost of one Python run: bare, under bubblewrap, under toolsandbox.

Every variant runs the same payload (default: /usr/bin/python3 -S -c pass)
behind a different prefix, so the difference between medians is what the
prefix costs. Method (docs/BENCHMARKS.md relies on it):

  * 5 warm-up runs per variant, not counted; the first one also checks that
    the variant works: a variant whose command fails is reported as failed,
    with its stderr, and never timed;
  * then n interleaved rounds: each variant once per round, in a fresh
    random order every round (seeded: the same orders on every run), so slow
    drift (thermal, page cache, noisy neighbours) spreads evenly over the
    variants and none always runs right after the same other one;
  * each run is timed with time.perf_counter_ns() around subprocess.run(),
    stdout and stderr to /dev/null;
  * reported per variant: n, median, p10, p90, p95 (ms), and the overhead
    against the bare run (median difference and ratio).

Usage:
  bench/startup.py                                # all variants, n=200
  bench/startup.py --variants bare,bwrap --n 50
  bench/startup.py --toolsandbox build/bin/toolsandbox --tsb-arg=--policy=default
  bench/startup.py --markdown --json out.json     # table for docs/BENCHMARKS.md
  bench/startup.py --variant 'nsjail=nsjail -Mo -Q --chroot / --'

Adding a variant: append a (name, prefix argv) pair in build_variants(), or
pass --variant NAME=PREFIX on the command line. The payload is appended to
the prefix.

Standard library only; run it with /usr/bin/python3.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PAYLOAD = "/usr/bin/python3 -S -c pass"
DEFAULT_TOOLSANDBOX = REPO / "build" / "bin" / "toolsandbox"
WARMUPS = 5
STDERR_KEEP = 4000  # bytes of a failing variant's stderr kept in the report


@dataclass
class Variant:
    name: str
    prefix: list[str]
    samples_ns: list[int] = field(default_factory=list)
    failed: bool = False
    failure: str = ""  # why: exit status and stderr

    def argv(self, payload: list[str]) -> list[str]:
        return [*self.prefix, *payload]


def build_variants(args: argparse.Namespace) -> list[Variant]:
    """The known variants, in report order. The first one is the baseline."""
    variants = [
        Variant("bare", []),
        Variant(
            "bwrap",
            ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
             "--unshare-all", "--die-with-parent"],
        ),
        Variant("toolsandbox", [str(args.toolsandbox), "run", *args.tsb_arg, "--"]),
        # Daemon variants (a client talking to a running toolsandboxd) go
        # here, e.g. Variant("toolsandboxd", [client, "run", "--socket", sock, "--"]).
    ]
    for spec in args.variant:
        name, sep, prefix = spec.partition("=")
        if not sep or not name:
            sys.exit(f"--variant wants NAME=PREFIX, got {spec!r}")
        variants.append(Variant(name, shlex.split(prefix)))
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        known = {v.name: v for v in variants}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            sys.exit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(known)}")
        variants = [known[w] for w in wanted]
    return variants


def run_once(argv: list[str], capture_stderr: bool = False) -> tuple[int, int, bytes]:
    """Runs argv once; returns (elapsed ns, exit status, stderr if captured)."""
    stderr = subprocess.PIPE if capture_stderr else subprocess.DEVNULL
    t0 = time.perf_counter_ns()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    t1 = time.perf_counter_ns()
    return t1 - t0, p.returncode, p.stderr or b""


def describe_failure(argv: list[str], status: int | None, stderr: bytes, error: str = "") -> str:
    text = error or stderr.decode("utf-8", "replace").strip()
    if len(text) > STDERR_KEEP:
        text = text[:STDERR_KEEP] + " [...]"
    what = f"exit status {status}" if status is not None else "could not start"
    return f"{what}: {shlex.join(argv)}" + (f"\n{text}" if text else "")


def warm_up(v: Variant, payload: list[str], count: int) -> None:
    argv = v.argv(payload)
    for i in range(count):
        try:
            _, status, err = run_once(argv, capture_stderr=True)
        except OSError as e:
            v.failed, v.failure = True, describe_failure(argv, None, b"", str(e))
            return
        if status != 0:
            v.failed, v.failure = True, describe_failure(argv, status, err)
            return


def measure(variants: list[Variant], payload: list[str], rounds: int, progress: bool) -> None:
    live = [v for v in variants if not v.failed]
    order = random.Random(20261204)
    for r in range(rounds):
        if not live:
            return
        for v in order.sample(live, len(live)):
            argv = v.argv(payload)
            ns, status, _ = run_once(argv)
            if status != 0:
                # Rerun once to capture what it says; the variant is out.
                _, status2, err = run_once(argv, capture_stderr=True)
                v.failed = True
                v.failure = (f"failed in round {r + 1} after {len(v.samples_ns)} good runs; "
                             + describe_failure(argv, status, err if status2 != 0 else b""))
                continue
            v.samples_ns.append(ns)
        live = [v for v in live if not v.failed]
        if progress and (r + 1) % max(1, rounds // 10) == 0:
            print(f"  round {r + 1}/{rounds}", file=sys.stderr, flush=True)


def percentile(sorted_values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(v: Variant, base_median: float | None) -> dict:
    out: dict = {"name": v.name, "prefix": v.prefix, "failed": v.failed}
    if v.failed:
        out["failure"] = v.failure
    ms = sorted(s / 1e6 for s in v.samples_ns)
    out["n"] = len(ms)
    if ms and not v.failed:
        med = statistics.median(ms)
        out.update({
            "median_ms": round(med, 2),
            "p10_ms": round(percentile(ms, 10), 2),
            "p90_ms": round(percentile(ms, 90), 2),
            "p95_ms": round(percentile(ms, 95), 2),
            "min_ms": round(ms[0], 2),
            "mean_ms": round(statistics.fmean(ms), 2),
        })
        if base_median is not None:
            out["overhead_ms"] = round(med - base_median, 2)
            out["ratio"] = round(med / base_median, 2) if base_median > 0 else None
    return out


def cgroup_layout() -> str:
    """v2 (unified), hybrid (v1 controllers plus a cgroup2 mount) or v1."""
    v1 = False
    v2_at = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                try:
                    sep = fields.index("-")
                except ValueError:
                    continue
                fstype, mountpoint = fields[sep + 1], fields[4]
                if fstype == "cgroup":
                    v1 = True
                elif fstype == "cgroup2":
                    v2_at = v2_at or mountpoint
    except OSError:
        return "unknown"
    if v2_at == "/sys/fs/cgroup" and not v1:
        return "v2"
    if v1 and v2_at:
        return "hybrid"
    if v1:
        return "v1"
    return "v2" if v2_at else "none"


def command_output(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else ""


def machine_info(payload: list[str], variants: list[Variant]) -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / (1 << 20), 1)
                    break
    except OSError:
        pass
    info = {
        "kernel": platform.release(),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "mem_gib": mem_gib,
        "cgroup_layout": cgroup_layout(),
        "euid": os.geteuid(),
        "harness_python": platform.python_version(),
        "payload_python": command_output([payload[0], "--version"]) if payload else "",
        "tools": {},
    }
    for v in variants:
        if v.prefix and shutil.which(v.prefix[0]):
            info["tools"][v.name] = command_output([v.prefix[0], "--version"])
    return info


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"Payload `{report['payload']}`; n = {report['n']} interleaved rounds, "
        f"{report['warmups']} warm-ups per variant, a random order each round; "
        f"wall time of `subprocess.run()`, stdout to /dev/null.",
        "",
        f"Machine: kernel {m['kernel']}, {m['cpu']}, {m['nproc']} CPUs, "
        f"{m['mem_gib']} GiB, cgroup layout {m['cgroup_layout']}, "
        f"{'root' if m['euid'] == 0 else 'uid ' + str(m['euid'])}, "
        f"payload {m['payload_python'] or '?'} (harness Python {m['harness_python']}); "
        f"1-min load average {report['loadavg_1min']['before']} before, "
        f"{report['loadavg_1min']['after']} after.",
        "",
        "| Variant | n | median ms | p10 ms | p90 ms | p95 ms | overhead ms | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    failures = []
    for r in report["results"]:
        if r["failed"]:
            lines.append(f"| {r['name']} | — | failed | | | | | |")
            failures.append(r)
            continue
        over = r.get("overhead_ms")
        over_s = "—" if r is report["results"][0] else (f"{over:+.2f}" if over is not None else "")
        ratio = r.get("ratio")
        ratio_s = "—" if r is report["results"][0] else (f"{ratio:.2f}×" if ratio is not None else "")
        lines.append(
            f"| {r['name']} | {r['n']} | {r['median_ms']:.2f} | {r['p10_ms']:.2f} | "
            f"{r['p90_ms']:.2f} | {r['p95_ms']:.2f} | {over_s} | {ratio_s} |"
        )
    lines.append("")
    for r in report["results"]:
        prefix = shlex.join(r["prefix"]) if r["prefix"] else "(none)"
        lines.append(f"- {r['name']}: `{prefix}`")
    for r in failures:
        lines += ["", f"**{r['name']} failed**:", "", "```", r["failure"], "```"]
    return "\n".join(lines) + "\n"


def text_table(report: dict) -> str:
    rows = [("variant", "n", "median", "p10", "p90", "p95", "overhead", "ratio")]
    for r in report["results"]:
        if r["failed"]:
            rows.append((r["name"], "-", "FAILED", "", "", "", "", ""))
            continue
        rows.append((
            r["name"], str(r["n"]), f"{r['median_ms']:.2f}", f"{r['p10_ms']:.2f}",
            f"{r['p90_ms']:.2f}", f"{r['p95_ms']:.2f}",
            f"{r['overhead_ms']:+.2f}" if "overhead_ms" in r else "-",
            f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
           for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    m = report["machine"]
    out.append("")
    out.append("times in ms; overhead and ratio against the median of "
               f"{report['results'][0]['name'] if report['results'] else '-'}")
    out.append(f"kernel {m['kernel']} | {m['cpu']} | nproc {m['nproc']} | cgroup {m['cgroup_layout']} "
               f"| {m['payload_python']} | load {report['loadavg_1min']['before']}"
               f" -> {report['loadavg_1min']['after']}")
    for r in report["results"]:
        if r["failed"]:
            out += ["", f"{r['name']} FAILED: {r['failure']}"]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--n", type=int, default=200, help="timed rounds (default 200)")
    ap.add_argument("--warmups", type=int, default=WARMUPS, help="warm-up runs per variant (default 5)")
    ap.add_argument("--payload", default=DEFAULT_PAYLOAD, help=f"command to start (default {DEFAULT_PAYLOAD!r})")
    ap.add_argument("--variants", help="comma-separated subset, in report order (default: all)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PREFIX",
                    help="add a variant: PREFIX is split like a shell line, the payload appended")
    ap.add_argument("--toolsandbox", type=Path, default=DEFAULT_TOOLSANDBOX,
                    help=f"toolsandbox CLI (default {DEFAULT_TOOLSANDBOX.relative_to(REPO)})")
    ap.add_argument("--tsb-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for 'toolsandbox run', before '--' (repeatable)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the full report as JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args()
    if args.n < 1 or args.warmups < 1:
        ap.error("--n and --warmups must be at least 1 (the first warm-up checks the variant)")

    payload = shlex.split(args.payload)
    variants = build_variants(args)
    if not variants:
        ap.error("no variant selected")

    progress = not args.quiet
    for v in variants:
        if progress:
            print(f"warm-up {v.name}: {shlex.join(v.argv(payload))}", file=sys.stderr, flush=True)
        warm_up(v, payload, args.warmups)
        if v.failed and progress:
            print(f"  FAILED, not timed: {v.failure}", file=sys.stderr, flush=True)
    started = time.time()
    load_before = os.getloadavg()
    measure(variants, payload, args.n, progress)
    load_after = os.getloadavg()

    base = variants[0]
    base_median = (statistics.median(s / 1e6 for s in base.samples_ns)
                   if base.samples_ns and not base.failed else None)
    report = {
        "tool": "bench/startup.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "payload": shlex.join(payload),
        "n": args.n,
        "warmups": args.warmups,
        "baseline": base.name,
        "machine": machine_info(payload, variants),
        # Other work on the machine shows up here before it shows in the
        # spread: compare runs only at similar load.
        "loadavg_1min": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
        "results": [summarize(v, base_median if v is not base else None) for v in variants],
    }
    if base_median is not None:
        report["results"][0].update({"overhead_ms": 0.0, "ratio": 1.0})

    sys.stdout.write(markdown(report) if args.markdown else text_table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if any(v.failed for v in variants) else 0


if __name__ == "__main__":
    sys.exit(main())
