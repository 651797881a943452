"""The policy-gradient loss: PPO-clip with decoupled clip range, and loss aggregation.

Per response token t of rollout i, with ratio ρ = exp(log π − log π_old) and advantage A_i:

    ℓ_it = − min(ρ · A_i, clip(ρ, 1 − ε_low, 1 + ε_high) · A_i)            (DAPO clip-higher)
           + β · (exp(log π_ref − log π) − (log π_ref − log π) − 1)           (k3 KL, optional)
           − η · H_t                                                           (entropy bonus, optional)

The objective (ℓ above) and its aggregation over tokens are separate choices. The loss is
Σ_it w_i · m_it · ℓ_it with the mask m (response tokens, the real `<eos>` included) and
per-rollout weights w_i from the aggregation mode, for N rollouts with |o_i| tokens:

    token-mean                w_i = 1 / Σ_j |o_j|             (DAPO)
    seq-mean-token-mean       w_i = 1 / (N · |o_i|)          (GRPO as written)
    seq-mean-token-sum        w_i = 1 / N
    seq-mean-token-sum-norm   w_i = 1 / (N · L)              (Dr. GRPO; L = the generation cap)

Writing aggregation as weights makes micro-batching exact: each micro-batch adds its share of
one global sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def aggregation_weights(lengths: Tensor, mode: LossAggregation, norm_length: int | None = None) -> Tensor:
    """Per-rollout weights w_i [N] for response lengths [N] (in tokens)."""
    n = lengths.numel()
    lengths = lengths.float()
    if mode == "token-mean":
        return torch.full_like(lengths, 1.0 / lengths.sum().clamp(min=1).item())
    if mode == "seq-mean-token-mean":
        return 1.0 / (n * lengths.clamp(min=1))
    if mode == "seq-mean-token-sum":
        return torch.full_like(lengths, 1.0 / n)
    if mode == "seq-mean-token-sum-norm":
        if not norm_length:
            raise ValueError("seq-mean-token-sum-norm needs the normalising length")
        return torch.full_like(lengths, 1.0 / (n * norm_length))
    raise ValueError(f"unknown loss aggregation {mode!r}")


@dataclass
class LossTerms:
    loss: Tensor            # scalar: this micro-batch's share of the global loss
    clipped_low: Tensor     # [N, T] bool: ratio below 1 − ε_low with A < 0 (gradient cut)
    clipped_high: Tensor    # [N, T] bool: ratio above 1 + ε_high with A > 0 (gradient cut)
    kl: Tensor              # [N, T] k3 KL per token (zeros without a reference)


def clipped_policy_loss(
    logp: Tensor,            # [N, T] log π of the response tokens (with grad)
    old_logp: Tensor,        # [N, T] log π_old (no grad)
    advantages: Tensor,      # [N]
    mask: Tensor,            # [N, T] 1 on response tokens
    weights: Tensor,         # [N] aggregation weights
    *,
    clip_low: float,
    clip_high: float,
    ref_logp: Tensor | None = None,   # [N, T]
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,    # [N, T]
    entropy_coef: float = 0.0,
    is_weights: Tensor | None = None, # [N, T] rollout-correction weights on the policy-gradient term (no grad)
) -> LossTerms:
    adv = advantages.unsqueeze(1)                                        # [N, 1]
    ratio = torch.exp(logp - old_logp)                                   # [N, T]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)                       # [N, T]
    if is_weights is not None:
        per_token = per_token * is_weights
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef > 0:
        per_token = per_token - entropy_coef * entropy
    loss = (per_token * mask * weights.unsqueeze(1)).sum()
    with torch.no_grad():
        on = mask.bool()
        clipped_low = on & (ratio < 1 - clip_low) & (adv < 0)
        clipped_high = on & (ratio > 1 + clip_high) & (adv > 0)
    return LossTerms(loss=loss, clipped_low=clipped_low, clipped_high=clipped_high, kl=kl.detach())


def sft_loss(logp: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """Cross-entropy on the masked tokens: − Σ w_i m_it log π_it."""
    return -(logp * mask * weights.unsqueeze(1)).sum()
