"""Speed-ups keep results: micro-batching and skipping zero-advantage rows leave the gradient unchanged."""

import copy

import torch

from taut.config import RLConfig
from taut.length import build_strategy
from taut.length.none import NoneConfig
from taut.rl.advantages import group_advantages
from taut.rl.logprobs import SequenceBatch, response_logprobs
from taut.rl.losses import aggregation_weights, clipped_policy_loss
from taut.rl.objectives import build_objective, update
from taut.rl.rollouts import RolloutBatch


def _batch(policy):
    """Two groups of 4 with unequal rewards and one all-correct group (zero advantages)."""
    g = torch.Generator().manual_seed(0)
    prompts = [policy.encode_prompt(p) for p in ("add 4 7 + 5 8 = <think>", "sum 3 9 1 = <think>", "mul 4 7 * 6 = <think>")]
    batch = RolloutBatch()
    for p, rewards in zip(prompts, ([1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.5], [1.0, 1.0, 1.0, 1.0])):
        for _ in range(4):
            n = int(torch.randint(3, 30, (1,), generator=g))
            response = torch.randint(4, len(policy.tokenizer), (n,), generator=g).tolist() + [policy.eos_id]
            batch.prompts.append(p)
            batch.responses.append(response)
        batch.rewards.append(torch.tensor(rewards))
    return batch


def _reference_grads(policy, batch, cfg):
    """One forward over every row, zero-advantage ones included, token-mean over all tokens."""
    model = copy.deepcopy(policy.model)
    adv = group_advantages(torch.stack(batch.rewards), "group").flatten()
    seq = SequenceBatch.build(batch.prompts, batch.responses, policy.pad_id, "cpu")
    logp, _ = response_logprobs(model, seq)
    weights = aggregation_weights(seq.response_lens, "token-mean")
    terms = clipped_policy_loss(logp, logp.detach(), adv, seq.mask, weights, clip_low=cfg.clip_low, clip_high=cfg.clip_high)
    terms.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    return [p.grad.clone() for p in model.parameters()]


def _grads_after_update(policy, batch, cfg):
    model_policy = copy.copy(policy)
    model_policy.model = copy.deepcopy(policy.model)
    optimizer = torch.optim.SGD(model_policy.model.parameters(), lr=0.0)      # leaves the weights, keeps .grad
    objective = build_objective(build_strategy(NoneConfig()), cfg.loss, cfg.adv_norm)
    update(model_policy, optimizer, batch, objective.plan(batch.reward_matrix(), batch.response_lengths(), 64), objective,
           cfg.update)
    return [p.grad.clone() for p in model_policy.model.parameters()]


def test_micro_batching_and_row_skipping_keep_the_gradient(tiny_policy):
    batch = _batch(tiny_policy)
    reference = _reference_grads(tiny_policy, batch, RLConfig())
    for budget in (100000, 256, 64):               # one micro-batch, a few, one row each
        got = _grads_after_update(tiny_policy, batch, RLConfig(micro_batch_tokens=budget))
        for a, b in zip(got, reference):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), budget


def test_shared_prompts_keep_the_gradient(tiny_policy):
    """A model whose vocabulary is wider than its hidden state (as every real model's is) takes the
    shared-prompt forward (rl.share_prompts): each prompt once per micro-batch, same gradient."""
    from taut.rl.logprobs import shares_prompts

    from wide import wide_llama

    wide = copy.copy(tiny_policy)
    wide.model = wide_llama(pad_id=tiny_policy.pad_id).train()
    assert shares_prompts(wide.model)
    batch = _batch(tiny_policy)
    reference = _reference_grads(wide, batch, RLConfig())
    for budget in (100000, 256, 64):
        for share in (True, False):
            got = _grads_after_update(wide, batch, RLConfig(micro_batch_tokens=budget, share_prompts=share))
            for a, b in zip(got, reference):
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), (budget, share)
