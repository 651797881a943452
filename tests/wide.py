"""A small Llama whose vocabulary (300) is wider than its hidden state (32), as every real model's
is, so it takes the head-on-hidden and shared-prompt paths of taut.rl.logprobs; and the gradient
comparison the tests of those paths share."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def wide_llama(seed: int = 0, attn: str = "sdpa", pad_id: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=pad_id, attn_implementation=attn)
    return LlamaForCausalLM(config).eval()


def weighted_gradients(model, logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameters' gradients of a column-weighted sum of per-token log-probs [N, T] (weights
    that differ by column, so that a token read from the wrong position shows)."""
    (logp * torch.linspace(0.5, 1.5, logp.shape[1])).sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


def assert_same_gradients(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
