"""What the update optimises: the policy gradient (GRPO/DAPO) or on-policy SFT.

An objective is chosen once per phase from the strategy (`Strategy.objective`). It says which
groups teach something (for dynamic sampling), which rollouts enter the loss with which
weights, and the loss of one micro-batch. `update` is the same for both: micro-batches of
similar length, gradient accumulation, clipping, a skipped step on a non-finite gradient.

One update per rollout batch is the default: the policy that sampled is the policy being
updated, so π_old = π detached, the ratio is exactly 1 and the clip ranges never act; they
matter only with `rl.updates_per_batch > 1`, where π_old comes from one no-grad forward
before the first update.

"The policy that sampled" holds only up to numerics: the engine computes its log-probs with a KV
cache, other kernels and possibly another precision than the trainer's full forward. With
`rl.rollout_logprobs` the engine returns each sampled token's log-prob and `update` logs the gap
(`sampling_gap`: mean |log π_rollout − log π_old| per token, `sampling_gap_max`); with
`rl.rollout_is: token-truncate` each token's policy-gradient term is weighted by
w = min(π_old / π_rollout, rl.rollout_is_cap), detached (truncated importance sampling, verl's
token-level rollout correction), and `is_truncated_frac` is the share of tokens whose weight hit
the cap.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from taut.config import RLConfig
from taut.length import Strategy
from taut.metrics import mean
from taut.models import Policy
from taut.rl.advantages import AdvantageNorm, group_advantages, informative_groups
from taut.rl.guard import NonFiniteGuard
from taut.rl.logprobs import SequenceBatch, micro_batches, response_logprobs, shared_micro_batches, shares_prompts
from taut.rl.losses import aggregation_weights, clipped_policy_loss, sft_loss
from taut.rl.rollouts import RolloutBatch

log = logging.getLogger(__name__)

LOSS_METRICS = ("loss", "grad_norm", "entropy", "kl", "clip_low_frac", "clip_high_frac", "skipped", "logprob_time", "rows_trained",
                "prompts_forwarded", "sampling_gap", "sampling_gap_max", "is_truncated_frac")


def resolve_adv_norm(configured: AdvantageNorm | None, strategy: Strategy) -> AdvantageNorm:
    """The advantage normalisation of a phase: `rl.adv_norm` if set, else the strategy's, else group."""
    required = strategy.adv_norm
    if configured is None:
        return required or "group"
    if required is not None and configured != required:
        log.warning("rl.adv_norm=%s overrides the %s strategy's advantage normalisation %r, which the method is "
                    "defined with", configured, strategy.name, required)
    return configured


@dataclass
class LossPlan:
    """Which rollouts enter the loss and how much each weighs."""

    rows: list[int]               # rollouts with a non-zero contribution
    weights: Tensor               # [N] aggregation weight of every rollout
    advantages: Tensor | None     # [N] (policy gradient only)


class PolicyGradient:
    """PPO-clip on group-normalised advantages, with optional k3 KL and entropy terms."""

    def __init__(self, cfg: RLConfig, adv_norm: AdvantageNorm):
        self.cfg = cfg
        self.adv_norm = adv_norm
        self.temperature = cfg.temperature           # log π of the distribution the rollouts were sampled from
        self.uses_old_logp = cfg.updates_per_batch > 1
        self.uses_reference = cfg.kl_coef > 0

    def informative(self, rewards: Tensor) -> Tensor:
        """[P] bool: a group teaches something when its shaped rewards are not all equal."""
        return informative_groups(rewards)

    def plan(self, rewards: Tensor, lengths: Tensor, cap: int) -> LossPlan:
        cfg = self.cfg
        advantages = group_advantages(rewards, self.adv_norm).flatten()                   # [K*G]
        weights = aggregation_weights(lengths, cfg.loss_agg, norm_length=cap)
        extra_terms = cfg.kl_coef > 0 or cfg.entropy_coef > 0
        # rows with zero advantage add nothing without KL/entropy terms
        rows = [i for i in range(len(lengths)) if extra_terms or advantages[i] != 0]
        return LossPlan(rows, weights, advantages)

    def loss(self, logp: Tensor, entropy: Tensor, seq: SequenceBatch, plan: LossPlan, idx: Tensor,
             old_logp: Tensor, ref_logp: Tensor | None, stats: dict[str, float]) -> Tensor:
        cfg = self.cfg
        is_weights = None
        if cfg.rollout_is == "token-truncate":
            is_weights, truncated = rollout_is_weights(old_logp, seq.rollout_logp, seq.mask, cfg.rollout_is_cap)
            stats["is_truncated"] += truncated
        terms = clipped_policy_loss(
            logp, old_logp, plan.advantages[idx].to(logp.device), seq.mask, plan.weights[idx].to(logp.device),
            clip_low=cfg.clip_low, clip_high=cfg.clip_high, ref_logp=ref_logp, kl_coef=cfg.kl_coef,
            entropy=entropy, entropy_coef=cfg.entropy_coef, is_weights=is_weights,
        )
        stats["clip_low"] += float(terms.clipped_low.sum())
        stats["clip_high"] += float(terms.clipped_high.sum())
        stats["kl_sum"] += float((terms.kl * seq.mask).sum())
        return terms.loss


def rollout_is_weights(old_logp: Tensor, rollout_logp: Tensor | None, mask: Tensor, cap: float) -> tuple[Tensor, int]:
    """Truncated importance weights [N, T] min(π_old / π_rollout, cap) (1 where the engine gave no
    log-prob, e.g. forced prefix tokens), and how many response tokens hit the cap."""
    if rollout_logp is None:
        raise ValueError("rl.rollout_is needs the engine's log-probs, and this batch has none")
    known = torch.isfinite(rollout_logp)
    ratio = torch.exp(old_logp.detach() - torch.where(known, rollout_logp, old_logp.detach()))
    weights = ratio.clamp(max=cap)
    return weights, int(((ratio > cap) & (mask > 0)).sum())


def sampling_gap(logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> tuple[float, float, int]:
    """Sum and max of |log π_rollout − log π| over response tokens with an engine log-prob, and their count."""
    on = (mask > 0) & torch.isfinite(rollout_logp)
    gap = (logp.detach() - torch.where(on, rollout_logp, logp.detach())).abs()
    return float(gap.sum()), float(gap.max()) if gap.numel() else 0.0, int(on.sum())


class OnPolicySFT:
    """Cross-entropy on the kept rollouts (shaped reward > 0), token-mean over the kept tokens.

    The model's own distribution (temperature 1) is trained, as supervised fine-tuning does: the
    kept samples are targets, not actions whose sampling probability is reweighted.
    """

    temperature = 1.0
    uses_old_logp = False
    uses_reference = False

    def __init__(self, cfg: RLConfig):
        self.cfg = cfg

    def informative(self, rewards: Tensor) -> Tensor:
        """[P] bool: a group teaches something when it keeps at least one rollout."""
        return rewards.amax(dim=1) > 0

    def plan(self, rewards: Tensor, lengths: Tensor, cap: int) -> LossPlan:
        rows = rewards.flatten().nonzero().squeeze(-1).tolist()
        weights = torch.zeros(len(lengths))
        if rows:
            weights[rows] = aggregation_weights(lengths[rows], "token-mean")
        return LossPlan(rows, weights, None)

    def loss(self, logp: Tensor, entropy: Tensor, seq: SequenceBatch, plan: LossPlan, idx: Tensor,
             old_logp: Tensor, ref_logp: Tensor | None, stats: dict[str, float]) -> Tensor:
        return sft_loss(logp, seq.mask, plan.weights[idx].to(logp.device))


Objective = PolicyGradient | OnPolicySFT


def build_objective(strategy: Strategy, cfg: RLConfig) -> Objective:
    if strategy.objective == "sft":
        return OnPolicySFT(cfg)
    return PolicyGradient(cfg, resolve_adv_norm(cfg.adv_norm, strategy))


def update(policy: Policy, optimizer: torch.optim.Optimizer, batch: RolloutBatch, objective: Objective, cfg: RLConfig, *,
           cap: int, reference: torch.nn.Module | None = None, guard: NonFiniteGuard | None = None,
           where: str = "") -> dict[str, float | None]:
    """One or more optimizer updates on the kept groups; returns loss metrics.

    With a `guard`, a step whose gradient norm or resulting weights are not finite is undone
    and counted (the guard stops the run after too many in a row); without one, a step with a
    non-finite gradient norm is skipped."""
    model = policy.model
    lengths = torch.tensor([len(r) for r in batch.responses])                          # [K*G]
    plan = objective.plan(torch.stack(batch.rewards), lengths, cap)                    # rewards [K, G]
    if not plan.rows:                         # nothing to learn from this batch
        return dict.fromkeys(LOSS_METRICS, None) | {"loss": 0.0, "skipped": 0.0, "rows_trained": 0, "prompts_forwarded": 0}

    share = cfg.share_prompts and shares_prompts(model)        # a prompt's G rollouts: one forward of the prompt
    if share:
        groups = shared_micro_batches([tuple(batch.prompts[i]) for i in plan.rows], [len(batch.responses[i]) for i in plan.rows],
                                      cfg.micro_batch_tokens)
    else:
        groups = micro_batches([len(batch.prompts[i]) + len(batch.responses[i]) for i in plan.rows], cfg.micro_batch_tokens)
    chunks = [[plan.rows[j] for j in mb] for mb in groups]
    sampled = batch.rollout_logp
    sequences = {tuple(c): SequenceBatch.build([batch.prompts[i] for i in c], [batch.responses[i] for i in c], policy.pad_id, model.device,
                                               rollout_logp=None if sampled is None else [sampled[i] for i in c], share_prompts=share)
                 for c in chunks}
    T = objective.temperature
    old_logp = {}
    if objective.uses_old_logp:
        with torch.no_grad(), policy.autocast():
            old_logp = {key: response_logprobs(model, seq, temperature=T)[0] for key, seq in sequences.items()}

    stats = {"loss": 0.0, "entropy_sum": 0.0, "tokens": 0.0, "kl_sum": 0.0, "clip_low": 0.0, "clip_high": 0.0, "forward_time": 0.0,
             "is_truncated": 0.0}
    gap_sum, gap_max, gap_tokens = 0.0, 0.0, 0
    grad_norms, skipped = [], 0
    for update_index in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for key, seq in sequences.items():
            idx = torch.tensor(key)
            t_forward = time.perf_counter()
            with policy.autocast():
                logp, entropy = response_logprobs(model, seq, with_entropy=True, temperature=T,     # [n, Tr]
                                                   entropy_grad=cfg.entropy_coef > 0)
            stats["forward_time"] += time.perf_counter() - t_forward
            if update_index == 0 and seq.rollout_logp is not None:       # the policy that sampled, as the trainer computes it
                total, worst, count = sampling_gap(old_logp.get(key, logp), seq.rollout_logp, seq.mask)
                gap_sum, gap_max, gap_tokens = gap_sum + total, max(gap_max, worst), gap_tokens + count
            ref_logp = None
            if reference is not None:
                with torch.no_grad(), policy.autocast():
                    ref_logp = response_logprobs(reference, seq, temperature=T)[0]
            loss = objective.loss(logp, entropy, seq, plan, idx, old_logp.get(key, logp.detach()), ref_logp, stats)
            loss.backward()
            stats["loss"] += loss.item()
            stats["entropy_sum"] += float((entropy.detach() * seq.mask).sum())
            stats["tokens"] += float(seq.mask.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if guard is not None:
            applied = guard.step(grad_norm, where=where)
        elif torch.isfinite(grad_norm):
            optimizer.step()
            applied = True
        else:
            optimizer.zero_grad(set_to_none=True)
            applied = False
        if not applied:                               # a non-finite step is skipped and counted
            skipped += 1
            continue
        grad_norms.append(grad_norm.item())
    tokens = max(1.0, stats["tokens"])
    return {
        "loss": stats["loss"] / cfg.updates_per_batch,
        "grad_norm": mean(grad_norms) if grad_norms else float("nan"),
        "entropy": stats["entropy_sum"] / tokens,
        "kl": stats["kl_sum"] / tokens,
        "clip_low_frac": stats["clip_low"] / tokens,
        "clip_high_frac": stats["clip_high"] / tokens,
        "skipped": float(skipped),
        "logprob_time": stats["forward_time"],
        "rows_trained": len(plan.rows),           # rollouts forwarded (those with zero advantage add nothing)
        "prompts_forwarded": sum(len(seq.prompt_ids) if seq.prompt_index is not None else len(seq.prompt_lens)
                                 for seq in sequences.values()),      # a shared prompt counts once per micro-batch
        "sampling_gap": gap_sum / gap_tokens if gap_tokens else None,
        "sampling_gap_max": gap_max if gap_tokens else None,
        "is_truncated_frac": stats["is_truncated"] / tokens if cfg.rollout_is != "none" else None,
    }
