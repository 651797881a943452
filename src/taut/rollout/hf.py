"""Batched sampling for any Hugging Face causal LM, with the KV cache managed here.

- Each distinct prompt is prefilled once; its cache and last logits are then repeated for the
  n samples of its group (`prefill of shared prompts once per group`).
- Rows that emitted `<eos>` are dropped from the batch (the cache rows are compacted) as soon
  as enough of them have finished, so late steps run on the unfinished rows only.
- Lengths are counted in tokens; a row that reaches the cap without `<eos>` is truncated.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache, PreTrainedModel

from taut.rollout import fast
from taut.rollout.base import Rollouts, SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens [R] from logits [R, V]: greedy at temperature 0, else (nucleus) sampling."""
    return sample(logits, params, generator, with_logprobs=False)[0]


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
           with_logprobs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next tokens [R], and (at temperature > 0, when asked) each drawn token's log-prob under the
    distribution it was drawn from: softmax(logits / T), cut to the nucleus when top_p < 1."""
    # bf16 logits widened first (exact): torch's argmax and softmax over bf16 rows are 5× and 1.5×
    # slower than the cast and their fp32 kernels together, with the same results bit for bit (at
    # SmolLM2's 64 × 49k: argmax 5.8 ms against 1.2, a tenth of a greedy decode step)
    logits = logits.float()
    if params.temperature == 0:
        return logits.argmax(dim=-1), None
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > params.top_p   # keep the first token always
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    tokens = draw(probs, generator)
    if not with_logprobs:
        return tokens, None
    picked = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if params.top_p < 1.0:                               # the nucleus is unnormalised: `draw` scales by its total
        picked = picked / probs.sum(dim=-1)
    return tokens, picked.log()


BLOCK = 256        # vocabulary entries per block of the two-level draw


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of probs [R, V] (or unnormalised masses), by inverse transform: one
    uniform draw per row against the row's cumulative sums.

    Two levels: the draw first picks a block of `BLOCK` consecutive tokens against the blocks'
    cumulative masses, then a token against the float64 cumulative sums inside that block,
    rescaled to the block's own float64 total. Blocks are weighed at float32 precision (their
    masses are float32 sums: a relative error of about 1e-7 on a block's share); inside the
    chosen block every token keeps its float64 share, however small. For 64 rows × 49k tokens
    this reads [R, V] once, where the float64 copy of the whole row (its cumulative sum aside)
    took ≈ 7 ms of a ≈ 170 ms SmolLM2 decode step in a profile on this CPU; `torch.multinomial`,
    which draws one exponential variate per vocabulary entry, took 63 ms."""
    rows, vocab = probs.shape
    probs = probs.contiguous()
    whole = vocab // BLOCK                                               # complete blocks; a shorter last one
    masses = [probs.as_strided((rows, whole, BLOCK), (probs.stride(0), BLOCK, 1)).sum(-1)] if whole else []
    if whole * BLOCK < vocab:
        masses.append(probs[:, whole * BLOCK:].sum(-1, keepdim=True))
    block_cdf = torch.cat(masses, dim=-1).double().cumsum(dim=-1)        # [R, B]
    u = torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=probs.device)
    target = u * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=block_cdf.shape[1] - 1)   # [R, 1]
    below = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)
    mass = (block_cdf.gather(-1, block) - below).clamp_(min=torch.finfo(torch.float64).tiny)
    columns = block * BLOCK + torch.arange(BLOCK, device=probs.device)  # [R, BLOCK]
    inside = probs.gather(-1, columns.clamp(max=vocab - 1)).double() * (columns < vocab)
    inside_cdf = inside.cumsum(dim=-1)
    index = torch.searchsorted(inside_cdf, (target - below) / mass * inside_cdf[:, -1:], right=True).clamp_(max=BLOCK - 1)
    # right=True never lands on a zero-probability token, except where rounding puts the draw at
    # the block's total: take the block's last token with mass there
    stray = inside.gather(-1, index) == 0
    if bool(stray.any()):
        last = BLOCK - 1 - (inside > 0).flip(-1).int().argmax(dim=-1, keepdim=True)
        index = torch.where(stray, last, index)
    return (block * BLOCK + index).squeeze(-1)


class HFEngine:
    """Sampling from a `PreTrainedModel` with a `DynamicCache` that taut prefills and compacts."""

    def __init__(self, model: PreTrainedModel, eos_id: int, pad_id: int, max_rows: int = 1024, compact_fraction: float = 0.125,
                 fast: bool = True, autocast=contextlib.nullcontext):
        self.model = model
        self.autocast = autocast                  # the policy's mixed-precision context (a callable)
        self.fast = fast                          # use the preallocated Llama-family decode path where it applies
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.max_rows = max_rows                  # rows generated together; more prompts are chunked
        self.compact_fraction = compact_fraction  # compact when this share of the batch has finished

    def sync_weights(self) -> None:
        """The engine samples from the training model itself: nothing to sync."""

    def generate(self, prompts, n, params, generator=None, response_prefix=None, ban_first=None) -> Rollouts:
        per_chunk = max(1, self.max_rows // n)
        out = Rollouts([], [], [], [] if params.logprobs and params.temperature > 0 else None)
        for start in range(0, len(prompts), per_chunk):
            with self.autocast():
                chunk = self._generate(prompts[start : start + per_chunk], n, params, generator, response_prefix or [], ban_first)
            out.prompt_index += [start + i for i in chunk.prompt_index]
            out.tokens += chunk.tokens
            out.truncated += chunk.truncated
            if out.logprobs is not None:
                out.logprobs += chunk.logprobs
        return out

    @torch.inference_mode()
    def _generate(self, prompts, n, params, generator, prefix, ban_first) -> Rollouts:
        model = self.model
        device = model.device
        was_training = model.training
        model.eval()
        try:
            ids, mask = left_padded([list(p) + list(prefix) for p in prompts], self.pad_id, device)
            position = (mask.cumsum(-1) - 1).clamp(min=0)     # [P, W]

            # ---- prefill each distinct prompt once, then repeat for its n samples ----------
            cache = fast.FastDecoder(model) if self.fast and fast.supports(model) else _HFCache(model)
            logits = cache.prefill(ids, mask, position, params.max_new_tokens)       # [P, V]
            if n > 1:
                cache.repeat(n)
                logits = logits.repeat_interleave(n, dim=0)
                mask = mask.repeat_interleave(n, dim=0)
            rows = logits.shape[0]
            next_pos = mask.sum(-1)                            # [R] position of the next token
            if ban_first:
                logits[:, ban_first] = float("-inf")

            # ---- decode, dropping finished rows ------------------------------------------
            tokens = torch.full((rows, params.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
            length = torch.zeros(rows, dtype=torch.long, device=device)
            record = params.logprobs and params.temperature > 0
            logprobs = torch.full((rows, params.max_new_tokens), float("nan"), device=device) if record else None
            ended = torch.zeros(rows, dtype=torch.bool, device=device)
            active = torch.arange(rows, device=device)          # [A] row of each batch position
            for t in range(params.max_new_tokens):
                if t < params.min_new_tokens:
                    logits[:, self.eos_id] = float("-inf")
                live = ~ended[active]                           # [A] positions still writing
                nxt, nxt_logp = sample(logits, params, generator, record)   # [A]; logits as modified above
                rows_live = active[live]
                tokens[rows_live, t] = nxt[live]
                if record:
                    logprobs[rows_live, t] = nxt_logp[live]
                length[rows_live] += 1
                ended[rows_live] |= nxt[live] == self.eos_id
                if t == params.max_new_tokens - 1 or bool(ended.all()):
                    break
                still = ~ended[active]
                if (~still).sum() >= max(1, int(self.compact_fraction * active.numel())):
                    keep = still.nonzero().squeeze(-1)
                    cache.select(keep)
                    active, nxt, next_pos = active[keep], nxt[keep], next_pos[keep]
                logits = cache.step(nxt, next_pos)
                next_pos = next_pos + 1
        finally:
            model.train(was_training)

        return as_rollouts(tokens, length, ended, logprobs, prefix, n)


def left_padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [R, W] and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def as_rollouts(tokens: torch.Tensor, length: torch.Tensor, ended: torch.Tensor, logprobs: torch.Tensor | None,
                prefix: list[int], n: int) -> Rollouts:
    """The decode buffers as Rollouts: each row's tokens up to its length, after the forced prefix."""
    rows = tokens.shape[0]
    lengths = length.tolist()
    token_rows = tokens.tolist()
    logprob_rows = None
    if logprobs is not None:
        values = logprobs.tolist()
        logprob_rows = [[float("nan")] * len(prefix) + values[r][: lengths[r]] for r in range(rows)]
    return Rollouts(
        prompt_index=[r // n for r in range(rows)],
        tokens=[list(prefix) + token_rows[r][: lengths[r]] for r in range(rows)],
        truncated=[not e for e in ended.tolist()],
        logprobs=logprob_rows,
    )


class _HFCache:
    """The generic path: the model's own forward with a `DynamicCache`."""

    def __init__(self, model):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.mask = None

    def prefill(self, ids, mask, position, max_new):
        self.mask = mask
        return self.model(input_ids=ids, attention_mask=mask, position_ids=position, cache=self.cache,
                          use_cache=True, logits_to_keep=1).logits[:, -1]

    def repeat(self, n):
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, dim=0)

    def select(self, index):
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]

    def step(self, tokens, position):
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        return self.model(input_ids=tokens.unsqueeze(1), attention_mask=self.mask, position_ids=position.unsqueeze(1),
                          cache=self.cache, use_cache=True).logits[:, -1]
