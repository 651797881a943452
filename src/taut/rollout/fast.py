"""A decode step for Llama-family decoders (Qwen2, Qwen3, Llama, Mistral) with a preallocated
KV cache, sharing the Hugging Face modules' weights.

Why: on small models a `model.forward` call per generated token spends most of its time in
Python around the arithmetic (cache objects, mask construction, output classes). This path
does the same arithmetic with the model's own weights — query/key/value and gate/up
projections fused into one matrix product each, RMS norms as one kernel, attention for the
single new query through the same `scaled_dot_product_attention` call (same shapes, same mask
or none) that Hugging Face's sdpa attention makes — writing keys and values into buffers
allocated once for the whole generation. Under bf16 autocast on a CPU the products use weights
reordered once per generate call for oneDNN. The prompt is prefilled by the model's own forward;
its cache is copied into the buffers. Tests check greedy tokens equal `model.generate` in fp32;
under bf16 autocast the path is held to the decode contract (taut.rollout.contract: logits within
8 bf16 units of the model's forward at every step, tokens equal up to the first near tie), which
leaves it free to round differently from Hugging Face's kernels: there its elementwise work
(norms with the residual adds, rotary with the cache writes and attention, SiLU) runs in taut's
compiled kernels (taut.rollout.native) when they can be had.

Rows advance in lockstep: at decode step t every row writes column W + t, where W is the
(left-padded) prompt width; per-row positions drive the rotary embedding and a per-row mask
hides the padding. With the kernel, the prompt's columns are kept once per prompt and shared by
the rows sampled from it (a group's rollouts), each row's own buffers holding only what it
generated: the prompt's keys and values are read from memory once a group per step, not once a
row. The buffers start with room for 64 new tokens and double when full, so a
long cap costs memory only when responses are long. A model wrapped by peft with plain LoRA
adapters takes this path with each adapter folded into its layer's weight for the generate
call (W + scale·B·A): the same function, rounded differently from the adapter's own products,
so its greedy tokens are tested against the generic path's in fp32 only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from taut.models.policy import lora_delta, unwrap
from taut.rollout.native import kernel as native_kernel

SUPPORTED = ("qwen2", "qwen3", "llama", "mistral")


def supports(model) -> bool:
    """True for the architectures and settings this path reproduces exactly: full attention
    (no sliding window) and the default rotary embedding; with peft, plain LoRA on linear layers
    of the decoder (not merged, not disabled, no DoRA), which the path folds into its weights."""
    model = unwrap(model)
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        return False
    for module in model.modules():
        if hasattr(module, "lora_A") and not _plain_lora(module):
            return False
    config = model.config.to_dict()          # fields differ between architectures
    if config.get("model_type") not in SUPPORTED or config.get("use_sliding_window"):
        return False
    if config.get("model_type") == "mistral" and config.get("sliding_window") is not None:
        return False
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return rope.get("rope_type", rope.get("type", "default")) in ("default", None)


def _plain_lora(module) -> bool:
    return (isinstance(getattr(module, "base_layer", None), torch.nn.Linear) and not module.merged and not module.disable_adapters
            and not any(module.use_dora.get(a, False) for a in module.active_adapters)
            and not any(getattr(module, "lora_bias", {}).get(a, False) for a in module.active_adapters))


def _weight(linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A projection's weight and bias; for a LoRA layer its base weight plus its adapters'
    scale·B·A (in the layer's precision: this rounds differently from the adapters' own two
    products, by float rounding only)."""
    base = getattr(linear, "base_layer", linear)
    delta = lora_delta(linear)
    return (base.weight if delta is None else base.weight + delta.to(base.weight.dtype)), base.bias


def _fused_layer(layer, weight, cast) -> dict[str, torch.Tensor | None]:
    """A decoder layer's weights for the fast path: q, k and v in one product, gate and up in
    another (`weight` casts and packs a product's weight, `cast` a bias)."""
    a, m = layer.self_attn, layer.mlp
    (q, q_bias), (k, k_bias), (v, v_bias) = (_weight(p) for p in (a.q_proj, a.k_proj, a.v_proj))
    o, o_bias = _weight(a.o_proj)
    biases = [q_bias, k_bias, v_bias]
    return {
        "ln1": layer.input_layernorm.weight, "ln2": layer.post_attention_layernorm.weight,
        "qkv": weight(torch.cat([q, k, v])),
        "qkv_bias": cast(torch.cat(biases)) if all(b is not None for b in biases) else None,
        "o": weight(o), "o_bias": cast(o_bias),
        "gate_up": weight(torch.cat([_weight(m.gate_proj)[0], _weight(m.up_proj)[0]])),
        "down": weight(_weight(m.down_proj)[0]),
        "q_norm": a.q_norm.weight if hasattr(a, "q_norm") else None,     # Qwen3 normalises q and k per head
        "k_norm": a.k_norm.weight if hasattr(a, "k_norm") else None,
    }


class FastDecoder:
    def __init__(self, model, pack: bool = True, native: bool = True, share_prompts: bool = True):
        model = unwrap(model)                # the forward of a peft model's base model applies the adapters
        self.model = model
        self.inner = model.model
        config = model.config
        attn = self.inner.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.eps = config.rms_norm_eps
        rotary = self.inner.rotary_emb
        self.inv_freq, self.rope_scale = rotary.inv_freq, rotary.attention_scaling
        # Fused projections, built from the current weights (a decoder lives for one generate call).
        # Under autocast (fp32 weights, bf16 products) they are cast once here, not at every
        # product of every step as autocast would: the same bf16 values, a fifth of a step saved.
        device = model.device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        self.low = low        # keys and values are kept in it too: attention would cast them at every step

        # bf16 products on a CPU with oneDNN: weights reordered once into the layout its matmul
        # kernel reads (as torch.compile's CPU backend does when it freezes weights), where a plain
        # product reorders them at every call: 1.13x the tokens/s at SmolLM2's 64 rows
        # (docs/performance-log.md). The same values, bit for bit, at any row count (the 64 below is
        # the reorder's hint; tests/test_rollout_engine.py).
        self.packed = pack and low == torch.bfloat16 and device == "cpu" and torch.backends.mkldnn.is_available()

        def cast(w):
            return w if w is None or low is None else w.to(low)

        def weight(w):
            w = cast(w)
            return torch.ops.mkldnn._reorder_linear_weight(w, 64) if self.packed else w

        # Under bf16 autocast the elementwise work (norms with residual adds, rotary with cache
        # writes and attention, SiLU) runs in taut's compiled kernels when they can be had
        # (taut.rollout.native, `_native_step`); fp32 keeps the steps below, whose greedy tokens
        # equal model.generate's.
        plain = (not hasattr(attn, "q_norm") and self.head_dim % 16 == 0 and device == "cpu"
                 and self.inner.norm.weight.dtype == torch.float32)          # fp32 weights, bf16 products
        self.native = native_kernel() if native and plain and low == torch.bfloat16 else None
        # With the kernel, the prompt's keys and values live once per prompt (`pk`, `pv`: [P, kv, W, D]),
        # shared by the rows sampled from it (`prompt_of`), and a row's own buffers hold only the columns
        # it generated (column W + j at j): a group's rollouts read their prompt once from memory, not once
        # each (the same step, bit for bit: decode_attention_shared). Without it, one buffer per row.
        self.shared = self.native is not None and share_prompts
        self.pk: list[torch.Tensor] = []
        self.pv: list[torch.Tensor] = []
        self.prompt_of: torch.Tensor | None = None
        self.base = 0                                    # the first column a row's own buffers hold

        head, head_bias = _weight(model.lm_head)
        self.head, self.head_bias = weight(head), cast(head_bias)
        self.layers = [_fused_layer(layer, weight, cast) for layer in self.inner.layers]
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.valid: torch.Tensor | None = None           # [R, capacity] columns a row may attend to
        self.length = 0
        self.limit = 0                                   # prompt width + max_new: the most columns ever needed

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, position: torch.Tensor, max_new: int) -> torch.Tensor:
        """Run the prompt through the model; keep its cache in buffers sized for max_new more tokens."""
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=position, cache=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1]
        rows, width = ids.shape
        self.limit = width + max_new
        capacity = min(self.limit, width + 64)           # grown on demand (doubling): long caps cost memory only when used
        self.k, self.v = [], []
        self.base = width if self.shared else 0
        if self.shared:
            self.pk = [layer.keys.to(self.low).contiguous() for layer in cache.layers]
            self.pv = [layer.values.to(self.low).contiguous() for layer in cache.layers]
            self.prompt_of = torch.arange(rows, device=ids.device)
        for layer in cache.layers:
            k = layer.keys.new_zeros((rows, self.n_kv, capacity - self.base, self.head_dim), dtype=self.low or layer.keys.dtype)
            v = torch.zeros_like(k)
            if not self.shared:
                k[:, :, :width] = layer.keys
                v[:, :, :width] = layer.values
            self.k.append(k)
            self.v.append(v)
        self.valid = torch.zeros((rows, capacity), dtype=torch.bool, device=ids.device)
        self.valid[:, :width] = mask.bool()
        self.padded = not bool(self.valid[:, :width].all())        # decides the attention kernel (see step)
        self.length = width
        return logits

    def _grow(self) -> None:
        t, base = self.length, self.base
        capacity = min(self.limit, 2 * self.valid.shape[1])
        for buffers in (self.k, self.v):
            for i, buf in enumerate(buffers):
                bigger = buf.new_zeros((buf.shape[0], buf.shape[1], capacity - base, buf.shape[3]))
                bigger[:, :, : t - base] = buf[:, :, : t - base]
                buffers[i] = bigger
        valid = self.valid.new_zeros((self.valid.shape[0], capacity))
        valid[:, :t] = self.valid[:, :t]
        self.valid = valid

    def repeat(self, n: int) -> None:
        self.k = [k.repeat_interleave(n, dim=0) for k in self.k]
        self.v = [v.repeat_interleave(n, dim=0) for v in self.v]
        self.valid = self.valid.repeat_interleave(n, dim=0)
        if self.shared:                                  # the prompt's buffers stay one per prompt
            self.prompt_of = self.prompt_of.repeat_interleave(n)

    def select(self, index: torch.Tensor) -> None:
        """Keep rows `index`; only the columns written so far are copied."""
        t, base = self.length, self.base
        for buffers in (self.k, self.v):
            for i, buf in enumerate(buffers):
                kept = buf.new_empty((index.numel(), *buf.shape[1:]))
                kept[:, :, : t - base] = buf[index, :, : t - base]
                buffers[i] = kept
        self.valid = self.valid.index_select(0, index)
        if self.shared:
            self.prompt_of = self.prompt_of.index_select(0, index)

    def _rotary(self, position: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin [A, 1, D] of each row's position: rotate_half(x) · sin, as
        Hugging Face writes it, equals roll(x, D/2) · (−sin₁, sin₂) exactly (a sign moves
        between the factors), which saves the negation and the concatenation at every use."""
        freqs = position.float().unsqueeze(-1) * self.inv_freq.float()                    # [A, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        signed = torch.cat((-sin[:, : freqs.shape[-1]], sin[:, freqs.shape[-1]:]), dim=-1)
        return ((emb.cos() * self.rope_scale).to(dtype).view(-1, 1, self.head_dim),
                (signed * self.rope_scale).to(dtype).view(-1, 1, self.head_dim))

    @staticmethod
    def _rotate(x, cos, signed_sin):
        """x · cos + rotate_half(x) · sin over the last dimension (see `_rotary`)."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x · weightᵀ + bias, as autocast computes it: x cast to the low precision first."""
        if not self.packed:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.low).contiguous(), weight, bias, "none", [], "")

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Logits [A, V] for the next token after `tokens` [A] at `position` [A]."""
        t = self.length
        if t == self.valid.shape[1]:
            self._grow()
        x = self.inner.embed_tokens(tokens)                                                # [A, H]
        self.valid[:, t] = True
        if self.native is not None:
            return self._native_step(x, position, t)
        rows, d, kv, groups = tokens.shape[0], self.head_dim, self.n_kv, self.n_heads // self.n_kv
        width = x.shape[-1]
        cos, sin = self._rotary(position, x.dtype)                                          # [A, 1, D]
        visible = self.valid[:, : t + 1].view(rows, 1, 1, t + 1) if self.padded else None  # [A, 1, 1, T]
        for i, w in enumerate(self.layers):
            h = F.rms_norm(x, (width,), w["ln1"], self.eps)
            qkv = self._linear(h, w["qkv"], w["qkv_bias"])
            qk, v = qkv.split([(self.n_heads + kv) * d, kv * d], dim=-1)
            qk, v = qk.view(rows, self.n_heads + kv, d), v.view(rows, kv, d)
            if w["q_norm"] is not None:
                q, k = qk.split([self.n_heads, kv], dim=1)
                qk = torch.cat([F.rms_norm(q, (d,), w["q_norm"], self.eps), F.rms_norm(k, (d,), w["k_norm"], self.eps)], dim=1)
            qk = self._rotate(qk, cos, sin)                                                   # queries and keys at once
            q, k = qk[:, : self.n_heads].view(rows, kv, groups, d), qk[:, self.n_heads:]
            self.k[i][:, :, t] = k
            self.v[i][:, :, t] = v
            keys, values = self.k[i][:, :, : t + 1], self.v[i][:, :, : t + 1]                  # [A, kv, T, D]
            # the kernel and shapes Hugging Face's sdpa attention picks for one new query: query heads
            # grouped per key/value head under a padding mask, else grouped-query attention unmasked
            if visible is not None:
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=self.scaling)
            else:
                out = F.scaled_dot_product_attention(q.view(rows, -1, 1, d), keys, values, scale=self.scaling, enable_gqa=True)
            out = out.reshape(rows, -1)                                                       # [A, heads·D]
            x = x + self._linear(out, w["o"], w["o_bias"])
            h = F.rms_norm(x, (width,), w["ln2"], self.eps)
            gate, up = self._linear(h, w["gate_up"]).chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, w["down"])
        self.length = t + 1
        return self._linear(F.rms_norm(x, (width,), self.inner.norm.weight, self.eps), self.head, self.head_bias)

    def _native_step(self, x: torch.Tensor, position: torch.Tensor, t: int) -> torch.Tensor:
        """The step with its elementwise work in taut's kernels (taut.rollout.native): per layer,
        the residual add with the next RMS norm and its cast to bf16 in one pass, rotary with the
        cache writes and attention in one, SiLU with the product by `up` in one; the products
        are `step`'s."""
        native = self.native
        cos, sin = (c.view(-1, self.head_dim).contiguous() for c in self._rotary(position, torch.float32))   # [A, D] fp32
        visible = self.valid if self.padded else self.valid.new_empty(0)
        x = x.contiguous()                                            # the residual stream (fp32), updated in place
        delta = x.new_empty(0, dtype=torch.bfloat16)                  # nothing to add before the first layer
        for i, w in enumerate(self.layers):
            h = native.add_rms_norm(x, delta, w["ln1"], self.eps)               # x += the last layer's MLP output
            qkv = self._linear(h, w["qkv"], w["qkv_bias"])
            if self.shared:
                out = native.decode_attention_shared(qkv, cos, sin, self.pk[i], self.pv[i], self.prompt_of, self.k[i], self.v[i],
                                                     visible, t, self.n_heads, self.scaling)
            else:
                out = native.decode_attention(qkv, cos, sin, self.k[i], self.v[i], visible, t, self.n_heads, self.scaling)
            h = native.add_rms_norm(x, self._linear(out, w["o"], w["o_bias"]), w["ln2"], self.eps)
            delta = self._linear(native.silu_mul(self._linear(h, w["gate_up"])), w["down"])
        self.length = t + 1
        return self._linear(native.add_rms_norm(x, delta, self.inner.norm.weight, self.eps), self.head, self.head_bias)
