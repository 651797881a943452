"""The decode path's bf16 contract (taut.rollout.contract): logits within the stated tolerance of
the model's forward at every step, greedy tokens equal to Hugging Face's up to the first near tie;
and a path that breaks it (a perturbed attention) is caught."""

import pytest
import torch

from taut.rollout import fast
from taut.rollout.contract import TOLERANCE_ULPS, bf16_units, check
from taut.rollout.hf import _HFCache
from taut.rollout.native import reason as native_reason

# Each prompt starts its thinking, so the first tokens are not a coin toss between thinking and
# answering (a near tie, after which tokens are not compared) and the token check has teeth.
PROMPTS = ["sum 3 9 1 4 = <think> 3", "chain 3 + 5 * 2 - 4 = <think> 3", "add 47 + 58 = <think> 7", "mul 47 * 6 = <think> 7",
           "sum 2 8 5 = <think> 2", "add 36 + 27 = <think> 6"]


@pytest.fixture(scope="module")
def bf16_policy():
    from taut.config import ModelConfig
    from taut.models.loading import load_policy

    return load_policy(ModelConfig(path="builtin:testbed-sft", dtype="bf16-mixed", threads=1))


def _fast(policy, native=True, cls=fast.FastDecoder):
    """The fast path as the engine builds it: under the policy's autocast (bf16 products on
    prepacked weights, and taut's compiled attention kernel when `native` and it can be had)."""
    with policy.autocast():
        decoder = cls(policy.model, native=native)
    if native:
        assert decoder.native is not None, native_reason()
    return decoder


def _check(policy, cache, steps=24):
    prompts = [policy.encode_prompt(p) for p in PROMPTS]
    return check(policy.model, cache, prompts, policy.pad_id, steps, autocast=policy.autocast)


def test_a_bf16_unit_is_the_spacing_at_the_rows_largest_logit():
    reference = torch.tensor([[20.0, -3.0, 0.5], [1.5, 0.1, -0.2]])
    assert bf16_units(torch.full((2, 3), 0.125), reference)[0, 0] == 1.0         # 2^(4-7) at |20|
    assert bf16_units(torch.full((2, 3), 0.125), reference)[1, 0] == 16.0        # 2^(0-7) at |1.5|


@pytest.mark.parametrize("path", ["fast", "fast-sdpa", "generic"])
def test_the_decode_paths_keep_the_contract_under_bf16(bf16_policy, path):
    cache = _HFCache(bf16_policy.model) if path == "generic" else _fast(bf16_policy, native=path == "fast")
    result = _check(bf16_policy, cache)
    assert result.holds, (result.max_ulps, result.near_tie_step)
    assert result.max_ulps <= TOLERANCE_ULPS and result.deviation_ulps.shape == (24,)


@pytest.mark.parametrize("native", [True, False], ids=["kernel", "sdpa"])
@pytest.mark.parametrize("fault", ["attention scale 25 % off", "rotary position off by one"])
def test_a_faulty_decode_path_breaks_the_contract(bf16_policy, fault, native):
    class Shifted(fast.FastDecoder):
        def _rotary(self, position, dtype):
            return super()._rotary(position + 1, dtype)

    if fault.startswith("attention"):
        decoder = _fast(bf16_policy, native)
        decoder.scaling *= 1.25
    else:
        decoder = _fast(bf16_policy, native, cls=Shifted)
    result = _check(bf16_policy, decoder)
    assert not result.holds and result.max_ulps > 4 * TOLERANCE_ULPS and not result.tokens_agree


def test_the_token_check_is_not_vacuous(bf16_policy):
    result = _check(bf16_policy, _fast(bf16_policy))
    assert sum(step is None for step in result.near_tie_step) >= len(PROMPTS) // 2      # most rows: no near tie in 24 steps


def test_a_path_that_swaps_rows_breaks_the_contract(bf16_policy, monkeypatch):
    """Logits that are each a valid row's but in the wrong rows: caught by the bound and the tokens."""
    decoder = _fast(bf16_policy)
    real = decoder.prefill
    monkeypatch.setattr(decoder, "prefill", lambda ids, mask, position, max_new: real(ids, mask, position, max_new).flip(0))
    assert not _check(bf16_policy, decoder).holds


def test_a_prompt_shared_by_its_rows_decodes_bit_for_bit_as_one_copied_to_each_row(bf16_policy):
    """The kernel's shared prompt buffers (one per prompt, its n rows reading it) against one buffer
    per row holding a copy: the same logits at every step, through the repeat, the growth of the
    buffers past 64 columns and the dropping of rows."""
    from taut.rollout.hf import left_padded

    prompts = [bf16_policy.encode_prompt(p) for p in PROMPTS[:3]]
    ids, mask = left_padded(prompts, bf16_policy.pad_id, bf16_policy.model.device)
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    runs = []
    for share in (True, False):
        with bf16_policy.autocast():
            decoder = fast.FastDecoder(bf16_policy.model, share_prompts=share)
        assert decoder.native is not None, native_reason()
        with bf16_policy.autocast():
            logits = [decoder.prefill(ids, mask, position, 80)]
            decoder.repeat(4)
            logits[0] = logits[0].repeat_interleave(4, dim=0)
            nxt, pos = logits[0].argmax(-1), mask.sum(-1).repeat_interleave(4)
            for t in range(70):                              # past the first 64 columns: the buffers grow
                if t == 30:                                  # rows 1, 5 and 10 finished: dropped
                    keep = torch.tensor([i for i in range(nxt.numel()) if i not in (1, 5, 10)])
                    decoder.select(keep)
                    nxt, pos = nxt[keep], pos[keep]
                logits.append(decoder.step(nxt, pos))
                nxt, pos = logits[-1].argmax(-1), pos + 1
        runs.append((decoder.shared, logits))
    (shared, a), (copied, b) = runs
    assert shared and not copied
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b) == 71
