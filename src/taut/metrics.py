"""Evaluation statistics as pure functions (tested on hand-made values)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., arXiv 2107.03374):
    1 − C(n − c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100) with linear interpolation between order statistics
    (numpy's default); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def histogram(values: Sequence[int], edges: Sequence[int]) -> list[int]:
    """Counts in [edges[i], edges[i+1]); the last bin also holds values ≥ its upper edge."""
    counts = [0] * (len(edges) - 1)
    for v in values:
        for i in range(len(edges) - 1):
            if edges[i] <= v < edges[i + 1] or (i == len(edges) - 2 and v >= edges[i + 1]):
                counts[i] += 1
                break
    return counts


# ---------------------------------------------------------------------------------------------
# efficiency: the field's measures, on any task (no oracle); `outcomes` maps a problem id to its
# samples as (length in tokens, correct) pairs
# ---------------------------------------------------------------------------------------------

Outcomes = dict[str, list[tuple[int, bool]]]


def tokens_per_correct(outcomes: Outcomes) -> float:
    """Every token spent, right or wrong, per correct answer (nan when none is correct)."""
    spent = sum(length for samples in outcomes.values() for length, _ in samples)
    right = sum(correct for samples in outcomes.values() for _, correct in samples)
    return spent / right if right else float("nan")


def overthinking(outcomes: Outcomes, shortest: dict[str, int] | None = None) -> float:
    """ThoughtTerminator's overthinking (Pu et al., arXiv 2504.13367; its authors' summary: "the
    delta between the mean/max token spend on each question vs the minimum for successful
    answers"): the mean over
    problems of (mean length of all the problem's samples − the shortest correct length), over
    the problems that have a shortest correct length. `shortest` gives it from outside — the
    minimum over every model compared, the paper's global O_g; without it, each problem's own
    shortest correct sample (the paper's local measure, 0 for a problem with one sample)."""
    excess = []
    for pid, samples in outcomes.items():
        own = [length for length, correct in samples if correct]
        floor = shortest.get(pid) if shortest is not None else (min(own) if own else None)
        if floor is not None and samples:
            excess.append(mean([length for length, _ in samples]) - floor)
    return mean(excess)


def shortest_correct(*evaluations: Outcomes) -> dict[str, int]:
    """Per problem, the shortest correct length in any of the evaluations (for the global measure)."""
    out: dict[str, int] = {}
    for outcomes in evaluations:
        for pid, samples in outcomes.items():
            for length, correct in samples:
                if correct and (pid not in out or length < out[pid]):
                    out[pid] = length
    return out


def underthinking(start: Outcomes, now: Outcomes) -> tuple[float, int]:
    """Accuracy lost on the problems the start solved (in the spirit of OptimalThinkingBench,
    arXiv 2508.13141, where underthinking is accuracy given up by thinking too little; the
    definition here is ours): over the problems both evaluated on which the start's
    accuracy was at least 1/2, the start's accuracy minus this one's, in points of accuracy
    (positive: lost; negative: gained). Returns (value, problems counted); nan for none."""
    solved = [pid for pid, samples in start.items()
              if pid in now and samples and now[pid] and mean([c for _, c in samples]) >= 0.5]
    if not solved:
        return float("nan"), 0
    rate = lambda samples: mean([c for _, c in samples])   # noqa: E731
    return mean([rate(start[pid]) - rate(now[pid]) for pid in solved]), len(solved)
