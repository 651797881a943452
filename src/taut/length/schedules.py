"""SIRI's rollout-length schedules L(t) (arXiv 2509.25176, §3).

With T the cycle length in steps, t the step counted from the start of the schedule and
φ = 2π (t mod T) / T:

    cosine        L(t) = (Lmax + Lmin)/2 + (Lmax − Lmin)/2 · cos φ
                  Lmax at t = 0, Lmin at T/2, Lmax again at T: compression, then expansion.
    stair         L(t) = Lmin for the first half of each cycle, Lmax for the second half.
                  (The paper shows the stair boundaries only in a figure; this split, aligned
                  with the cosine timeline's compression half, is our reading.)
    stair-cosine  Lmax on φ ∈ [0, π/4) ∪ [7π/4, 2π); falling cosine on [π/4, 3π/4);
                  Lmin on [3π/4, 5π/4); rising cosine on [5π/4, 7π/4) — the paper's formula:
                  falling  (Lmax + Lmin)/2 + (Lmax − Lmin)/2 · cos(2(φ − π/4))
                  rising   (Lmax + Lmin)/2 + (Lmax − Lmin)/2 · cos(2(φ − 3π/4))
                  With T = 640: Lmax on [0, 80), falling on [80, 240), Lmin on [240, 400),
                  rising on [400, 560), Lmax on [560, 640).

The paper does not say how a fractional L is rounded; we round to the nearest integer
(halves up).
"""

from __future__ import annotations

import math
from typing import Literal

ScheduleKind = Literal["cosine", "stair", "stair-cosine"]
SCHEDULES: tuple[ScheduleKind, ...] = ("cosine", "stair", "stair-cosine")


def length_cap(kind: ScheduleKind, step: int, l_max: int, l_min: int, period: int) -> int:
    """The cap L(t) in tokens at `step` for a schedule of the given kind."""
    if period <= 0:
        raise ValueError(f"period must be positive, got {period}")
    if l_min > l_max:
        raise ValueError(f"l_min ({l_min}) must not exceed l_max ({l_max})")
    pos = step % period                      # t mod T; phase boundaries compare integers, so they are exact
    phi = 2 * math.pi * pos / period
    mid, amp = (l_max + l_min) / 2, (l_max - l_min) / 2
    if kind == "cosine":
        value = mid + amp * math.cos(phi)
    elif kind == "stair":
        value = l_min if 2 * pos < period else l_max
    elif kind == "stair-cosine":             # φ in eighths of a turn: 8·pos/T < 1 ⟺ φ < π/4
        eighth = 8 * pos
        if eighth < period or eighth >= 7 * period:
            value = l_max
        elif eighth < 3 * period:
            value = mid + amp * math.cos(2 * (phi - math.pi / 4))
        elif eighth < 5 * period:
            value = l_min
        else:
            value = mid + amp * math.cos(2 * (phi - 3 * math.pi / 4))
    else:
        raise ValueError(f"unknown schedule {kind!r}; valid schedules: {', '.join(SCHEDULES)}")
    return int(math.floor(value + 0.5))
