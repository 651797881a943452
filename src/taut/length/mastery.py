"""`mastery-gated`: a sample-level soft length penalty, only where the prompt is already mastered.

Source: "Reinforcement Learning for Chain of Thought Compression with One-Domain-to-All
Generalization", arXiv 2601.06052. Only the abstract is public: a long rollout is penalised
only when the model already solves the problem and has produced a shorter rollout. The exact
gate, safe length and penalty form are not published; what follows is **our reading**.

For a group of G rollouts of one prompt with correctness c_i and lengths ℓ_i:

    pass rate      p = mean_i c_i
    gate           open  iff  p ≥ τ                        (default τ = 1: every rollout correct)
    safe length    s = (1 + slack) · min(shortest correct ℓ in the group, best seen for the prompt*)
    excess         e_i = (ℓ_i − s) / s
    reward         r_i = c_i − 1[gate] · c_i · 1[ℓ_i > s] · min(P_max, α · e_i)

(* only with `use_best_seen`; the best is the shortest correct length seen for this prompt in
any earlier batch, kept in checkpoints.)

P_max < 1, so a correct answer always scores above a wrong one (which scores 0). Wrong answers
and prompts whose gate is closed get the correctness reward unchanged. Because the penalty
makes a gated group's rewards unequal, dynamic sampling keeps such groups (it drops groups only
after shaping, on the shaped rewards).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from taut.length.base import GroupBatch, Shaped, Strategy, correctness
from taut.schema import Strict


class MasteryGatedConfig(Strict):
    name: Literal["mastery-gated"] = "mastery-gated"
    tau: float = Field(1.0, gt=0, le=1, description="gate opens when the group pass rate is at least tau")
    slack: float = Field(0.0, ge=0, description="safe length = shortest correct length × (1 + slack)")
    alpha: float = Field(1.0, gt=0, description="penalty per unit of relative excess length")
    max_penalty: float = Field(0.5, gt=0, lt=1, description="penalty cap; below 1 so correct beats wrong")
    use_best_seen: bool = Field(False, description="also bound the safe length by the prompt's best seen so far")


def mastery_gated_rewards(
    correct: Tensor,            # [P, G] bool
    lengths: Tensor,            # [P, G] int
    *,
    tau: float,
    slack: float,
    alpha: float,
    max_penalty: float,
    best_seen: Tensor | None = None,   # [P] float, inf where nothing seen
) -> tuple[Tensor, dict[str, Tensor]]:
    """Shaped rewards [P, G] and per-group/rollout intermediates (pure function)."""
    c = correct.float()
    length = lengths.float()
    gate = c.mean(dim=1) >= tau - 1e-9                                           # [P]
    shortest = torch.where(correct, length, torch.full_like(length, float("inf"))).amin(dim=1)  # [P]
    if best_seen is not None:
        shortest = torch.minimum(shortest, best_seen)
    safe = (1 + slack) * shortest                                                 # [P]
    safe_g = safe.unsqueeze(1)
    excess = ((length - safe_g) / safe_g).clamp(min=0)                            # [P, G]
    penalised = gate.unsqueeze(1) & correct & (length > safe_g)                   # [P, G]
    penalty = torch.where(penalised, (alpha * excess).clamp(max=max_penalty), torch.zeros_like(length))
    return c - penalty, {"gate": gate, "safe": safe, "penalised": penalised, "penalty": penalty}


class MasteryGated(Strategy):
    name = "mastery-gated"

    def __init__(self, config: MasteryGatedConfig):
        self.config = config
        self.best_seen: dict[str, int] = {}   # prompt id -> shortest correct length seen

    def shape(self, batch: GroupBatch) -> Shaped:
        cfg = self.config
        best = None
        if cfg.use_best_seen:
            if not batch.prompt_ids:
                raise ValueError("use_best_seen needs prompt ids in the batch")
            best = torch.tensor([float(self.best_seen.get(pid, float("inf"))) for pid in batch.prompt_ids])
        rewards, parts = mastery_gated_rewards(
            batch.correct, batch.lengths, tau=cfg.tau, slack=cfg.slack, alpha=cfg.alpha,
            max_penalty=cfg.max_penalty, best_seen=best,
        )
        self._remember(batch)
        gate, penalised, penalty, safe = parts["gate"], parts["penalised"], parts["penalty"], parts["safe"]
        metrics = {
            "gate_open": gate.float().mean().item(),
            "penalised_frac": penalised.float().mean().item(),
            "penalty_mean": (penalty[penalised].mean().item() if penalised.any() else 0.0),
        }
        if gate.any():
            metrics["safe_len_mean"] = safe[gate].mean().item()
        return Shaped(rewards, metrics)

    def _remember(self, batch: GroupBatch) -> None:
        if not batch.prompt_ids:
            return
        length = torch.where(batch.correct, batch.lengths, torch.full_like(batch.lengths, 2**62)).amin(dim=1)
        for pid, shortest in zip(batch.prompt_ids, length.tolist()):
            if shortest < 2**62 and shortest < self.best_seen.get(pid, 2**62):
                self.best_seen[pid] = int(shortest)

    def state_dict(self) -> dict[str, Any]:
        return {"best_seen": dict(self.best_seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_seen = {str(k): int(v) for k, v in state.get("best_seen", {}).items()}
