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

from taut.config import LossSettings, UpdateSettings
from taut.length import Strategy
from taut.metrics import mean
from taut.models.policy import Policy
from taut.rl.advantages import AdvantageNorm, group_advantages, informative_groups
from taut.rl.guard import NonFiniteGuard
from taut.rl.logprobs import (
    SequenceBatch,
    micro_batches,
    response_logprobs,
    shared_micro_batches,
    shares_prompts,
)
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

    def __init__(self, settings: LossSettings, adv_norm: AdvantageNorm):
        self.settings = settings
        self.adv_norm = adv_norm
        self.temperature = settings.temperature      # log π of the distribution the rollouts were sampled from
        self.uses_old_logp = settings.updates_per_batch > 1
        self.uses_reference = settings.kl_coef > 0

    def informative(self, rewards: Tensor) -> Tensor:
        """[P] bool: a group teaches something when its shaped rewards are not all equal."""
        return informative_groups(rewards)

    def plan(self, rewards: Tensor, lengths: Tensor, cap: int) -> LossPlan:
        """The advantages (group-normalised shaped rewards) and each rollout's aggregation weight."""
        s = self.settings
        advantages = group_advantages(rewards, self.adv_norm).flatten()                   # [K*G]
        weights = aggregation_weights(lengths, s.loss_agg, norm_length=cap)
        extra_terms = s.kl_coef > 0 or s.entropy_coef > 0
        # rows with zero advantage add nothing without KL/entropy terms
        rows = [i for i in range(len(lengths)) if extra_terms or advantages[i] != 0]
        return LossPlan(rows, weights, advantages)

    def loss(self, logp: Tensor, entropy: Tensor, seq: SequenceBatch, plan: LossPlan, idx: Tensor,
             old_logp: Tensor, ref_logp: Tensor | None) -> tuple[Tensor, dict[str, float]]:
        """The micro-batch's loss and its counts (clipped tokens, KL sum, truncated importance weights)."""
        s = self.settings
        is_weights, truncated = None, 0
        if s.rollout_is == "token-truncate":
            is_weights, truncated = rollout_is_weights(old_logp, seq.rollout_logp, seq.mask, s.rollout_is_cap)
        terms = clipped_policy_loss(
            logp, old_logp, plan.advantages[idx].to(logp.device), seq.mask, plan.weights[idx].to(logp.device),
            clip_low=s.clip_low, clip_high=s.clip_high, ref_logp=ref_logp, kl_coef=s.kl_coef,
            entropy=entropy, entropy_coef=s.entropy_coef, is_weights=is_weights,
        )
        return terms.loss, {"clip_low": float(terms.clipped_low.sum()), "clip_high": float(terms.clipped_high.sum()),
                            "kl_sum": float((terms.kl * seq.mask).sum()), "is_truncated": float(truncated)}


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
             old_logp: Tensor, ref_logp: Tensor | None) -> tuple[Tensor, dict[str, float]]:
        return sft_loss(logp, seq.mask, plan.weights[idx].to(logp.device)), {}


Objective = PolicyGradient | OnPolicySFT


def build_objective(strategy: Strategy, settings: LossSettings, adv_norm: AdvantageNorm | None = None) -> Objective:
    """The phase's objective: on-policy SFT where the strategy asks for it, else the policy
    gradient with `adv_norm` (`rl.adv_norm`; default: the strategy's, else group)."""
    if strategy.objective == "sft":
        return OnPolicySFT()
    return PolicyGradient(settings, resolve_adv_norm(adv_norm, strategy))


def no_update() -> dict[str, float | None]:
    """The loss metrics of a step that trained nothing."""
    return dict.fromkeys(LOSS_METRICS, None) | {"loss": 0.0, "skipped": 0.0, "rows_trained": 0, "prompts_forwarded": 0}


def update(policy: Policy, optimizer: torch.optim.Optimizer, batch: RolloutBatch, plan: LossPlan, objective: Objective,
           settings: UpdateSettings, *, reference: torch.nn.Module | None = None, guard: NonFiniteGuard | None = None,
           where: str = "") -> dict[str, float | None]:
    """`settings.updates_per_batch` optimizer updates on the planned rollouts; returns loss metrics.

    With a `guard`, a step whose gradient norm or resulting weights are not finite is undone
    and counted (the guard stops the run after too many in a row); without one, a step with a
    non-finite gradient norm is skipped."""
    if not plan.rows:                         # nothing to learn from this batch
        return no_update()
    sequences = micro_batch_sequences(policy, batch, plan.rows, settings)
    old_logp = {}
    if objective.uses_old_logp:
        with torch.no_grad(), policy.autocast():
            old_logp = {key: response_logprobs(policy.model, seq, temperature=objective.temperature)[0]
                        for key, seq in sequences.items()}
    totals: dict[str, float] = {}
    grad_norms, skipped = [], 0
    for update_index in range(settings.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for key, seq in sequences.items():
            counts = accumulate(policy, seq, key, plan, objective, settings, old_logp.get(key), reference,
                                first=update_index == 0)
            for name, value in counts.items():
                totals[name] = max(totals.get(name, 0.0), value) if name == "gap_max" else totals.get(name, 0.0) + value
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), settings.grad_clip)
        if optimizer_step(optimizer, grad_norm, guard, where):
            grad_norms.append(grad_norm.item())
        else:                                         # a non-finite step is skipped and counted
            skipped += 1
    return loss_metrics(totals, grad_norms, skipped, settings, plan, sequences)


def micro_batch_sequences(policy: Policy, batch: RolloutBatch, rows: list[int], settings: UpdateSettings) -> dict[tuple, SequenceBatch]:
    """The planned rollouts as micro-batches of similar length (a prompt's rollouts together when
    the model can share its prompt), keyed by their rows."""
    model = policy.model
    share = settings.share_prompts and shares_prompts(model)   # a prompt's G rollouts: one forward of the prompt
    if share:
        groups = shared_micro_batches([tuple(batch.prompts[i]) for i in rows], [len(batch.responses[i]) for i in rows],
                                      settings.micro_batch_tokens)
    else:
        groups = micro_batches([len(batch.prompts[i]) + len(batch.responses[i]) for i in rows], settings.micro_batch_tokens)
    chunks = [[rows[j] for j in mb] for mb in groups]
    sampled = batch.rollout_logp
    return {tuple(c): SequenceBatch.build([batch.prompts[i] for i in c], [batch.responses[i] for i in c], policy.pad_id,
                                          model.device, rollout_logp=None if sampled is None else [sampled[i] for i in c],
                                          share_prompts=share)
            for c in chunks}


def accumulate(policy: Policy, seq: SequenceBatch, key: tuple, plan: LossPlan, objective: Objective, settings: UpdateSettings,
               old_logp: Tensor | None, reference: torch.nn.Module | None, first: bool) -> dict[str, float]:
    """Forward and backward one micro-batch (its gradient adds to the step's); its counts."""
    idx = torch.tensor(key)
    T = objective.temperature
    tick = time.perf_counter()
    with policy.autocast():
        logp, entropy = response_logprobs(policy.model, seq, with_entropy=True, temperature=T,     # [n, Tr]
                                          entropy_grad=settings.entropy_grad)
    counts = {"forward_time": time.perf_counter() - tick}
    if first and seq.rollout_logp is not None:        # the policy that sampled, as the trainer computes it
        total, worst, n = sampling_gap(logp if old_logp is None else old_logp, seq.rollout_logp, seq.mask)
        counts |= {"gap_sum": total, "gap_tokens": float(n), "gap_max": worst}
    ref_logp = None
    if reference is not None:
        with torch.no_grad(), policy.autocast():
            ref_logp = response_logprobs(reference, seq, temperature=T)[0]
    loss, terms = objective.loss(logp, entropy, seq, plan, idx, logp.detach() if old_logp is None else old_logp, ref_logp)
    loss.backward()
    return counts | terms | {"loss": loss.item(), "entropy_sum": float((entropy.detach() * seq.mask).sum()),
                             "tokens": float(seq.mask.sum())}


def optimizer_step(optimizer: torch.optim.Optimizer, grad_norm: Tensor, guard: NonFiniteGuard | None, where: str) -> bool:
    """Apply the accumulated gradient unless it (or, with a guard, the step's result) is not finite."""
    if guard is not None:
        return guard.step(grad_norm, where=where)
    if torch.isfinite(grad_norm):
        optimizer.step()
        return True
    optimizer.zero_grad(set_to_none=True)
    return False


def loss_metrics(totals: dict[str, float], grad_norms: list[float], skipped: int, settings: UpdateSettings, plan: LossPlan,
                 sequences: dict[tuple, SequenceBatch]) -> dict[str, float | None]:
    """The step's loss metrics line from the micro-batches' summed counts."""
    tokens = max(1.0, totals.get("tokens", 0.0))
    gap_tokens = totals.get("gap_tokens", 0.0)
    return {
        "loss": totals.get("loss", 0.0) / settings.updates_per_batch,
        "grad_norm": mean(grad_norms) if grad_norms else float("nan"),
        "entropy": totals.get("entropy_sum", 0.0) / tokens,
        "kl": totals.get("kl_sum", 0.0) / tokens,
        "clip_low_frac": totals.get("clip_low", 0.0) / tokens,
        "clip_high_frac": totals.get("clip_high", 0.0) / tokens,
        "skipped": float(skipped),
        "logprob_time": totals.get("forward_time", 0.0),
        "rows_trained": len(plan.rows),           # rollouts forwarded (those with zero advantage add nothing)
        "prompts_forwarded": sum(len(seq.prompt_ids) if seq.prompt_index is not None else len(seq.prompt_lens)
                                 for seq in sequences.values()),      # a shared prompt counts once per micro-batch
        "sampling_gap": totals["gap_sum"] / gap_tokens if gap_tokens else None,
        "sampling_gap_max": totals.get("gap_max") if gap_tokens else None,
        "is_truncated_frac": totals.get("is_truncated", 0.0) / tokens if settings.rollout_is else None,
    }
