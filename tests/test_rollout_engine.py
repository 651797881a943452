"""taut's rollout engine against `model.generate`, and its bookkeeping of lengths and truncation."""

import copy

import pytest
import torch

from taut.rollout import SamplingParams
from taut.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def eos_prone(tiny_policy):
    """The tiny random model with a boosted <eos> embedding, so greedy rows stop at different times."""
    policy = copy.deepcopy(tiny_policy)
    with torch.no_grad():
        emb = policy.model.get_input_embeddings().weight
        emb[policy.eos_id] = emb[policy.eos_id] * 2.5 + 0.3 * emb[5]
    return policy


PROMPTS = ["add 4 + 5 = <think>", "sum 3 9 1 = <think>", "parity 1 0 1 1 = <think>", "mod 4 7 1 % 7 = <think>",
           "mul 4 7 * 6 = <think>", "chain 3 + 5 * 2 - 4 = <think>"]


def _hf_greedy(policy, prompts, max_new):
    tok = policy.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = policy.model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=policy.pad_id,
                                eos_token_id=policy.eos_id)
    rows = []
    for row in out[:, enc.input_ids.shape[1]:].tolist():
        rows.append(row[: row.index(policy.eos_id) + 1] if policy.eos_id in row else row)
    return rows


def test_greedy_tokens_equal_model_generate(eos_prone):
    policy = eos_prone
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id)
    got = engine.generate(ids, 1, SamplingParams(max_new_tokens=24, temperature=0))
    expected = _hf_greedy(policy, PROMPTS, 24)
    assert got.tokens == expected
    lengths = got.lengths
    assert len(set(lengths)) > 1, "the test needs rows that stop at different times"
    assert got.truncated == [t[-1] != policy.eos_id for t in expected]


def test_group_rows_share_the_prefill_and_compaction_keeps_results(eos_prone):
    policy = eos_prone
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    eager = HFEngine(policy.model, policy.eos_id, policy.pad_id, compact_fraction=0.0)    # compact at every finish
    never = HFEngine(policy.model, policy.eos_id, policy.pad_id, compact_fraction=2.0)    # never compact
    a = eager.generate(ids, 3, params)
    b = never.generate(ids, 3, params)
    assert a.tokens == b.tokens
    assert a.prompt_index == [i // 3 for i in range(len(PROMPTS) * 3)]
    for p in range(len(PROMPTS)):        # greedy: the three rows of a group are identical
        assert a.tokens[3 * p] == a.tokens[3 * p + 1] == a.tokens[3 * p + 2]


def test_sampling_is_reproducible_and_respects_the_cap(tiny_policy):
    policy = tiny_policy
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    a = engine.generate(ids, 4, params, torch.Generator().manual_seed(3))
    b = engine.generate(ids, 4, params, torch.Generator().manual_seed(3))
    assert a.tokens == b.tokens
    assert all(1 <= n <= 10 for n in a.lengths)
    for tokens, truncated in zip(a.tokens, a.truncated):
        assert truncated == (tokens[-1] != policy.eos_id)
        assert truncated == (len(tokens) == 10 and policy.eos_id not in tokens)


def test_response_prefix_and_banned_first_token(tiny_policy):
    policy = tiny_policy
    end_think = policy.tokenizer.convert_tokens_to_ids("</think>")
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id)
    forced = engine.generate(ids, 2, SamplingParams(max_new_tokens=5), torch.Generator().manual_seed(0), response_prefix=[end_think])
    assert all(t[0] == end_think for t in forced.tokens)
    banned = engine.generate(ids, 8, SamplingParams(max_new_tokens=2), torch.Generator().manual_seed(0), ban_first=[end_think])
    assert all(t[0] != end_think for t in banned.tokens)


def test_chunking_over_max_rows_keeps_prompt_order(tiny_policy):
    policy = tiny_policy
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    small = HFEngine(policy.model, policy.eos_id, policy.pad_id, max_rows=4)
    big = HFEngine(policy.model, policy.eos_id, policy.pad_id)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    assert small.generate(ids, 2, params).tokens == big.generate(ids, 2, params).tokens
