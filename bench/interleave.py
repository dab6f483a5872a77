"""The method the daemon benchmarks share: interleaved rounds and their
summary (bench/README.md, "Method")."""

from __future__ import annotations

import statistics
from typing import Callable


def pct(v: list[float], p: float) -> float:
    """The p-quantile of v, linearly interpolated."""
    v = sorted(v)
    k = (len(v) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def rounds(variants: dict[str, Callable[[], float]], n: int, warmups: int = 5) -> dict[str, dict[str, float]]:
    """`warmups` untimed runs of each variant, then n rounds running each
    once, the order rotated by one every round so that drift spreads over
    all of them. Each variant returns its own time in ms. Returns median,
    p10, p90 and p95 per variant."""
    names = list(variants)
    for _ in range(warmups):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names[i % len(names):] + names[:i % len(names)]:
            samples[name].append(variants[name]())
    return {name: {"median": statistics.median(s), "p95": pct(s, 0.95), "p10": pct(s, 0.1), "p90": pct(s, 0.9)}
            for name, s in samples.items()}
