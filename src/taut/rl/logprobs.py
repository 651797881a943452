"""Per-token log-probabilities of responses under a causal LM, in length-bucketed micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from taut.models.policy import unwrap


@dataclass
class SequenceBatch:
    """Prompt + response rows, right-padded; response tokens addressed from column 0."""

    input_ids: Tensor        # [N, T]
    prompt_lens: Tensor      # [N]
    response_lens: Tensor    # [N]
    response_ids: Tensor     # [N, Tr] right-padded response tokens
    mask: Tensor             # [N, Tr] 1 on response tokens
    rollout_logp: Tensor | None = None   # [N, Tr] the engine's log-probs of the response tokens (NaN: none)
    prompt_ids: Tensor | None = None     # [U, P] the distinct prompts, right-padded (built with share_prompts)
    prompt_index: Tensor | None = None   # [N] each row's prompt in prompt_ids

    @classmethod
    def build(cls, prompts: list[list[int]], responses: list[list[int]], pad_id: int, device,
              rollout_logp: list[list[float]] | None = None, share_prompts: bool = False) -> "SequenceBatch":
        """With `share_prompts`, also the distinct prompts and each row's index into them, for
        `response_logprobs` to forward each prompt once (where the model allows it)."""
        n = len(prompts)
        width = max(len(p) + len(r) for p, r in zip(prompts, responses))
        r_width = max(1, max(len(r) for r in responses))
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        resp = torch.full((n, r_width), pad_id, dtype=torch.long)
        mask = torch.zeros((n, r_width))
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
            if r:
                resp[i, : len(r)] = torch.tensor(r, dtype=torch.long)
                mask[i, : len(r)] = 1
        sampled = None
        if rollout_logp is not None:
            sampled = torch.full((n, r_width), float("nan"))
            for i, values in enumerate(rollout_logp):
                if values:
                    sampled[i, : len(values)] = torch.tensor(values)
            sampled = sampled.to(device)
        distinct = index = None
        if share_prompts:
            first: dict[tuple[int, ...], int] = {}
            index = torch.tensor([first.setdefault(tuple(p), len(first)) for p in prompts], device=device)
            distinct = torch.full((len(first), max(len(p) for p in first)), pad_id, dtype=torch.long)
            for p, u in first.items():
                distinct[u, : len(p)] = torch.tensor(p, dtype=torch.long)
            distinct = distinct.to(device)
        return cls(ids.to(device), torch.tensor([len(p) for p in prompts], device=device),
                   torch.tensor([len(r) for r in responses], device=device), resp.to(device), mask.to(device), sampled,
                   distinct, index)


# Architectures whose logits are exactly lm_head(decoder hidden state): no soft-capping, no logit
# scale. For them the head can run on the response positions only.
HEAD_ON_HIDDEN = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def decoder_and_head(model):
    """(decoder, lm_head) when logits are lm_head(decoder(input_ids).last_hidden_state) and the
    vocabulary is wider than the hidden state (so gathering hidden states moves less than gathering
    logits), else None."""
    base = unwrap(model)                                 # through a LoRA wrapper
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in HEAD_ON_HIDDEN or config.vocab_size <= config.hidden_size:
        return None
    decoder, head = getattr(base, "model", None), getattr(base, "lm_head", None)
    if decoder is None or head is None:
        return None
    return decoder, head


def shares_prompts(model) -> bool:
    """True where a batch built with `share_prompts` has each prompt forwarded once for all the rows
    that share it: the LM head runs on hidden states (`decoder_and_head`) and the decoder can."""
    parts = decoder_and_head(model)
    return parts is not None and _decoder_shares(parts[0])


def _decoder_shares(decoder) -> bool:
    """Attention is torch's sdpa, which takes the boolean mask that hides the padding between a
    prompt and its response, no layer attends through a sliding window (which that mask does
    not apply), and activation checkpointing is off (Hugging Face's checkpointed layers drop the
    cache the responses read their prompt's keys and values from)."""
    config = decoder.config
    return (getattr(config, "_attn_implementation", None) == "sdpa" and getattr(config, "sliding_window", None) is None
            and not getattr(decoder, "gradient_checkpointing", False))


def pack_responses(prompt_of: list[int], lengths: list[int], width: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Responses laid end to end in rows of `width` columns, each row continuing one prompt: first
    fit, longest first, a prompt's responses into that prompt's rows only. Returns the prompt of
    each packed row and each response's (packed row, first column); an empty response takes no
    room and is placed at (-1, 0)."""
    rows: list[int] = []
    free: list[int] = []
    place = [(-1, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if lengths[i] == 0:
            continue
        b = next((b for b in range(len(rows)) if rows[b] == prompt_of[i] and free[b] >= lengths[i]), None)
        if b is None:
            b = len(rows)
            rows.append(prompt_of[i])
            free.append(width)
        place[i] = (b, width - free[b])
        free[b] -= lengths[i]
    return rows, place


def _shared_prompt_hidden(decoder, batch: SequenceBatch, real: Tensor) -> Tensor:
    """Decoder hidden states that predict each real response token, [M, H] in the order of
    `batch.mask`, with each distinct prompt forwarded once and the responses packed.

    The prompts' keys and values are indexed per packed row (so the backward adds up the rows'
    gradients through them); each packed row holds responses of one prompt end to end
    (`pack_responses`, rows as wide as the longest response), and each response token sees its
    prompt (not the padding after a shorter one) and its own response so far, at positions
    continuing from the prompt. At natural lengths, where most of a micro-batch's responses are
    shorter than its longest, this forwards a fraction of the padded rows' columns. The same
    arithmetic as one forward per row over prompt + response; rounded differently."""
    device = batch.response_ids.device
    lens, index = batch.prompt_lens, batch.prompt_index
    n_prompts, width = batch.prompt_ids.shape
    r_width = batch.response_ids.shape[1]
    cache = DynamicCache(config=decoder.config)
    prefix = decoder(input_ids=batch.prompt_ids, cache=cache, use_cache=True).last_hidden_state            # [U, P, H]
    prompt_lens = torch.zeros(n_prompts, dtype=lens.dtype, device=device).scatter(0, index, lens)           # [U]
    last = prefix[torch.arange(n_prompts, device=device), prompt_lens - 1]       # [U, H]: predicts a response's first token
    rows, place = pack_responses(index.tolist(), batch.response_lens.tolist(), r_width)
    if not rows:                                                                   # every response empty
        return last[index.new_zeros(0)]
    row, t = real.nonzero(as_tuple=True)                                           # [M]: each real token's rollout and column
    at = torch.tensor([b * r_width + s for b, s in place], device=device)         # each response's first slot in the packed rows
    dest = at[row] + t                                                             # [M]: each real token's slot
    slots = len(rows) * r_width
    packed = torch.zeros(slots, dtype=torch.long, device=device).index_put_((dest,), batch.response_ids[real])  # padding: masked
    segment = torch.full((slots,), -1, dtype=torch.long, device=device).index_put_((dest,), row).view(len(rows), r_width)
    offset = torch.zeros(slots, dtype=torch.long, device=device).index_put_((dest,), t).view(len(rows), r_width)
    bins = torch.tensor(rows, device=device)
    cache.batch_select_indices(bins)
    cols = torch.arange(r_width, device=device)
    own_prompt = torch.arange(width, device=device).view(1, 1, -1) < prompt_lens[bins].view(-1, 1, 1)     # [B, 1, P]
    own_response = ((segment.unsqueeze(2) == segment.unsqueeze(1)) & (segment.unsqueeze(2) >= 0)
                    & (cols.view(1, 1, -1) <= cols.view(1, -1, 1)))                                       # [B, Tr, Tr]
    visible = torch.cat([own_prompt.expand(-1, r_width, -1), own_response], dim=2)                       # [B, Tr, P + Tr]
    hidden = decoder(input_ids=packed.view(len(rows), r_width), attention_mask=visible.unsqueeze(1), cache=cache,
                     use_cache=True, position_ids=prompt_lens[bins].unsqueeze(1) + offset).last_hidden_state  # [B, Tr, H]
    source = torch.cat([last, hidden.reshape(slots, -1)])     # a response's first token from its prompt's last position
    return source[torch.where(t == 0, index[row], n_prompts + dest - 1)]


def _response_hidden(decoder, batch: SequenceBatch, real: Tensor) -> Tensor:
    """The decoder's hidden states that predict each real response token, [M, H] in the order of
    `batch.mask`."""
    if batch.prompt_index is not None and _decoder_shares(decoder):
        return _shared_prompt_hidden(decoder, batch, real)
    width = batch.input_ids.shape[1]
    cols = torch.arange(batch.response_ids.shape[1], device=batch.input_ids.device).unsqueeze(0)
    hidden = decoder(input_ids=batch.input_ids, use_cache=False).last_hidden_state          # [N, T, H]
    index = (batch.prompt_lens.unsqueeze(1) - 1 + cols).clamp(max=width - 1)               # [N, Tr]
    return hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))[real]    # [M, H]


def _response_logits(model, batch: SequenceBatch) -> Tensor:
    """The logits that predict each response token, [N, Tr, V], from the model's own logits (from
    the shortest prompt's last position on, the response rows gathered; padding columns repeat a
    real one): for models whose head cannot run on hidden states alone."""
    width = batch.input_ids.shape[1]
    cols = torch.arange(batch.response_ids.shape[1], device=batch.input_ids.device).unsqueeze(0)
    first = int(batch.prompt_lens.min()) - 1                      # earliest position predicting a response token
    keep = width - first
    logits = model(input_ids=batch.input_ids, logits_to_keep=keep).logits       # [N, keep, V]
    index = ((batch.prompt_lens - 1 - first).unsqueeze(1) + cols).clamp(max=keep - 1)            # [N, Tr]
    return logits.gather(1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))


def response_logprobs(model, batch: SequenceBatch, with_entropy: bool = False,
                      temperature: float = 1.0, entropy_grad: bool = True) -> tuple[Tensor, Tensor | None]:
    """log π(y_t | prompt, y_<t) for every response token, [N, Tr]; entropy of each step if asked.

    π is the distribution the rollouts were sampled from: softmax(logits / temperature), as the
    engine samples (TRL and verl scale the same way). Training at temperature 1 on rollouts
    sampled at T ≠ 1 would optimise another policy than the one that produced the data.
    Right padding needs no attention mask under causal attention: real tokens never attend to
    the padding after them. With `entropy_grad=False` the entropy is a metric: computed without
    autograd, so its vocabulary-wide softmax is freed at once instead of kept for a backward.

    Where the architecture allows it and the vocabulary is the wider (any real tokenizer), the
    decoder's hidden states are gathered at the real response tokens and the LM head, the
    log-softmax and the entropy run on those alone: no logits for prompt tokens, nor for the
    padding of rows to a micro-batch's longest response (at natural lengths most of its columns);
    log-probs and entropy are 0 there. A batch built with `share_prompts` then forwards each
    distinct prompt once (`_shared_prompt_hidden`): the G rollouts of a prompt cost one prompt's
    forward and backward instead of G. Otherwise (the testbed's 37-token vocabulary) the model's
    own logits are gathered (`_response_logits`). All give the same values; the gradients agree
    to rounding.
    """
    parts = decoder_and_head(model)
    real = None
    if parts is not None:
        real = batch.mask.bool()
        picked = parts[1](_response_hidden(parts[0], batch, real)).float()            # [M, V]: real tokens only
        targets = batch.response_ids[real]
    else:
        picked, targets = _response_logits(model, batch).float(), batch.response_ids  # [N, Tr, V]
    if temperature != 1.0:
        picked = picked / temperature
    logz = picked.logsumexp(dim=-1)
    logp = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            source, norm = (picked, logz) if entropy_grad else (picked.detach(), logz.detach())
            entropy = norm - (torch.softmax(source, dim=-1) * source).sum(dim=-1)
    if real is None:
        return logp * batch.mask, entropy

    def spread(values):                                                            # [M] -> [N, Tr], 0 on padding
        return None if values is None else torch.zeros(real.shape, dtype=values.dtype, device=values.device).masked_scatter(real, values)
    return spread(logp), spread(entropy)


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Row indices grouped by similar length, each group with at most `token_budget` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups, current, longest = [], [], 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if current and longest_if * (len(current) + 1) > token_budget:
            groups.append(current)
            current, longest_if = [], lengths[i]
        current.append(i)
        longest = longest_if
    if current:
        groups.append(current)
    return groups


def shared_micro_batches(prompts: list[tuple[int, ...]], response_lengths: list[int], token_budget: int) -> list[list[int]]:
    """Row indices grouped for forwards that share prompts and pack responses
    (`_shared_prompt_hidden`): a prompt's rows together, longest first, so that a prompt is
    forwarded in as few groups as the budget allows. A group costs its distinct prompts' padded
    width once each plus its packed rows (`pack_responses`, as wide as its longest response), at
    most `token_budget` tokens. The groups are as even as their number allows (the smallest
    budget that needs no more of them): two halves rather than a full group and a remnant, which
    would forward a prompt twice and run small products."""
    key: dict[tuple[int, ...], int] = {}
    ids = [key.setdefault(p, len(key)) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (ids[i], -response_lengths[i], i))

    def packed_rows(lengths: list[int], width: int) -> int:
        return len(pack_responses([0] * len(lengths), lengths, width)[0])

    def greedy(budget: int) -> list[list[int]]:
        groups: list[list[int]] = []
        current: list[int] = []
        lengths: dict[int, list[int]] = {}        # the group's response lengths per prompt
        rows: dict[int, int] = {}                 # the group's packed rows per prompt
        p_width = r_width = 0
        for i in order:
            u, n = ids[i], response_lengths[i]
            p_if, r_if = max(p_width, len(prompts[i])), max(r_width, n, 1)
            lengths_if = lengths | {u: lengths.get(u, []) + [n]}
            changed = lengths_if if r_if != r_width else {u: lengths_if[u]}      # a wider row repacks every prompt
            rows_if = rows | {v: packed_rows(ls, r_if) for v, ls in changed.items()}
            if current and len(rows_if) * p_if + sum(rows_if.values()) * r_if > budget:
                groups.append(current)
                current, p_if, r_if = [], len(prompts[i]), max(n, 1)
                lengths_if, rows_if = {u: [n]}, {u: packed_rows([n], r_if)}
            current.append(i)
            lengths, rows, p_width, r_width = lengths_if, rows_if, p_if, r_if
        if current:
            groups.append(current)
        return groups

    groups = greedy(token_budget)
    low, high = 1, token_budget
    while len(groups) > 1 and low < high:              # the smallest budget that needs no more groups
        mid = (low + high) // 2
        if len(greedy(mid)) <= len(groups):
            high = mid
        else:
            low = mid + 1
    return greedy(high) if len(groups) > 1 else groups
