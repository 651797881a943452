"""The sampling gap and its correction: the engine returns the log-prob of each token it drew,
under the distribution it drew from; the update measures |log π_rollout − log π_train| and, with
rl.rollout_is, weights each token by min(π_train / π_rollout, cap)."""

import copy
import math

import pytest
import torch

from taut.config import ConfigError, RLConfig, load_config
from taut.length import build_strategy
from taut.length.none import NoneConfig
from taut.rl.logprobs import SequenceBatch, response_logprobs
from taut.rl.losses import clipped_policy_loss
from taut.rl.objectives import build_objective, rollout_is_weights, update
from taut.rl.rollouts import RolloutBatch
from taut.rollout import SamplingParams
from taut.rollout.hf import HFEngine


def _generate(policy, params, fast=True, seed=0):
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id, fast=fast)
    prompts = [policy.encode_prompt(p) for p in ("add 4 7 + 5 8 = <think>", "sum 3 9 1 = <think>")]
    rollouts = engine.generate(prompts, 4, params, torch.Generator().manual_seed(seed))
    return prompts, rollouts


def _trainer_logprobs(policy, prompts, rollouts, T):
    seq = SequenceBatch.build([prompts[i] for i in rollouts.prompt_index], rollouts.tokens, policy.pad_id, "cpu",
                              rollout_logp=rollouts.logprobs)
    with torch.no_grad():
        logp, _ = response_logprobs(policy.model.eval(), seq, temperature=T)
    return seq, logp


@pytest.mark.parametrize("fast", [True, False])
def test_engine_logprobs_equal_the_trainers_in_fp32(tiny_policy, fast):
    T = 0.7
    prompts, rollouts = _generate(tiny_policy, SamplingParams(max_new_tokens=24, temperature=T, logprobs=True), fast=fast)
    assert [len(v) for v in rollouts.logprobs] == rollouts.lengths
    seq, logp = _trainer_logprobs(tiny_policy, prompts, rollouts, T)
    on = seq.mask > 0
    assert torch.isfinite(seq.rollout_logp[on]).all()
    gap = (seq.rollout_logp[on] - logp[on]).abs()
    assert gap.max() < 1e-4, f"engine and trainer disagree by {gap.max():.2e} in fp32"


def test_engine_logprobs_are_those_of_the_distribution_it_drew_from(tiny_policy):
    """Forbidding <eos> for the first tokens changes the sampling distribution: the engine's
    log-probs there are higher than the trainer's (the mass of <eos> is spread over the rest),
    and equal afterwards. This is a real sampling gap the correction exists for."""
    T, forced = 1.0, 6
    params = SamplingParams(max_new_tokens=12, temperature=T, min_new_tokens=forced, logprobs=True)
    prompts, rollouts = _generate(tiny_policy, params)
    seq, logp = _trainer_logprobs(tiny_policy, prompts, rollouts, T)
    early = seq.rollout_logp[:, :forced] - logp[:, :forced]
    assert (early > 0).all(), "renormalised without <eos>: every early token is more likely under the engine"
    with torch.no_grad():
        full = tiny_policy.model(input_ids=seq.input_ids).logits.float() / T
    eos_p = torch.stack([full[r, int(seq.prompt_lens[r]) - 1 + t].softmax(-1)[tiny_policy.eos_id]
                         for r in range(len(rollouts)) for t in range(forced)]).view(len(rollouts), forced)
    assert torch.allclose(early, -torch.log1p(-eos_p), atol=1e-4)            # log(1 / (1 − p_eos))
    late = seq.mask[:, forced:] > 0
    assert (seq.rollout_logp[:, forced:][late] - logp[:, forced:][late]).abs().max() < 1e-4


def test_no_logprobs_unless_asked_or_when_greedy(tiny_policy):
    _, plain = _generate(tiny_policy, SamplingParams(max_new_tokens=8, temperature=1.0))
    _, greedy = _generate(tiny_policy, SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=True))
    assert plain.logprobs is None and greedy.logprobs is None


def test_recording_logprobs_does_not_change_the_samples(tiny_policy):
    _, without = _generate(tiny_policy, SamplingParams(max_new_tokens=16, temperature=1.0), seed=3)
    _, with_lp = _generate(tiny_policy, SamplingParams(max_new_tokens=16, temperature=1.0, logprobs=True), seed=3)
    assert without.tokens == with_lp.tokens


def test_truncated_importance_weights():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    rollout = torch.tensor([[-1.5, -1.0, float("nan"), -4.0]])   # ratios e^0.5, e^-1, (no log-prob), e^1
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])                   # the last token is padding
    weights, truncated = rollout_is_weights(old, rollout, mask, cap=2.0)
    assert weights[0].tolist() == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0, 2.0])
    assert truncated == 0                                          # the capped token is padding
    weights, truncated = rollout_is_weights(old, rollout, torch.ones(1, 4), cap=1.5)
    assert weights[0].tolist() == pytest.approx([1.5, math.exp(-1.0), 1.0, 1.5]) and truncated == 2
    with pytest.raises(ValueError, match="log-probs"):
        rollout_is_weights(old, None, mask, cap=2.0)


def test_weights_scale_each_tokens_policy_gradient_term_only():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    w = torch.tensor([[2.0, 0.5, 1.0]])
    args = dict(advantages=torch.tensor([1.5]), mask=torch.ones(1, 3), weights=torch.tensor([1 / 3]), clip_low=0.2, clip_high=0.28)
    clipped_policy_loss(logp, logp.detach(), is_weights=w, **args).loss.backward()
    weighted = logp.grad.clone()
    logp.grad = None
    clipped_policy_loss(logp, logp.detach(), **args).loss.backward()
    assert torch.allclose(weighted, logp.grad * w)


def _batch(policy, shift):
    """Two groups of 4 with mixed rewards; the engine's log-probs are the trainer's minus `shift`."""
    g = torch.Generator().manual_seed(0)
    batch = RolloutBatch(rollout_logp=[])
    for text, rewards in (("add 4 7 + 5 8 = <think>", [1.0, 0.0, 1.0, 0.0]), ("sum 3 9 1 = <think>", [0.0, 0.0, 1.0, 0.5])):
        prompt = policy.encode_prompt(text)
        for _ in range(4):
            n = int(torch.randint(3, 20, (1,), generator=g))
            batch.prompts.append(prompt)
            batch.responses.append(torch.randint(4, len(policy.tokenizer), (n,), generator=g).tolist() + [policy.eos_id])
        batch.rewards.append(torch.tensor(rewards))
    seq = SequenceBatch.build(batch.prompts, batch.responses, policy.pad_id, "cpu")
    with torch.no_grad():
        logp, _ = response_logprobs(policy.model, seq)
    batch.rollout_logp = [(logp[i, : len(r)] - shift).tolist() for i, r in enumerate(batch.responses)]
    return batch


def _update(policy, batch, cfg):
    work = copy.copy(policy)
    work.model = copy.deepcopy(policy.model)
    optimizer = torch.optim.SGD(work.model.parameters(), lr=0.0)      # keeps the weights and .grad
    objective = build_objective(build_strategy(NoneConfig()), cfg.loss, cfg.adv_norm)
    plan = objective.plan(batch.reward_matrix(), batch.response_lengths(), 64)
    metrics = update(work, optimizer, batch, plan, objective, cfg.update)
    return metrics, [p.grad.clone() for p in work.model.parameters()]


def test_update_measures_the_gap_and_corrects_for_it(tiny_policy):
    no_clip = dict(grad_clip=1e9)
    plain, reference = _update(tiny_policy, _batch(tiny_policy, 0.0), RLConfig(**no_clip))
    assert plain["sampling_gap"] == pytest.approx(0.0, abs=1e-5) and plain["is_truncated_frac"] is None

    # π_train / π_rollout = e^0.5 on every token, under the cap: the gradient is e^0.5 times larger
    metrics, grads = _update(tiny_policy, _batch(tiny_policy, 0.5), RLConfig(rollout_is="token-truncate", **no_clip))
    assert metrics["sampling_gap"] == pytest.approx(0.5, abs=1e-4)
    assert metrics["sampling_gap_max"] == pytest.approx(0.5, abs=1e-4)
    assert metrics["is_truncated_frac"] == 0.0
    for a, b in zip(grads, reference):
        assert torch.allclose(a, b * math.exp(0.5), rtol=1e-4, atol=1e-7)

    # ratio e^1 above the cap 2: every weight is 2, every token counted as truncated
    metrics, grads = _update(tiny_policy, _batch(tiny_policy, 1.0), RLConfig(rollout_is="token-truncate", **no_clip))
    assert metrics["is_truncated_frac"] == 1.0
    for a, b in zip(grads, reference):
        assert torch.allclose(a, 2.0 * b, rtol=1e-4, atol=1e-7)

    # measuring alone leaves the gradient as it is
    metrics, grads = _update(tiny_policy, _batch(tiny_policy, 1.0), RLConfig(rollout_logprobs=True, **no_clip))
    assert metrics["sampling_gap"] == pytest.approx(1.0, abs=1e-4) and metrics["is_truncated_frac"] is None
    for a, b in zip(grads, reference):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


def test_config_switches():
    assert not RLConfig().records_rollout_logprobs
    assert RLConfig(rollout_logprobs=True).records_rollout_logprobs
    assert RLConfig(rollout_is="token-truncate").records_rollout_logprobs
    with pytest.raises(ConfigError, match="rollout_is"):
        load_config(None, ["rl.rollout_is=clip"])
    with pytest.raises(ConfigError, match="rollout_is_cap"):
        load_config(None, ["rl.rollout_is_cap=0.5"])


def test_bf16_rollouts_sample_as_bf16_mixed_generation_on_fp32_weights(tiny_policy):
    """rl.rollout_dtype=bf16: an fp32 policy generates with the arithmetic of bf16-mixed
    generation (the same tokens and log-probs, bit for bit), while the trainer's fp32 forward
    sees a sampling gap that fp32 generation does not have."""
    import dataclasses

    from taut.rollout import build_engine

    T = 1.0
    params = SamplingParams(max_new_tokens=24, temperature=T, logprobs=True)
    prompts = [tiny_policy.encode_prompt(p) for p in ("add 4 7 + 5 8 = <think>", "sum 3 9 1 = <think>")]

    def sample(engine):
        return engine.generate(prompts, 4, params, torch.Generator().manual_seed(0))

    mixed = dataclasses.replace(tiny_policy, compute_dtype=torch.bfloat16)
    bf16, reference = sample(build_engine("hf", tiny_policy, dtype="bf16")), sample(build_engine("hf", mixed))
    assert bf16.tokens == reference.tokens and bf16.logprobs == reference.logprobs
    assert not torch.is_autocast_enabled("cpu"), "the engine's autocast ends with the call"
    seq, logp = _trainer_logprobs(tiny_policy, prompts, bf16, T)
    on = seq.mask > 0
    gap = (seq.rollout_logp[on] - logp[on]).abs()
    assert 1e-4 < gap.max() < 0.5, f"bf16 generation against the fp32 forward: gap {gap.max():.2e}"
    fp32 = sample(build_engine("hf", tiny_policy, dtype="auto"))
    seq, logp = _trainer_logprobs(tiny_policy, prompts, fp32, T)
    assert (seq.rollout_logp[seq.mask > 0] - logp[seq.mask > 0]).abs().max() < 1e-4
    with pytest.raises(ValueError, match="rollout dtype"):
        build_engine("hf", tiny_policy, dtype="fp16")


def test_rollout_dtype_is_an_hf_engine_setting():
    assert RLConfig(rollout_dtype="bf16").rollout_dtype == "bf16"
    with pytest.raises(ValueError, match="rollout_dtype=bf16 applies to the hf engine"):
        RLConfig(rollout_dtype="bf16", engine="vllm")
