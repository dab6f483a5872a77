"""The method the daemon benchmarks share: interleaved rounds and their
summary (bench/README.md, "Method")."""

from __future__ import annotations

import random
import statistics
from typing import Callable


def pct(v: list[float], p: float) -> float:
    """The p-quantile of v, linearly interpolated."""
    v = sorted(v)
    k = (len(v) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def rounds(variants: dict[str, Callable[[], float]], n: int, warmups: int = 5,
           seed: int = 20261204, before_rounds: Callable[[], None] | None = None,
           between_rounds: Callable[[], None] | None = None) -> dict[str, dict[str, float]]:
    """`warmups` untimed runs of each variant, then n rounds running each
    once, in a fresh random order every round (seeded: the same orders on
    every run), so that drift spreads over all of them and no variant always
    follows the same one. (A rotated order keeps each variant's predecessor:
    a variant that always ran after the same one carried what that one left
    behind, such as a busy or an idle host.) Each variant returns its own
    time in ms; `before_rounds` is called between the warm-ups and the
    rounds, `between_rounds` (untimed) before each round. Returns median,
    p10, p90 and p95 per variant."""
    names = list(variants)
    for _ in range(warmups):
        for name in names:
            variants[name]()
    if before_rounds:
        before_rounds()  # after the warm-ups
    samples: dict[str, list[float]] = {name: [] for name in names}
    order = random.Random(seed)
    for _ in range(n):
        if between_rounds:
            between_rounds()
        for name in order.sample(names, len(names)):
            samples[name].append(variants[name]())
    return {name: {"median": statistics.median(s), "p95": pct(s, 0.95), "p10": pct(s, 0.1), "p90": pct(s, 0.9)}
            for name, s in samples.items()}
