"""`dler`: DLER, "Doing Length pEnalty Right" (Liu et al., arXiv 2510.15110).

DLER's length penalty is plain truncation. The method's contribution is the optimisation
around it: batch-wise reward normalisation, a higher upper clip and dynamic sampling. With L the
truncation length (the rollout cap), per prompt group:

    r_i = 1[correct_i] · 1[not truncated_i]            a rollout that reaches L without <eos> scores 0
    c_i = r_i − mean_{j ∈ group} r_j                   group baseline
    A_i = c_i / (std over the whole batch of c + ε)    batch-wise normalisation

The advantage is REINFORCE++-baseline's (arXiv 2501.03262). The strategy declares it as
advantage normalisation `batch-centred`, and `rl.adv_norm` can override it with a warning. The
other two parts are trainer settings that the recipe sets: `rl.clip_high: 0.28` (it acts only
with `rl.updates_per_batch > 1`) and `rl.dynamic_sampling: true`, which drops groups whose rewards
are all equal and samples again.

Where each part was read. The recipe (truncation, batch-wise normalisation, higher clipping,
dynamic sampling) comes from the abstract of arXiv 2510.15110 and the project page
https://nvlabs.github.io/DLER. The formula and settings come from the official code,
github.com/NVlabs/DLER: `verl-dler/dler_slurm.sh` sets `adv_estimator=reinforce_plus_plus_baseline`,
`clip_ratio_high=0.28`, `filter_groups.enable=True`, `max_response_length=4000` and 16 rollouts per
prompt, and `verl-dler/verl/trainer/ppo/core_algos.py`
(`compute_reinforce_plus_plus_baseline_outcome_advantage`) subtracts the group mean and then
whitens over the batch. The method section of the paper was not available to us, so no section
or equation number is given here.

Our reading and departures:
- Batch statistics are taken per rollout. The official code whitens per token instead: each
  rollout is weighted by its length, Bessel's correction is applied, and the token-weighted mean
  is subtracted again. Per rollout, the batch mean of c is exactly 0. Groups whose rewards are all
  equal count in the std, as in the code. They keep zero advantage, whereas the code's re-centring
  moves them slightly off zero.
- The released script has three settings that the abstract does not name:
  - `stop_properly_penalty.penalty_coef=0.1` multiplies the reward of a rollout that did not
    stop by 0.1. It is available here as `truncated_scale`, default 0 (plain truncation).
  - `correct_sample_advantage_boost_value=0.1` adds 0.1 to the advantage of every correct
    rollout. It is not implemented: it is an advantage term, not a reward.
  - A k3 KL loss with coefficient 0.0005. The recipe leaves `rl.kl_coef` at 0.
- L is the rollout cap: `max_length` if set, else `rl.max_new_tokens`. In the script, too, the
  truncation length is the generation limit.
- Difficulty-aware DLER (a tighter L on easy prompts) and update-selective merging are not
  implemented.

Metrics: penalised_frac and penalty_mean, as for the other capping strategies.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from taut.length.base import GroupBatch, Shaped, Strategy, correctness, penalty_metrics
from taut.schema import Strict


class DlerConfig(Strict):
    name: Literal["dler"] = "dler"
    max_length: int | None = Field(None, gt=0, description="truncation length L, the rollout cap (tokens); default: rl.max_new_tokens")
    truncated_scale: float = Field(
        0.0, ge=0, le=1, description="reward factor of a rollout that hit L: 0 is plain truncation (the paper); "
                                     "the released script uses 0.1")


class Dler(Strategy):
    name = "dler"
    adv_norm = "batch-centred"

    def __init__(self, config: DlerConfig):
        self.config = config

    def cap(self, step: int, default: int) -> int:
        return default if self.config.max_length is None else self.config.max_length

    def shape(self, batch: GroupBatch) -> Shaped:
        base = correctness(batch)
        scale = 1.0 - (1.0 - self.config.truncated_scale) * batch.truncated.float()                # [P, G]
        rewards = base * scale
        return Shaped(rewards, penalty_metrics(base, rewards))
