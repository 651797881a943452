"""The accuracy–tokens Pareto frontier.

A point (tokens, accuracy) dominates another when it has at least the accuracy with at most
the tokens, and is strictly better in one of the two. The frontier is the set of points no
other point dominates: the best accuracy reachable at each token cost. Exact duplicates do
not dominate each other, so both stay on the frontier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated (tokens, accuracy) points, ordered by tokens (then by
    accuracy). Points with a nan coordinate are never on the frontier."""
    finite = [i for i, (t, a) in enumerate(points) if not (math.isnan(t) or math.isnan(a))]
    order = sorted(finite, key=lambda i: (points[i][0], -points[i][1]))
    frontier: list[int] = []
    best = -math.inf
    for i in order:
        tokens, accuracy = points[i]
        if accuracy > best:
            frontier.append(i)
            best = accuracy
        elif frontier and points[frontier[-1]] == (tokens, accuracy):
            frontier.append(i)                       # an exact duplicate of a frontier point
    return sorted(frontier, key=lambda i: (points[i][0], points[i][1]))
