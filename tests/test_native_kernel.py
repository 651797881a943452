"""taut's compiled decode kernel (taut.rollout.native) against the same step written in float64:
rotary on the new heads, the cache writes at column t, and masked grouped-query attention."""

import pytest
import torch

from taut.rollout.native import kernel, reason


@pytest.fixture(scope="module")
def native():
    module = kernel()
    assert module is not None, reason()          # the machine has a compiler: the kernel must build
    return module


def _rotate(x, cos, signed_sin):
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("heads,kv,t,d", [(9, 3, 0, 32), (9, 3, 37, 32), (4, 4, 5, 32), (8, 2, 70, 32),
                                         (9, 3, 47, 64), (9, 3, 16, 16), (6, 3, 33, 128)])
def test_the_kernel_is_the_step_in_float64(native, heads, kv, t, d, padded):
    """Head dims that are multiples of 32 take the vectorised path where the CPU has AVX-512 BF16
    (sixteen keys a step, a block cut short at t), others the plain loops."""
    torch.manual_seed(heads * 100 + t)
    rows, capacity = 5, 80
    qkv = torch.randn(rows, (heads + 2 * kv) * d).bfloat16()
    keys = torch.randn(rows, kv, capacity, d).bfloat16()
    values = torch.randn(rows, kv, capacity, d).bfloat16()
    angle = torch.rand(rows, d) * 6
    cos, signed_sin = angle.cos(), angle.sin() * torch.cat([-torch.ones(d // 2), torch.ones(d // 2)])
    valid = torch.ones(rows, capacity, dtype=torch.bool)
    if padded:
        valid[0, : t // 2] = False                   # left padding of different widths
        valid[3, : t] = False                        # only column t visible
    keys_before, values_before = keys.clone(), values.clone()

    out = native.decode_attention(qkv, cos, signed_sin, keys, values, valid if padded else valid.new_empty(0), t, heads, d ** -0.5)

    x = qkv.double().view(rows, heads + 2 * kv, d)
    q = _rotate(x[:, :heads], cos.double()[:, None], signed_sin.double()[:, None]).bfloat16().double()   # rounded as the keys
    k_new = _rotate(x[:, heads: heads + kv], cos.double()[:, None], signed_sin.double()[:, None])
    assert torch.equal(keys[:, :, t], k_new.bfloat16())                   # written, rounded once
    assert torch.equal(values[:, :, t], qkv.view(rows, heads + 2 * kv, d)[:, heads + kv:])
    untouched = torch.ones(capacity, dtype=torch.bool)
    untouched[t] = False
    assert torch.equal(keys[:, :, untouched], keys_before[:, :, untouched])
    assert torch.equal(values[:, :, untouched], values_before[:, :, untouched])

    k, v = keys[:, :, : t + 1].double(), values[:, :, : t + 1].double()        # [R, kv, T, D]
    grouped = q.view(rows, kv, heads // kv, d)
    scores = grouped @ k.transpose(-1, -2) * d ** -0.5                          # [R, kv, G, T]
    if padded:
        scores = scores.masked_fill(~valid[:, None, None, : t + 1], float("-inf"))
    expected = (scores.softmax(-1) @ v).reshape(rows, heads * d)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, heads * d)
    assert torch.allclose(out.double(), expected, rtol=2 ** -8, atol=1e-6)     # one bf16 rounding of an fp32 result


def test_bad_shapes_are_refused_with_a_message(native):
    qkv = torch.randn(2, 5 * 32).bfloat16()
    keys = torch.zeros(2, 1, 8, 32).bfloat16()
    with pytest.raises(RuntimeError, match="qkv's width"):
        native.decode_attention(qkv, torch.ones(2, 32), torch.ones(2, 32), keys, keys.clone(), torch.empty(0, dtype=torch.bool), 0, 4, 1.0)
    with pytest.raises(RuntimeError, match="outside the cache"):
        native.decode_attention(torch.randn(2, 6 * 32).bfloat16(), torch.ones(2, 32), torch.ones(2, 32), keys, keys.clone(),
                                torch.empty(0, dtype=torch.bool), 8, 4, 1.0)


def test_the_fused_norm_adds_the_residual_in_place_and_rounds_once(native):
    torch.manual_seed(0)
    x, delta, weight = torch.randn(7, 96), torch.randn(7, 96).bfloat16(), torch.rand(96) + 0.5
    expected_x = x.double() + delta.double()
    expected = expected_x * torch.rsqrt(expected_x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
    out = native.add_rms_norm(x, delta, weight, 1e-5)
    assert torch.allclose(x.double(), expected_x, atol=1e-6)                           # x += delta, in place
    assert out.dtype == torch.bfloat16 and torch.allclose(out.double(), expected, rtol=2 ** -8, atol=1e-6)
    before = x.clone()
    native.add_rms_norm(x, delta.new_empty(0), weight, 1e-5)                             # no delta: no add
    assert torch.equal(x, before)


def test_the_fused_silu_is_silu_of_the_gate_times_up(native):
    torch.manual_seed(1)
    gate_up = (torch.randn(5, 2 * 48) * 4).bfloat16()
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    assert torch.allclose(native.silu_mul(gate_up).double(), expected, rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("heads,kv,d,width,t", [(9, 3, 64, 20, 20), (9, 3, 64, 20, 57), (9, 3, 16, 7, 30), (4, 2, 32, 33, 40)])
def test_a_prompt_shared_by_its_rows_gives_the_same_step_bit_for_bit(native, heads, kv, d, width, t, padded):
    """decode_attention_shared reads columns < width from the row's prompt's buffer and the rest from
    its own: the step equals decode_attention's on one buffer per row holding both, bit for bit,
    for rows in any order (as after finished rows were dropped)."""
    torch.manual_seed(t * 7 + d)
    prompts, capacity = 3, 48
    prompt_of = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0])          # rows of three prompts, some dropped, reordered
    rows = prompt_of.numel()
    prompt_keys = torch.randn(prompts, kv, width, d).bfloat16()
    prompt_values = torch.randn(prompts, kv, width, d).bfloat16()
    own_keys = torch.randn(rows, kv, capacity, d).bfloat16()
    own_values = torch.randn(rows, kv, capacity, d).bfloat16()
    keys = torch.cat([prompt_keys[prompt_of], own_keys], dim=2).contiguous()       # one buffer per row
    values = torch.cat([prompt_values[prompt_of], own_values], dim=2).contiguous()
    qkv = torch.randn(rows, (heads + 2 * kv) * d).bfloat16()
    angle = torch.rand(rows, d) * 6
    cos, signed_sin = angle.cos(), angle.sin() * torch.cat([-torch.ones(d // 2), torch.ones(d // 2)])
    valid = torch.ones(rows, width + capacity, dtype=torch.bool)
    if padded:
        valid[prompt_of == 1, : width // 2] = False             # a shorter prompt, left-padded
    mask = valid if padded else valid.new_empty(0)

    expected = native.decode_attention(qkv, cos, signed_sin, keys, values, mask, t, heads, d ** -0.5)
    out = native.decode_attention_shared(qkv, cos, signed_sin, prompt_keys, prompt_values, prompt_of, own_keys, own_values,
                                         mask, t, heads, d ** -0.5)
    assert torch.equal(out, expected)
    assert torch.equal(own_keys[:, :, t - width], keys[:, :, t]) and torch.equal(own_values[:, :, t - width], values[:, :, t])
    with pytest.raises(RuntimeError, match="outside the prompts"):
        native.decode_attention_shared(qkv, cos, signed_sin, prompt_keys, prompt_values, prompt_of + 1, own_keys, own_values,
                                       mask, t, heads, d ** -0.5)
