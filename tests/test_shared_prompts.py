"""A prompt forwarded once for all its rollouts: the same log-probs, entropies and gradients as
one forward per row (rl.share_prompts)."""

import random

import pytest
import torch

from taut.rl.logprobs import SequenceBatch, pack_responses, response_logprobs, shared_micro_batches, shares_prompts

from wide import assert_same_gradients, weighted_gradients
from wide import wide_llama as _wide_llama


def _groups(seed=0, prompts=3, group=4):
    """Rows in groups of one prompt each (prompts of different lengths), responses of different
    lengths, one of them empty; rows of a group not adjacent."""
    rng = random.Random(seed)
    distinct = [[rng.randrange(1, 300) for _ in range(rng.randint(3, 15))] for _ in range(prompts)]
    rows = [(distinct[g], [rng.randrange(1, 300) for _ in range(rng.randint(1, 20))]) for _ in range(group) for g in range(prompts)]
    rows[4] = (rows[4][0], [])
    return [p for p, _ in rows], [r for _, r in rows]


def _both(model, prompts, responses, **kw):
    out = []
    for share in (False, True):
        seq = SequenceBatch.build(prompts, responses, 0, "cpu", share_prompts=share)
        out.append((seq, *response_logprobs(model, seq, **kw)))
    return out


def test_a_batch_built_to_share_holds_each_prompt_once():
    prompts, responses = _groups()
    seq = SequenceBatch.build(prompts, responses, 0, "cpu", share_prompts=True)
    assert seq.prompt_ids.shape[0] == 3
    for i, p in enumerate(prompts):
        assert seq.prompt_ids[seq.prompt_index[i], : len(p)].tolist() == p
    assert SequenceBatch.build(prompts, responses, 0, "cpu").prompt_index is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompts_give_each_rows_log_probs_and_entropy(temperature):
    model = _wide_llama().eval()
    assert shares_prompts(model)
    prompts, responses = _groups()
    (seq, logp, ent), (_, shared_logp, shared_ent) = _both(model, prompts, responses, with_entropy=True, temperature=temperature)
    mask = seq.mask.bool()
    torch.testing.assert_close(shared_logp[mask], logp[mask], rtol=0, atol=2e-5)
    torch.testing.assert_close(shared_ent[mask], ent[mask], rtol=0, atol=2e-5)
    assert not shared_logp[~mask].any()


def test_shared_prompts_give_the_same_gradients():
    grads = []
    prompts, responses = _groups(seed=1)
    for share in (False, True):
        model = _wide_llama(seed=1)
        seq = SequenceBatch.build(prompts, responses, 0, "cpu", share_prompts=share)
        grads.append(weighted_gradients(model, response_logprobs(model, seq)[0]))
    assert_same_gradients(grads[1], grads[0])


def test_through_a_lora_wrapper():
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_wide_llama(seed=2), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.nn.init.normal_(model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight)
    assert shares_prompts(model)
    prompts, responses = _groups(seed=2)
    (seq, logp, _), (_, shared, _) = _both(model, prompts, responses)
    torch.testing.assert_close(shared[seq.mask.bool()], logp[seq.mask.bool()], rtol=0, atol=2e-5)


def test_sliding_window_models_forward_each_row():
    from transformers import MistralConfig, MistralForCausalLM

    def mistral(window):
        return MistralForCausalLM(MistralConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                                                attn_implementation="sdpa"))

    assert not shares_prompts(mistral(16)) and shares_prompts(mistral(None))


def test_other_attention_kernels_forward_each_row():
    model = _wide_llama(attn="eager").eval()
    assert not shares_prompts(model)
    prompts, responses = _groups(seed=3)
    (seq, logp, _), (_, shared, _) = _both(model, prompts, responses)
    torch.testing.assert_close(shared, logp, rtol=0, atol=0)           # the per-row path, untouched


def _packed_cost(prompts, lengths, group):
    width = max(max(lengths[i] for i in group), 1)
    rows, _ = pack_responses([prompts[i] for i in group], [lengths[i] for i in group], width)
    return len({prompts[i] for i in group}) * max(len(prompts[i]) for i in group) + len(rows) * width


def test_shared_micro_batches_cover_every_row_within_the_budget():
    rng = random.Random(0)
    distinct = [tuple(range(rng.randint(20, 60))) for _ in range(6)]
    prompts = [distinct[i % 6] for i in range(48)]
    lengths = [rng.randint(0, 90) for _ in prompts]
    for budget in (300, 600, 2000):
        groups = shared_micro_batches(prompts, lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(48))
        for g in groups:
            assert _packed_cost(prompts, lengths, g) <= budget or len(g) == 1
        # a prompt's rows stay together: each prompt forwarded about once
        assert sum(len({prompts[i] for i in g}) for g in groups) <= 6 + len(groups) - 1
    forced = shared_micro_batches(prompts, [64] * 48, 1200)
    assert sum(len({prompts[i] for i in g}) for g in forced) <= 6 + len(forced) - 1


def test_shared_micro_batches_are_even():
    """4 prompts x 8 forced rollouts over a budget a little short of all of them: two halves of
    two prompts each, not 28 rows and a remnant of 4 that forwards a prompt again."""
    prompts = [tuple(range(60))] * 8 + [tuple(range(1, 61))] * 8 + [tuple(range(2, 62))] * 8 + [tuple(range(3, 63))] * 8
    groups = shared_micro_batches(prompts, [64] * 32, 2048)
    assert sorted(len(g) for g in groups) == [16, 16]
    assert [len({prompts[i] for i in g}) for g in groups] == [2, 2]
    assert shared_micro_batches(prompts, [64] * 32, 4096) == [list(range(32))]


def test_packing_lays_a_prompts_responses_end_to_end_in_rows_of_its_own():
    rng = random.Random(4)
    prompt_of = [rng.randrange(3) for _ in range(40)]
    lengths = [rng.randint(0, 30) for _ in prompt_of]
    rows, place = pack_responses(prompt_of, lengths, 30)
    taken = set()
    for i, (b, start) in enumerate(place):
        if lengths[i] == 0:
            assert b == -1
            continue
        assert rows[b] == prompt_of[i] and start + lengths[i] <= 30
        slots = {(b, start + t) for t in range(lengths[i])}
        assert not slots & taken
        taken |= slots
    # first fit, longest first: no two rows of one prompt could have been one row
    used = [sum(lengths[i] for i, (b, _) in enumerate(place) if b == r) for r in range(len(rows))]
    for a in range(len(rows)):
        for b in range(a + 1, len(rows)):
            assert rows[a] != rows[b] or used[a] + used[b] > 30
    assert len(rows) < sum(n > 0 for n in lengths)


def test_shared_prompts_forward_the_responses_packed():
    """Rollouts of different lengths go through the decoder in fewer rows than there are
    rollouts: as many as `pack_responses` lays them in."""
    model = _wide_llama(seed=5).eval()
    prompts, responses = _groups(seed=5, prompts=2, group=8)
    seen = []
    model.model.register_forward_hook(lambda module, args, kwargs, out: seen.append(kwargs["input_ids"].shape), with_kwargs=True)
    seq = SequenceBatch.build(prompts, responses, 0, "cpu", share_prompts=True)
    response_logprobs(model, seq)
    (prompt_rows, _), (rows, width) = seen
    assert prompt_rows == 2 and width == max(len(r) for r in responses)
    assert rows == len(pack_responses(seq.prompt_index.tolist(), [len(r) for r in responses], width)[0])
    assert rows <= 0.75 * len(responses)


def test_a_micro_batch_of_empty_responses_forwards_no_packed_rows():
    model = _wide_llama(seed=6)
    seq = SequenceBatch.build([[5, 6, 7], [5, 6, 7], [8, 9]], [[], [], []], 0, "cpu", share_prompts=True)
    logp, entropy = response_logprobs(model, seq, with_entropy=True)
    assert logp.shape == (3, 1) and not logp.any() and not entropy.any()
    logp.sum().backward()                     # connected to the graph, nothing to add
