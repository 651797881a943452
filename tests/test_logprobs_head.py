"""The LM head at response positions only: same log-probs, entropy and gradients as full logits."""

import random

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from taut.models.testbed import build_testbed_model
from taut.rl.logprobs import SequenceBatch, decoder_and_head, response_logprobs

from wide import assert_same_gradients, weighted_gradients
from wide import wide_llama as _wide_llama


def _sequences(vocab, seed=0, n=6, empty=True):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(3, 20))] for _ in range(n)]
    responses = [[rng.randrange(1, vocab) for _ in range(rng.randint(1, 25))] for _ in range(n)]
    if empty:
        responses[1] = []
    return SequenceBatch.build(prompts, responses, 0, "cpu")


def _from_full_logits(model, seq, temperature):
    """Reference: every position's logits, each response token's row picked one by one."""
    logits = model(input_ids=seq.input_ids).logits.float() / temperature
    logp = torch.zeros(seq.mask.shape)
    entropy = torch.zeros(seq.mask.shape)
    for i in range(len(seq.prompt_lens)):
        p = int(seq.prompt_lens[i])
        for t in range(int(seq.response_lens[i])):
            row = torch.log_softmax(logits[i, p - 1 + t], dim=-1)
            logp[i, t] = row[seq.response_ids[i, t]]
            entropy[i, t] = -(row.exp() * row).sum()
    return logp, entropy


def test_head_runs_on_hidden_states_only_where_the_vocabulary_is_wider():
    assert decoder_and_head(_wide_llama()) is not None
    assert decoder_and_head(build_testbed_model("tiny").model) is None          # 37 tokens < 128 wide
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2))
    assert decoder_and_head(gpt2) is None                                          # not in the list


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_positions_match_full_logits(temperature):
    model = _wide_llama()
    seq = _sequences(300)
    logp, entropy = response_logprobs(model, seq, with_entropy=True, temperature=temperature)
    ref_logp, ref_entropy = _from_full_logits(model, seq, temperature)
    mask = seq.mask.bool()
    torch.testing.assert_close(logp[mask], ref_logp[mask], rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy[mask], ref_entropy[mask], rtol=0, atol=2e-5)
    assert not logp[~mask].any()


def test_gradients_match_full_logits():
    grads = []
    for path in ("head-on-hidden", "full"):
        model = _wide_llama()
        seq = _sequences(300, seed=1, empty=False)
        if path == "full":
            logp, _ = _from_full_logits(model, seq, 1.0)
            logp = logp * seq.mask
        else:
            logp, _ = response_logprobs(model, seq)
        grads.append(weighted_gradients(model, logp))
    assert_same_gradients(grads[0], grads[1])


def test_through_a_lora_wrapper():
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_wide_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert decoder_and_head(model) is not None
    seq = _sequences(300, seed=2)
    logp, _ = response_logprobs(model, seq)
    ref, _ = _from_full_logits(model, seq, 1.0)
    mask = seq.mask.bool()
    torch.testing.assert_close(logp[mask], ref[mask], rtol=0, atol=2e-5)


def test_entropy_as_a_metric_keeps_no_graph():
    model = _wide_llama().train()
    seq = _sequences(300, seed=3)
    logp, entropy = response_logprobs(model, seq, with_entropy=True, entropy_grad=False)
    assert logp.requires_grad and not entropy.requires_grad
    _, trained = response_logprobs(model, seq, with_entropy=True, entropy_grad=True)
    assert trained.requires_grad
    torch.testing.assert_close(entropy, trained.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("share", [False, True])
def test_the_head_runs_on_real_response_tokens_only(share):
    """Rows padded to the longest response cost no vocabulary-wide work: the LM head sees one
    row per real response token, and padding's log-probs and entropy are 0."""
    model = _wide_llama()
    rng = random.Random(4)
    prompts = [[rng.randrange(1, 300) for _ in range(8)]] * 3 + [[rng.randrange(1, 300) for _ in range(5)]] * 3
    responses = [[rng.randrange(1, 300) for _ in range(n)] for n in (2, 30, 7, 1, 12, 0)]
    seq = SequenceBatch.build(prompts, responses, 0, "cpu", share_prompts=share)
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    logp, entropy = response_logprobs(model, seq, with_entropy=True)
    assert seen == [sum(len(r) for r in responses)]                      # 52 real tokens, not 6 × 30 slots
    padding = ~seq.mask.bool()
    assert not logp[padding].any() and not entropy[padding].any()
    ref, _ = _from_full_logits(model, seq, 1.0)
    torch.testing.assert_close(logp[~padding], ref[~padding], rtol=0, atol=2e-5)
