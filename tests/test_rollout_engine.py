"""taut's rollout engine against `model.generate`, and its bookkeeping of lengths and truncation."""

import pytest
import torch

from taut.rollout import SamplingParams
from taut.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def eos_prone(sft_policy):
    """A trained model: its greedy responses end at different lengths."""
    return sft_policy


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


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "hf-cache"])
def test_greedy_tokens_equal_model_generate(eos_prone, fast):
    policy = eos_prone
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id, fast=fast)
    got = engine.generate(ids, 1, SamplingParams(max_new_tokens=24, temperature=0))
    expected = _hf_greedy(policy, PROMPTS, 24)
    assert got.tokens == expected
    lengths = got.lengths
    assert len(set(lengths)) > 1, "the test needs rows that stop at different times"
    assert got.truncated == [t[-1] != policy.eos_id for t in expected]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "hf-cache"])
def test_group_rows_share_the_prefill_and_compaction_keeps_results(eos_prone, fast):
    policy = eos_prone
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    eager = HFEngine(policy.model, policy.eos_id, policy.pad_id, compact_fraction=0.0, fast=fast)   # compact at every finish
    never = HFEngine(policy.model, policy.eos_id, policy.pad_id, compact_fraction=2.0, fast=fast)   # never compact
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


def test_fast_path_samples_like_the_hf_path(tiny_policy):
    """Same random stream, same distribution: sampled tokens agree while no row has been dropped."""
    policy = tiny_policy
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=12, min_new_tokens=12)          # no row ends early
    a = HFEngine(policy.model, policy.eos_id, policy.pad_id, fast=True).generate(ids, 3, params, torch.Generator().manual_seed(5))
    b = HFEngine(policy.model, policy.eos_id, policy.pad_id, fast=False).generate(ids, 3, params, torch.Generator().manual_seed(5))
    assert a.tokens == b.tokens
    assert all(len(t) == 12 and policy.eos_id not in t for t in a.tokens)


def test_fast_path_on_a_grouped_query_qwen3_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=128, eos_token_id=2, pad_token_id=0)).eval()
    prompts = [[1, 5, 6, 7], [1, 9, 8], [1, 4, 4, 4, 4, 4]]
    params = SamplingParams(max_new_tokens=10, temperature=0)
    fast_rows = HFEngine(model, 2, 0, fast=True).generate(prompts, 2, params).tokens
    slow_rows = HFEngine(model, 2, 0, fast=False).generate(prompts, 2, params).tokens
    assert fast_rows == slow_rows


def test_fast_path_grows_its_cache_past_the_first_allocation(tiny_policy):
    policy = tiny_policy
    ids = [policy.encode_prompt(p) for p in PROMPTS[:3]]
    params = SamplingParams(max_new_tokens=150, min_new_tokens=150, temperature=0)    # > 64 + 64: two doublings
    a = HFEngine(policy.model, policy.eos_id, policy.pad_id, fast=True).generate(ids, 2, params)
    b = HFEngine(policy.model, policy.eos_id, policy.pad_id, fast=False).generate(ids, 2, params)
    assert a.tokens == b.tokens and all(len(t) == 150 for t in a.tokens)


def test_draw_samples_each_row_from_its_own_distribution():
    from taut.rollout.hf import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0],
                          [0.9, 0.0, 0.0, 0.0, 0.0, 0.1]])
    g = torch.Generator().manual_seed(0)
    draws = draw(probs.repeat(20000, 1), g).view(20000, 2)
    for row in range(2):
        freq = torch.bincount(draws[:, row], minlength=6).float() / 20000
        assert freq[probs[row] == 0].sum() == 0                     # never a token without mass
        assert freq.tolist() == pytest.approx(probs[row].tolist(), abs=0.015)


def _draw_one_level(probs, generator):
    """The definition the two-level draw implements: the first index whose cumulative sum over
    the whole row (float64) exceeds u × the row's total."""
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1).squeeze(-1)


@pytest.mark.parametrize("vocab", [37, 256, 1000, 49152])
def test_two_level_draw_picks_the_index_of_the_whole_row_cumulative_sum(vocab):
    """Same uniforms, same tokens as the one-level inverse transform (up to draws within float32
    rounding of a block's boundary: none here), on peaked and flat rows, with a vocabulary
    shorter than, equal to, not a multiple of and many times the block."""
    from taut.rollout.hf import draw

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(512, vocab, generator=g) * torch.tensor([0.5, 3.0, 12.0]).repeat(171)[:512, None]
    probs = torch.softmax(logits, dim=-1)
    probs[::7, vocab // 2:] = 0.0                                     # rows whose last blocks carry no mass
    got = draw(probs, torch.Generator().manual_seed(11))
    want = _draw_one_level(probs, torch.Generator().manual_seed(11))
    assert torch.equal(got, want)
    assert bool((probs.gather(-1, got[:, None]) > 0).all())


def test_draw_at_the_rows_total_falls_back_to_the_last_token_with_mass(monkeypatch):
    """A uniform draw that rounds up to the row's total would select past the last token with
    mass (here zeros follow it): the draw must still land on a token that has mass."""
    from taut.rollout.hf import draw

    probs = torch.tensor([[0.25, 0.75, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw.get("dtype")))
    assert draw(probs, None).tolist() == [1]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN (mkldnn) is not in this torch build")
def test_prepacked_bf16_products_give_the_plain_products_logits(eos_prone):
    """Under bf16 autocast on a CPU the fast path multiplies by weights reordered once for oneDNN;
    its logits must equal, bit for bit, those of the same path with autocast's plain products,
    at the full batch and after rows are dropped (other row counts than the reorder's hint)."""
    from taut.rollout import fast

    policy = eos_prone
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    width = max(map(len, ids))
    tokens = torch.full((len(ids), width), policy.pad_id)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        tokens[i, width - len(row):], mask[i, width - len(row):] = torch.tensor(row), 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed, plain = fast.FastDecoder(policy.model), fast.FastDecoder(policy.model, pack=False)
        assert packed.packed and not plain.packed
        logits = [d.prefill(tokens, mask, position, 8) for d in (packed, plain)]
        for d in (packed, plain):
            d.repeat(3)
        nxt, pos = logits[0].argmax(-1).repeat_interleave(3), mask.sum(-1).repeat_interleave(3)
        for t in range(6):
            if t == 3:                                   # drop rows: 9 of 18 left
                keep = torch.arange(0, 18, 2)[:-2].tolist() + [1, 3]
                for d in (packed, plain):
                    d.select(torch.tensor(keep))
                nxt, pos = nxt[keep], pos[keep]
            a, b = packed.step(nxt, pos), plain.step(nxt, pos)
            assert a.dtype == torch.bfloat16 and torch.equal(a, b)
            nxt, pos = a.argmax(-1), pos + 1


def test_fast_path_folds_lora_adapters_into_its_weights(eos_prone):
    """A peft model with LoRA adapters takes the fast path with scale·B·A folded into each adapted
    weight: in fp32 its greedy tokens equal the generic path's, where the adapters run as their
    own products. The adapters do change the tokens (B is drawn at random: peft starts it at zero)."""
    import copy

    from peft import LoraConfig, get_peft_model

    from taut.rollout import fast

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(copy.deepcopy(eos_prone.model), LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                                       task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    assert fast.supports(model)
    policy = eos_prone
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, temperature=0)
    rows = {f: HFEngine(model, policy.eos_id, policy.pad_id, fast=f).generate(ids, 2, params).tokens for f in (True, False)}
    assert rows[True] == rows[False]
    with model.disable_adapter():
        assert not fast.supports(model)                 # disabled adapters: the generic path
        base = HFEngine(model, policy.eos_id, policy.pad_id, fast=False).generate(ids, 2, params).tokens
    assert base != rows[False]


@pytest.mark.parametrize("temperature,top_p", [(0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_bf16_logits_sample_as_their_exact_fp32_widening(temperature, top_p):
    """`sample` widens bf16 logits before argmax and softmax (faster kernels): the tokens and
    log-probs are those of the same values in fp32, ties at the top included (first index)."""
    from taut.rollout.hf import sample

    logits = (torch.randn(64, 3000, generator=torch.Generator().manual_seed(5)) * 4).bfloat16()
    logits[3, [10, 20]] = logits[3].max() + 1                         # a tie at the top: the first index wins
    params = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p)
    low = sample(logits, params, torch.Generator().manual_seed(1), with_logprobs=True)
    wide = sample(logits.float(), params, torch.Generator().manual_seed(1), with_logprobs=True)
    assert torch.equal(low[0], wide[0]) and (low[1] is None or torch.equal(low[1], wide[1]))
    if temperature == 0:
        assert low[0][3] == 10
