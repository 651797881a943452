"""Exact values of advantages, the clipped loss and its aggregation; loops against the vectorised code."""

import math

import pytest
import torch

from taut.rl.advantages import group_advantages
from taut.rl.losses import aggregation_weights, clipped_policy_loss, sft_loss


def test_group_advantages_exact():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv = group_advantages(rewards, "group")
    # mean 0.5, population std 0.5 -> ±1 (up to eps); the all-equal group gets zeros
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(adv[1], torch.zeros(4))
    assert torch.allclose(group_advantages(rewards, "none")[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    batch_std = rewards.std(unbiased=False)
    assert torch.allclose(group_advantages(rewards, "batch")[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (batch_std + 1e-6))


def test_group_advantages_match_a_loop():
    torch.manual_seed(0)
    rewards = torch.rand(5, 7)
    adv = group_advantages(rewards, "group")
    for p in range(5):
        r = rewards[p].tolist()
        m = sum(r) / len(r)
        s = math.sqrt(sum((x - m) ** 2 for x in r) / len(r))
        for g in range(7):
            assert adv[p, g].item() == pytest.approx((r[g] - m) / (s + 1e-6), rel=1e-5)


def test_aggregation_weights_exact():
    lengths = torch.tensor([2, 4])
    assert torch.allclose(aggregation_weights(lengths, "token-mean"), torch.tensor([1 / 6, 1 / 6]))
    assert torch.allclose(aggregation_weights(lengths, "seq-mean-token-mean"), torch.tensor([1 / 4, 1 / 8]))
    assert torch.allclose(aggregation_weights(lengths, "seq-mean-token-sum"), torch.tensor([0.5, 0.5]))
    assert torch.allclose(aggregation_weights(lengths, "seq-mean-token-sum-norm", norm_length=10), torch.tensor([0.05, 0.05]))


def _terms(logp, old, adv, mask, **kw):
    weights = aggregation_weights(mask.sum(1), "token-mean")
    return clipped_policy_loss(logp, old, adv, mask, weights, clip_low=0.2, clip_high=0.28, **kw)


def test_clipped_loss_exact_values_both_sides():
    old = torch.zeros(4, 1)
    # ratios 1.5 (A>0: clipped at 1.28), 0.5 (A<0: clipped at 0.8), 1.5 (A<0: unclipped), 0.5 (A>0: unclipped)
    logp = torch.log(torch.tensor([[1.5], [0.5], [1.5], [0.5]]))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    mask = torch.ones(4, 1)
    t = _terms(logp, old, adv, mask)
    per_token = [-1.28, 0.8, 1.5, -0.5]            # -min(ρA, clip(ρ)A)
    assert t.loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-6)
    assert t.clipped_high[:, 0].tolist() == [True, False, False, False]
    assert t.clipped_low[:, 0].tolist() == [False, True, False, False]


def test_clip_high_is_decoupled_from_clip_low():
    logp = torch.log(torch.tensor([[1.25]]))      # inside 1 + 0.28, outside 1 + 0.2
    t = clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), torch.ones(1),
                            clip_low=0.2, clip_high=0.28)
    assert t.loss.item() == pytest.approx(-1.25)
    assert not t.clipped_high.any()


def test_mask_removes_padding_and_gradient_flows_to_eos():
    # row: two response tokens, the second is the real <eos>; the third column is padding
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    t = clipped_policy_loss(logp, logp.detach(), torch.tensor([2.0]), mask, aggregation_weights(mask.sum(1), "token-mean"),
                            clip_low=0.2, clip_high=0.28)
    t.loss.backward()
    # d/dlogp of -(ratio * A) at ratio 1 is -A per token, times the token-mean weight 1/2
    assert logp.grad.tolist() == [[-1.0, -1.0, 0.0]]
    assert t.loss.item() == pytest.approx(-2.0)


def test_kl_and_entropy_terms():
    logp = torch.tensor([[-1.0]])
    ref = torch.tensor([[-2.0]])
    t = clipped_policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), torch.ones(1), clip_low=0.2, clip_high=0.28,
                            ref_logp=ref, kl_coef=0.5, entropy=torch.tensor([[0.3]]), entropy_coef=0.1)
    k3 = math.exp(-1.0) + 1.0 - 1
    assert t.kl.item() == pytest.approx(k3)
    assert t.loss.item() == pytest.approx(0.5 * k3 - 0.1 * 0.3, rel=1e-6)


def test_vectorised_loss_matches_a_loop_reference():
    torch.manual_seed(1)
    n, T = 6, 9
    lengths = torch.randint(1, T + 1, (n,))
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    logp = -torch.rand(n, T) * 3
    old = logp + 0.4 * torch.randn(n, T)
    adv = torch.randn(n)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        w = aggregation_weights(lengths, mode, norm_length=T)
        got = clipped_policy_loss(logp, old, adv, mask, w, clip_low=0.2, clip_high=0.28).loss.item()
        expected, total_tokens = 0.0, int(lengths.sum())
        for i in range(n):
            for t in range(int(lengths[i])):
                rho = math.exp(logp[i, t] - old[i, t])
                term = -min(rho * adv[i].item(), min(max(rho, 0.8), 1.28) * adv[i].item())
                scale = {"token-mean": 1 / total_tokens, "seq-mean-token-mean": 1 / (n * int(lengths[i])),
                         "seq-mean-token-sum": 1 / n, "seq-mean-token-sum-norm": 1 / (n * T)}[mode]
                expected += scale * term
        assert got == pytest.approx(expected, rel=1e-5), mode


def test_sft_loss_is_masked_token_mean_nll():
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert sft_loss(logp, mask, aggregation_weights(mask.sum(1), "token-mean")).item() == pytest.approx(2.0)
