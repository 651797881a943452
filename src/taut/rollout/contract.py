"""What a decode path owes the trainer under bf16: logits within a stated tolerance of the model's
own forward, and greedy tokens equal to `model.generate` up to the first near-tie.

Why not bit-equal tokens. Under bf16 two correct implementations of one forward round
differently (another kernel, another order of the same sums), and a greedy chain follows the
first argmax that flips. Training does not need the rollout engine's logits to be the
trainer's: the update recomputes every log-probability with the model's own forward, and the
difference between the two distributions is measured (`sampling_gap`) and corrected with
truncated importance weights (`rl.rollout_is`). So in fp32 the fast path still gives
`model.generate`'s greedy tokens exactly (tests/test_rollout_engine.py), and under bf16 it is
held to this contract instead:

- at every decode step, each logit is within `TOLERANCE_ULPS` bf16 units of the model's forward
  on the same prefix, a unit being the bf16 spacing at the row's largest |logit| (2^(e−7) for a
  largest magnitude in [2^e, 2^(e+1)): 0.125 for logits up to 32, 0.25 up to 64);
- greedy tokens equal `model.generate`'s up to the first step where the reference's top two
  logits are within the tolerance of each other (there either path may pick either).

The tolerance, 8 units: Hugging Face's own cached decode — the reference implementation — is up
to 4.5 units from the full forward on SmolLM2-135M's 30 layers over 32 steps (1 unit on the
0.53M testbed model), from rounding alone; 8 leaves room for a path that rounds differently by
the same order. Faults, measured (tests/test_decode_contract.py, 24 steps): a rotary position
off by one is 140–200 units away, an attention scale 25 % off 47–49; one 5 % off sits at the
bound (8.0 units on SmolLM2, 12 on the testbed model) — the contract catches gross faults, not
every subtle one, which the fp32 token-equality tests still do.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from taut.rollout.hf import _HFCache, left_padded

TOLERANCE_ULPS = 8.0


def bf16_units(deviation: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """`deviation` [..., V] in bf16 units at the scale of each row of `reference` [..., V]."""
    scale = reference.abs().amax(-1, keepdim=True).clamp(min=2.0**-126)
    return deviation / torch.exp2(torch.floor(torch.log2(scale)) - 7)


@torch.inference_mode()
def greedy_trace(cache, ids: torch.Tensor, mask: torch.Tensor, steps: int, autocast=contextlib.nullcontext):
    """Greedy decoding through a decode path's cache object (`FastDecoder`, or the generic
    path's): the tokens [R, steps] and the logits each was chosen from [R, steps, V] (fp32)."""
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    with autocast():
        logits = cache.prefill(ids, mask, position, steps)
        chosen, seen = [], []
        next_position = mask.sum(-1)
        for t in range(steps):
            seen.append(logits.float())
            token = logits.argmax(-1)
            chosen.append(token)
            if t < steps - 1:
                logits = cache.step(token, next_position)
                next_position = next_position + 1
    return torch.stack(chosen, 1), torch.stack(seen, 1)


@torch.inference_mode()
def reference_logits(model, ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, autocast=contextlib.nullcontext):
    """The model's own forward over prompt + `tokens`: the logits [R, steps, V] (fp32) that
    chose each token, every prefix at once."""
    full = torch.cat([ids, tokens], 1)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], 1)
    position = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with autocast():
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=position).logits
    width = ids.shape[1]
    return logits[:, width - 1 : width - 1 + tokens.shape[1]].float()


@dataclass
class ContractCheck:
    deviation_ulps: torch.Tensor     # [steps]: the largest deviation at each step, in bf16 units
    near_tie_step: list[int | None]  # per row: the first step whose reference top-2 margin is within 2 × tolerance
    tokens_agree: bool               # greedy tokens equal the reference tokens up to each row's near tie
    tolerance: float

    @property
    def max_ulps(self) -> float:
        return float(self.deviation_ulps.max())

    @property
    def holds(self) -> bool:
        return self.max_ulps <= self.tolerance and self.tokens_agree


def check(model, cache, prompts: list[list[int]], pad_id: int, steps: int, autocast=contextlib.nullcontext,
          tolerance: float = TOLERANCE_ULPS) -> ContractCheck:
    """Decode `prompts` greedily through `cache` (a decode path's cache object, fresh), compare
    every step's logits with the model's forward on the same prefix, and its tokens with
    Hugging Face's own cached decode — `model.generate`'s arithmetic, the generic path — up to
    each row's first near tie."""
    ids, mask = left_padded(prompts, pad_id, model.device)
    tokens, logits = greedy_trace(cache, ids, mask, steps, autocast)
    expected, _ = greedy_trace(_HFCache(model), ids, mask, steps, autocast)
    reference = reference_logits(model, ids, mask, tokens, autocast)
    units = bf16_units((logits - reference).abs(), reference)                  # [R, steps, V]
    top2 = reference.topk(2, dim=-1).values
    margin = bf16_units((top2[..., 0] - top2[..., 1]).unsqueeze(-1), reference).squeeze(-1)   # [R, steps]
    near = [next((t for t in range(steps) if margin[r, t] <= tolerance), None) for r in range(tokens.shape[0])]
    agree = all(torch.equal(tokens[r, : (steps if n is None else n)], expected[r, : (steps if n is None else n)])
                for r, n in enumerate(near))
    return ContractCheck(units.amax(dim=(0, 2)), near, agree, tolerance)
