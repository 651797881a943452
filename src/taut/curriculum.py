"""Curriculum machinery: per-prompt mastery, the mixture sampler, collapse detectors and the
choice of the pre-collapse optimum.

The mastery-gated method of arXiv 2601.06052 runs as accuracy → compression → accuracy and is
stopped "at the best point before accuracy collapses"; its hard-truncation baseline collapses
(entropy falls, gradient norm explodes, accuracy goes). The paper does not publish its
stopping rule; ours:

- validation accuracy more than δ below the phase's starting accuracy, entropy (moving mean)
  below a fraction of the phase's starting entropy, or a gradient norm above k × its running
  median — each must trip on `patience` consecutive checks — ends the phase early;
- the run then rolls back to a validated checkpoint of that phase chosen by a configurable
  rule (default: the shortest one whose accuracy is within a tolerance of the phase start).

The mixture sampler (compression phases): each batch draws a share of its prompts from those
the model has mastered and the rest from those it has not. A compression signal exists only on
mastered prompts (the gate opens there), the accuracy signal only on the others; mixing keeps
both in every step. `adaptive` sets the share to the pool's current mastery rate, clipped to
bounds, so that the batch neither over-represents a small mastered set early nor starves the
accuracy signal once most prompts are mastered.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from taut.config import SamplerConfig, SelectionConfig, StopRules


class MasteryTracker:
    """Pass-rate history per prompt: (step, pass rate) of every group it was sampled in."""

    def __init__(self, keep: int = 16):
        self.keep = keep
        self.history: dict[str, list[tuple[int, float]]] = {}

    def record(self, prompt_id: str, step: int, pass_rate: float) -> None:
        entries = self.history.setdefault(prompt_id, [])
        entries.append((step, float(pass_rate)))
        del entries[: -self.keep]

    def latest(self, prompt_id: str) -> float | None:
        entries = self.history.get(prompt_id)
        return entries[-1][1] if entries else None

    def mastered(self, prompt_id: str, threshold: float) -> bool:
        latest = self.latest(prompt_id)
        return latest is not None and latest >= threshold - 1e-9

    def mastery_rate(self, prompt_ids: list[str], threshold: float) -> float:
        return sum(self.mastered(p, threshold) for p in prompt_ids) / max(1, len(prompt_ids))

    def state_dict(self) -> dict[str, Any]:
        return {"keep": self.keep, "history": {k: [list(e) for e in v] for k, v in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.keep = state["keep"]
        self.history = {k: [(int(s), float(r)) for s, r in v] for k, v in state["history"].items()}


def mixture_share(config: SamplerConfig, mastery_rate: float) -> float:
    """Share of a batch drawn from mastered prompts."""
    if config.mastered_fraction == "adaptive":
        lo, hi = config.adaptive_bounds
        return min(hi, max(lo, mastery_rate))
    return float(config.mastered_fraction)


def draw_mixture(ids: list[str], mastered: list[bool], n: int, share: float, rng: np.random.Generator) -> list[int]:
    """Indices of n prompts: round(share·n) mastered, the rest not (each side topped up from the
    other when it runs short), without repeats within the batch."""
    yes = [i for i, m in enumerate(mastered) if m]
    no = [i for i, m in enumerate(mastered) if not m]
    k = min(len(yes), round(share * n))
    k = max(k, n - len(no))                      # not enough unmastered prompts: more mastered ones
    pick_yes = rng.choice(len(yes), size=min(k, len(yes)), replace=False).tolist() if yes else []
    rest = n - len(pick_yes)
    pick_no = rng.choice(len(no), size=min(rest, len(no)), replace=False).tolist() if no else []
    return [yes[i] for i in pick_yes] + [no[i] for i in pick_no]


@dataclass
class Trip:
    detector: str
    step: int
    why: str


class CollapseDetectors:
    """The phase's stop rules, fed every step (entropy, grad norm) and at every validation."""

    def __init__(self, rules: StopRules, start_accuracy: float | None):
        self.rules = rules
        self.start_accuracy = start_accuracy
        self.entropies: list[float] = []
        self.grad_norms: list[float] = []
        self.strikes = {"accuracy": 0, "entropy": 0, "grad_norm": 0}

    def _strike(self, name: str, tripped: bool, step: int, why: str) -> Trip | None:
        self.strikes[name] = self.strikes[name] + 1 if tripped else 0
        return Trip(name, step, why) if self.strikes[name] >= self.rules.patience else None

    def observe_step(self, step: int, entropy: float | None, grad_norm: float | None) -> Trip | None:
        rules, trip = self.rules, None
        if entropy is not None and rules.entropy_ratio is not None:
            self.entropies.append(entropy)
            w = rules.window
            if len(self.entropies) >= 2 * w:
                start = statistics.fmean(self.entropies[:w])
                now = statistics.fmean(self.entropies[-w:])
                trip = self._strike("entropy", now < rules.entropy_ratio * start, step,
                                    f"entropy {now:.4f} (mean of last {w} steps) < {rules.entropy_ratio} × phase start {start:.4f}")
        if trip is None and grad_norm is not None and rules.grad_norm_spike is not None:
            history = list(self.grad_norms)
            self.grad_norms.append(grad_norm)
            if len(history) >= rules.window:
                median = statistics.median(history)
                trip = self._strike("grad_norm", grad_norm > rules.grad_norm_spike * median, step,
                                    f"grad norm {grad_norm:.3g} > {rules.grad_norm_spike} × running median {median:.3g}")
        return trip

    def observe_validation(self, step: int, accuracy: float) -> Trip | None:
        if self.rules.accuracy_drop is None or self.start_accuracy is None:
            return None
        floor = self.start_accuracy - self.rules.accuracy_drop
        return self._strike("accuracy", accuracy < floor, step,
                            f"validation accuracy {accuracy:.3f} < phase start {self.start_accuracy:.3f} − δ {self.rules.accuracy_drop}")

    def state_dict(self) -> dict[str, Any]:
        return {"start_accuracy": self.start_accuracy, "entropies": self.entropies, "grad_norms": self.grad_norms,
                "strikes": self.strikes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start_accuracy = state["start_accuracy"]
        self.entropies, self.grad_norms, self.strikes = state["entropies"], state["grad_norms"], state["strikes"]


@dataclass
class Candidate:
    """A validated checkpoint."""

    step: int
    checkpoint: str
    phase: str
    accuracy: float
    tokens: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def select(candidates: list[Candidate], rule: SelectionConfig, start_accuracy: float | None = None) -> Candidate:
    """The checkpoint a rule picks among validated candidates (non-empty, in step order)."""
    if not candidates:
        raise ValueError("no validated checkpoint to choose from")
    if rule.criterion == "last":
        return candidates[-1]
    best = max(c.accuracy for c in candidates)
    reference = best if rule.reference == "best" or start_accuracy is None else start_accuracy
    within = [c for c in candidates if c.accuracy >= reference - rule.tolerance - 1e-12]
    if rule.criterion == "best-accuracy" or not within:
        return max(candidates, key=lambda c: (c.accuracy, -c.tokens, c.step))
    if rule.criterion == "last-good":
        return within[-1]
    return min(within, key=lambda c: (c.tokens, -c.accuracy, c.step))
