"""Before a run starts: settings checked against what they index, and its peak memory estimated.

Three checks, each an error of one line (exit code 2 from the CLI):

1. **The prompt pool.** `rl.prompts_per_step` may not exceed the prompts `data.train` gives: at
   config-check time against the most the tasks can give without building them
   (`data.pool_per_level` × levels × domains for testbed and reasoning-gym tasks), and once the
   trainer has built the pool against its size. An absurd value is refused before anything is
   allocated for it.
2. **The context.** A rollout is a prompt and up to the cap's new tokens, so every cap the run
   generates under — `rl.max_new_tokens`, a strategy's own caps (SIRI's l_max, ThinkPrune's
   stages, hard truncation), `eval.max_new_tokens` — must be shorter than the model's context
   (`max_position_embeddings`), and an SFT example must fit in it. Checked before loading when
   the model's config.json can be read without loading it (testbed presets, model and run
   directories, builtin: models, hub ids in the local cache, GGUF files already converted), and
   again right after loading, before any rollout.
3. **Memory.** `estimate` adds up what a step holds at its peak — see the function — for the
   model's size and the run's settings, and the run is refused when that exceeds the memory
   available to the process (`available_memory`: /proc/meminfo's MemAvailable, or the cgroup's
   limit less its usage when that is smaller). The error names the estimate, the memory
   available and the setting to lower. `TAUT_NO_PREFLIGHT=1` starts the run anyway. The
   estimate is calibrated against measured peaks (docs/reliability.md, "Inputs that exhaust
   memory") and errs on the generous side by `MARGIN`.

The estimate counts the host's memory on a CPU. On a GPU the weights, optimizer state and
activations live in device memory, where running out raises an error with a message (CUDA's
OutOfMemoryError) rather than the silent SIGKILL of the kernel's OOM killer; the estimate is
then printed for the device and not checked.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from taut.checkpoint import CheckpointError, chosen_checkpoint
from taut.config import (
    LoraConfig,
    ModelConfig,
    ReasoningGymTaskConfig,
    RunConfig,
    TaskSpec,
)
from taut.length import build_strategy
from taut.models.gguf import GGUF_RECORD, PACKAGED_PREFIX, cache_dir, packaged_gguf
from taut.models.loading import resolve_model_path
from taut.models.lora import adapter_base
from taut.models.policy import unwrap
from taut.models.testbed import PRESETS
from taut.rl.logprobs import HEAD_ON_HIDDEN
from taut.tasks import load_task
from taut.tasks.base import TraceTask
from taut.tasks.files import FileTask
from taut.tasks.gym.domains import LEVELS, get_domain
from taut.tasks.gym.task import resolve_domains
from taut.tasks.gym.vocab import VOCAB
from taut.tasks.traces import sft_examples
from taut.tasks.written import DEFAULT_LEVELS, FORMATS, HELD_OUT, resolve_families

if TYPE_CHECKING:
    from taut.models.policy import Policy

log = logging.getLogger(__name__)

GB = 1e9
NO_PREFLIGHT_ENV = "TAUT_NO_PREFLIGHT"
Command = Literal["train", "sft"]


class PreflightError(ValueError):
    """A setting the run cannot honour, or a run that will not fit in memory; says what to lower."""


class ShapeUnknown(Exception):
    """The model's size cannot be read without loading it (the reason is the message)."""


# ---------------------------------------------------------------------------------------------
# the model's size, read from its config.json and safetensors headers (no weights loaded)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    parameters: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context: int | None          # max_position_embeddings; None where the config names none
    head_on_hidden: bool         # the LM head runs on response tokens only (taut.rl.logprobs)
    source: str                  # where the numbers come from, for messages

    @classmethod
    def from_config(cls, cfg: dict, parameters: int | None, source: str) -> ModelShape:
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or hidden // heads
        inter = cfg.get("intermediate_size") or 4 * hidden
        layers, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
        if parameters is None:                          # counted as a Llama-family decoder has them
            qkv = (heads + 2 * kv) * head_dim
            bias = qkv if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2" else 0
            layer = hidden * qkv + bias + heads * head_dim * hidden + 3 * hidden * inter + 2 * hidden
            parameters = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2) + layers * layer + hidden
        context = cfg.get("max_position_embeddings") or cfg.get("n_positions") or cfg.get("max_sequence_length")
        return cls(parameters, hidden, layers, heads, kv, head_dim, inter, vocab, context,
                   cfg.get("model_type") in HEAD_ON_HIDDEN and vocab > hidden, source)

    @classmethod
    def of_policy(cls, policy: Policy) -> ModelShape:
        """The shape of a loaded policy, its parameters counted (the base model's, under LoRA)."""
        base = unwrap(policy.model)
        parameters = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
        return cls.from_config(base.config.to_dict(), parameters, f"{policy.source}/config.json")

    def lora_parameters(self, lora: LoraConfig) -> int:
        """The adapter's trainable parameters: r × (in + out) per adapted projection and layer."""
        attn, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        sizes = {"q_proj": self.hidden + attn, "k_proj": self.hidden + kv, "v_proj": self.hidden + kv, "o_proj": attn + self.hidden,
                 "gate_proj": self.hidden + self.intermediate, "up_proj": self.hidden + self.intermediate,
                 "down_proj": self.intermediate + self.hidden}
        return self.layers * lora.r * sum(sizes.get(name, 0) for name in lora.target_modules)


def read_shape(model: ModelConfig) -> ModelShape:
    """The size of the model `model` names, from files only; `ShapeUnknown` where that needs loading it."""
    if model.preset is not None:
        cfg = {**PRESETS[model.preset], "vocab_size": len(VOCAB), "max_position_embeddings": 512,
               "tie_word_embeddings": True, "model_type": "qwen2"}         # taut.models.testbed.build_testbed_model
        return ModelShape.from_config(cfg, None, f"model.preset={model.preset}")
    directory = _model_dir(model.path)
    cfg = json.loads((directory / "config.json").read_text())
    return ModelShape.from_config(cfg, _stored_parameters(directory), f"{directory / 'config.json'}")


def _model_dir(path: str) -> Path:
    try:
        if path.startswith(PACKAGED_PREFIX) or path.lower().endswith(".gguf"):
            return _converted_gguf(path)
        if (Path(path) / "checkpoints").is_dir():
            return chosen_checkpoint(Path(path))         # loading verifies it
        directory = Path(resolve_model_path(path))       # builtin:, a model directory, a hub id in the local cache
        base = adapter_base(str(directory))
        return _model_dir(base["path"]) if base else directory      # a shipped adapter: its base's shape
    except (FileNotFoundError, CheckpointError) as err:
        raise ShapeUnknown(str(err)) from None


def _converted_gguf(path: str) -> Path:
    """The folder a GGUF file was converted into (taut.models.gguf.gguf_model_dir), found by the file's
    path and size in its record, without hashing or converting."""
    source = (packaged_gguf(path) if path.startswith(PACKAGED_PREFIX) else Path(path).expanduser()).resolve()
    size = source.stat().st_size
    for record in sorted((cache_dir() / "gguf").glob(f"{source.stem}-*/{GGUF_RECORD}")):
        known = json.loads(record.read_text())
        if known.get("source") == str(source) and known.get("bytes") == size:
            return record.parent
    raise ShapeUnknown(f"{path} is converted on its first load")


def _stored_parameters(directory: Path) -> int | None:
    """Parameters in a directory's safetensors files, from their headers (None without them)."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    total = 0
    for name in files:
        if not (directory / name).is_file():
            return None
        with open(directory / name, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        total += sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")
    return total


# ---------------------------------------------------------------------------------------------
# 1. the prompt pool
# ---------------------------------------------------------------------------------------------


def task_bound(spec: TaskSpec, n_per_level: int, levels: list[int] | None) -> int | None:
    """The most problems a task gives RL at `n_per_level` per domain and level (held-out ones
    excluded), known without loading it; None for tasks whose size only loading tells (files)."""
    if isinstance(spec, ReasoningGymTaskConfig):
        if spec.held_out or spec.levels == "curriculum":
            return 0 if spec.held_out else None
        return n_per_level * (len(spec.levels) if spec.levels else 1)
    if not isinstance(spec, str):
        return None
    kind = spec.partition(":")[0]
    if kind == "reasoning-gym":
        return n_per_level
    if kind in FORMATS:                               # written, written2
        families = [f for f in resolve_families(spec) if f not in HELD_OUT]
        return n_per_level * len(families) * len(levels or DEFAULT_LEVELS)
    if kind != "gym":
        return None

    domains = [name for name in resolve_domains(spec) if not get_domain(name).held_out]
    return n_per_level * len(domains) * len([lv for lv in (levels or LEVELS) if lv in LEVELS])


def pool_bound(config: RunConfig) -> int | None:
    """The most prompts `data.train` can give (None when a task's size is known only once loaded)."""
    bounds = [task_bound(spec, config.data.pool_per_level, config.data.levels) for spec in config.data.train]
    return None if None in bounds else sum(bounds)


def check_prompts(config: RunConfig, pool_size: int | None = None) -> None:
    """`rl.prompts_per_step` against the pool: its size once built, else its bound."""
    size = pool_size if pool_size is not None else pool_bound(config)
    wanted = config.rl.prompts_per_step
    if size is None or wanted <= size:
        return
    holds = f"holds {size} prompts" if pool_size is not None else f"can hold at most {size} prompts"
    raise PreflightError(
        f"rl.prompts_per_step={wanted} exceeds the prompt pool: data.train {holds} (data.pool_per_level="
        f"{config.data.pool_per_level} per domain and level), so a step would draw prompts more than once; "
        f"lower rl.prompts_per_step to at most {size}, or train on more prompts")


# ---------------------------------------------------------------------------------------------
# 2. lengths against the context
# ---------------------------------------------------------------------------------------------


def largest_rollout_cap(config: RunConfig) -> tuple[int, str]:
    """The longest cap the run's rollouts and validations are generated under, and the setting
    that gives it: `rl.max_new_tokens`, or a phase strategy's own cap where that is longer."""
    default = config.rl.max_new_tokens
    cap, setting = default, f"rl.max_new_tokens={default}"
    for phase in config.plan():
        strategy = build_strategy(phase.strategy)
        steps = set(range(min(phase.steps, 10_000))) | {phase.steps - 1}     # stages and periods repeat well within
        longest = max(strategy.cap(step, default) for step in steps)
        if longest > cap:
            cap, setting = longest, f"phase {phase.name!r}: the {phase.strategy.name} strategy's cap of {longest}"
    return cap, setting


def check_lengths(config: RunConfig, command: Command, shape: ModelShape, sft_tokens: int | None = None) -> None:
    """Every generation cap shorter than the model's context; the longest SFT example within it."""
    context = shape.context
    if context is None:
        return
    where = f"the model's context of {context} tokens (max_position_embeddings, {shape.source})"
    if command == "train":
        cap, setting = largest_rollout_cap(config)
        if cap >= context:
            raise PreflightError(f"{setting} does not fit {where}: a rollout is its prompt and up to that many new tokens; "
                                 f"set it below {context}, leaving room for the prompts")
    if config.eval.max_new_tokens is not None and config.eval.max_new_tokens >= context:
        raise PreflightError(f"eval.max_new_tokens={config.eval.max_new_tokens} does not fit {where}; set it below {context}")
    if command == "sft" and sft_tokens is not None and sft_tokens > context:
        raise PreflightError(f"data.sft holds an example of {sft_tokens} tokens (prompt and response), longer than {where}: "
                             f"remove the longest examples from the SFT data, or fine-tune a model with a longer context")


# ---------------------------------------------------------------------------------------------
# 3. memory
# ---------------------------------------------------------------------------------------------

# Calibration (docs/reliability.md, "Inputs that exhaust memory", the measurements behind them).
PROCESS_BYTES = 0.55e9        # Python, torch, transformers, tokenizers, the tasks: a testbed run peaks at 0.56 GB
ACTIVATION_SCALE = 1.0        # × the saved tensors counted per token and layer (`_activation_bytes`)
RL_LOGIT_BYTES = 16           # per response token and vocabulary entry in an RL update (bf16 head output,
                              # its fp32 copy, the entropy's softmax, their gradients)
CHECKPOINTED_LAYERS = 6       # with activation checkpointing, the layers' worth of activations a step still peaks at
                              # where the process keeps freed memory (SmolLM2-135M, 16 × 667 tokens: 7.21 GB measured
                              # with LoRA, 12.27 fully fine-tuned: the kept heap's fragments of each recomputation)
CHECKPOINTED_LAYERS_GIVEN_BACK = 1   # the same where freed memory is given back (`taut sft`'s default): one layer's
                              # activations on top of the checkpoints, as the method implies (SmolLM2-135M, 16 × 486,
                              # bf16-mixed: 2.3 GB measured with LoRA, 5.2 fully fine-tuned; 3.6 GB of live tensors
                              # without the undo copy)
LOSS_CHUNK_TOKENS = 1024      # taut.sft's: response tokens whose logits exist at once where the head runs on hidden states
SFT_LOGIT_BYTES = 20          # per token and vocabulary entry in an SFT step (the logits, a contiguous copy, fp32,
                              # log-softmax, gradients)
SAMPLING_BYTES = 12           # per generated row and vocabulary entry at a decode step (logits, probabilities)
ROW_TOKEN_BYTES = 100         # per prompt and response token of a rollout held in Python lists and batch tensors
MARGIN = 0.25                 # the heap's growth past a step's live tensors over a long run (freed memory kept
                              # for reuse, fragments): everything counted but the process × (1 + MARGIN)
KEPT_MARGIN = 0.6             # the same where the process keeps the memory torch frees (model.keep_freed_memory on a
                              # CPU, the default): the SmolLM2 study's control grew to 14.4 GB by step 27 (11.4 GB with
                              # freed memory given back, 32 steps), fragments of every step's tensors kept
TESTBED_PROMPT_TOKENS = 24    # the testbed's longest prompt in its word-level tokens (22 measured, L1 budgets included)
TESTBED_SFT_TOKENS = 160      # its longest SFT example under the default trace mixture (135 in 20,000 traces)
PROMPT_TOKENS_ASSUMED = 64    # before the pool is built: other prompts are assumed this long
SFT_SAMPLE = 2000             # testbed traces measured with the model's own tokenizer for the longest SFT example


@dataclass
class Estimate:
    """A run's estimated peak resident memory, by part (bytes), and the setting to lower for the
    largest part that a setting controls."""

    parts: dict[str, float]
    lower: str
    assumed: list[str] = field(default_factory=list)      # what the estimate assumed, not knowing it
    on_device: bool = False                               # the model runs on a GPU: device memory, not checked

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        shown = ", ".join(f"{name} {value / GB:.1f}" for name, value in sorted(self.parts.items(), key=lambda kv: -kv[1])
                          if value >= 0.05 * GB)
        where = " on the GPU" if self.on_device else ""
        assumed = f"; assuming {', '.join(self.assumed)}" if self.assumed else ""
        return f"estimated peak memory {self.total / GB:.1f} GB{where} ({shown} GB{assumed})"


def _activation_bytes(shape: ModelShape, mixed: bool, width: int) -> float:
    """Bytes a forward keeps for the backward, per token and layer: the RMS norms' fp32 inputs and
    outputs and the residual stream (32 bytes per hidden unit), the projections' inputs cast to
    bf16 under autocast, queries, keys and values before and after the rotary embedding, the
    attention's output, the MLP's gate, up and their product; `width` bytes per element of the
    low-precision tensors (2 under autocast)."""
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    casts = (10 * h + 2 * q + 2 * i) if mixed else 0
    return ACTIVATION_SCALE * (32 * h + casts + (4 * q + 4 * kv + 6 * i) * width)


def precision(model: ModelConfig, gpu: bool) -> tuple[int, bool]:
    """(bytes per weight, whether forwards autocast to bf16), as taut.models.policy.resolve_dtype decides."""
    if model.dtype in ("bfloat16", "float16"):
        return 2, False
    return 4, model.dtype == "bf16-mixed" or (model.dtype == "auto" and gpu)


def estimate(config: RunConfig, command: Command, shape: ModelShape, *, prompt_tokens: int | None = None,
             sft_tokens: int | None = None, gpu: bool = False) -> Estimate:
    """The peak resident memory of `taut train` (`command="train"`) or `taut sft` with this model.

    Held through the run: the process (`PROCESS_BYTES`), the weights, and for the trainable
    parameters (all, or the LoRA adapter's) their gradients, AdamW's two moments and, with
    `undo_nonfinite_steps`, the guard's copy of weights and moments (taut.rl.guard); a KL
    reference model. On top, the largest of:

    - generation: keys and values for the rows generated together (`rl.rollout_rows`, at most
      `prompts_per_step × group_size`) over prompt + cap, with room for the buffers' doubling
      (taut.rollout.fast); the token buffers; the decode step's logits; under autocast the
      decoder's bf16 copy of the weights. Validation generates the same way.
    - the update: one micro-batch's activations (`rl.micro_batch_tokens` tokens, or one rollout
      where that is longer) and its logits over the vocabulary (response tokens only where the
      head runs on hidden states); autocast's bf16 copy of the weights. For SFT:
      `sft.batch_size` × the longest example, with the logits of every position.

    plus every rollout's tokens in Python lists and batch tensors; all but the process × (1 + `MARGIN`).
    `prompt_tokens`: the longest prompt (default: the testbed's, else `PROMPT_TOKENS_ASSUMED`);
    `sft_tokens`: the longest SFT example (default: the testbed's, else the context).
    """
    weight_bytes, mixed = precision(config.model, gpu)
    low = 2 if mixed else weight_bytes
    n, lora = shape.parameters, config.model.lora
    trainable = shape.lora_parameters(lora) if lora else n
    section = config.rl if command == "train" else config.sft
    assumed: list[str] = []
    copies = n * 2 if mixed else 0                    # bf16 weights: the decoder's, autocast's
    kept = config.model.keeps_freed_memory(command) and not gpu
    # the guard's copy: `auto` keeps it for weights below fp32 only (taut.rl.guard)
    snapshot = section.undo_nonfinite_steps is True or (section.undo_nonfinite_steps == "auto" and weight_bytes < 4)
    per_token = _update_bytes_per_token(shape, mixed, low, section.activation_checkpointing, kept)
    held = {"process": 0.0 if gpu else PROCESS_BYTES,
            "model and optimizer": n * weight_bytes + trainable * weight_bytes * (3 + (3 if snapshot else 0))}
    peaks: dict[str, tuple[float, str]] = {}          # phase: (bytes, the setting that bounds it)
    if command == "sft":
        peaks["update"] = _sft_update_peak(config, shape, sft_tokens, copies, per_token, assumed)
    else:
        prompt_tokens = _rl_prompt_tokens(config, shape, prompt_tokens, assumed)
        peaks |= _rl_peaks(config, shape, prompt_tokens, copies, per_token, low)
        held["rollout data"] = config.rl.prompts_per_step * config.rl.group_size * (prompt_tokens + largest_rollout_cap(config)[0]) \
            * ROW_TOKEN_BYTES                 # every rollout's tokens in Python lists and batch tensors
        if config.rl.kl_coef > 0:
            held["reference model"] = n * weight_bytes
    phase = max(peaks, key=lambda name: peaks[name][0])
    parts = {**held, phase: peaks[phase][0]}
    margin = KEPT_MARGIN if kept else MARGIN
    parts["heap margin"] = margin * (sum(parts.values()) - parts["process"])
    advice = {phase: peaks[phase][1],
              "rollout data": f"rl.prompts_per_step or rl.group_size (now {config.rl.prompts_per_step * config.rl.group_size} "
                              f"rollouts a step)",
              "model and optimizer": "model.lora (train a LoRA adapter)" if not lora else "model.path's size (a smaller model)"}
    if not lora and snapshot:
        advice["model and optimizer"] += f", or {command if command == 'sft' else 'rl'}.undo_nonfinite_steps=false"
    if "update" in advice and not section.activation_checkpointing:
        advice["update"] += f", or set {command if command == 'sft' else 'rl'}.activation_checkpointing=true"
    largest = max((name for name in advice if name in parts), key=lambda name: parts[name])
    return Estimate(parts, advice[largest], assumed, gpu)


def _update_bytes_per_token(shape: ModelShape, mixed: bool, low: int, checkpointing: bool, kept: bool) -> float:
    """What a forward keeps for its backward per token. With activation checkpointing each layer
    keeps its fp32 input and recomputes itself in the backward: a step peaks as if one layer's
    activations were kept on top, or, keeping freed memory, CHECKPOINTED_LAYERS' (docs/reliability.md)."""
    if not checkpointing:
        return shape.layers * _activation_bytes(shape, mixed, low)
    layers = min(shape.layers, CHECKPOINTED_LAYERS if kept else CHECKPOINTED_LAYERS_GIVEN_BACK)
    return shape.layers * 4 * shape.hidden + layers * _activation_bytes(shape, mixed, low)


def _sft_update_peak(config: RunConfig, shape: ModelShape, sft_tokens: int | None, copies: float, per_token: float,
                     assumed: list[str]) -> tuple[float, str]:
    """An SFT step's peak on top of what is held: `sft.batch_size` × the longest example, with the
    logits of every position (or, head on hidden states, of one chunk of response tokens)."""
    if sft_tokens is None:
        sft_tokens = TESTBED_SFT_TOKENS if _testbed_lengths(config.data.sft, shape) else (shape.context or TESTBED_SFT_TOKENS)
        if not _testbed_lengths(config.data.sft, shape):
            assumed.append(f"SFT examples of {sft_tokens} tokens")
    tokens = config.sft.batch_size * sft_tokens
    # the logits: of every position, or (head on hidden states) of one chunk of response tokens (taut.sft.response_loss)
    logit_tokens = min(tokens, LOSS_CHUNK_TOKENS) if shape.head_on_hidden else tokens
    return (copies + tokens * per_token + logit_tokens * shape.vocab * SFT_LOGIT_BYTES,
            f"sft.batch_size (now {config.sft.batch_size} examples of up to {sft_tokens} tokens a step)")


def _rl_prompt_tokens(config: RunConfig, shape: ModelShape, prompt_tokens: int | None, assumed: list[str]) -> int:
    """The longest prompt: as given, the testbed's, or an assumption (recorded in `assumed`)."""
    if prompt_tokens is not None:
        return prompt_tokens
    if _testbed_lengths(config.data.train, shape):
        return TESTBED_PROMPT_TOKENS
    assumed.append(f"prompts of {PROMPT_TOKENS_ASSUMED} tokens")
    return PROMPT_TOKENS_ASSUMED


def _rl_peaks(config: RunConfig, shape: ModelShape, prompt_tokens: int, copies: float, per_token: float,
              low: float) -> dict[str, tuple[float, str]]:
    """An RL step's peaks on top of what is held — generation, validation, the update — each with
    the setting that bounds it."""
    rl = config.rl
    cap, _ = largest_rollout_cap(config)
    row = prompt_tokens + cap
    rows = rl.prompts_per_step * rl.group_size
    together = min(rows, max(1, rl.rollout_rows // rl.group_size) * rl.group_size)
    # bf16 rollouts over weights in another precision (rl.rollout_dtype): the decoder's bf16 weights and cache
    gen_copies, gen_low = (shape.parameters * 2, 2) if rl.rollout_dtype == "bf16" and low != 2 else (copies, low)
    kv_per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * gen_low
    sampled = 12 if rl.records_rollout_logprobs else 8                          # token ids (+ log-probs) per row and step
    peaks = {"generation": (gen_copies + together * (1.5 * row * kv_per_token + cap * sampled + shape.vocab * SAMPLING_BYTES),
                            f"rl.group_size (now {rl.group_size}: a prompt's rollouts are generated together)"
                            if rl.group_size > rl.rollout_rows else
                            f"rl.rollout_rows (now {together} rollouts generated together) or rl.max_new_tokens")}
    val_rows = min(_validation_rows(config), rl.rollout_rows)
    if val_rows:
        peaks["validation"] = (gen_copies + val_rows * (1.5 * (prompt_tokens + rl.max_new_tokens) * kv_per_token
                                                    + shape.vocab * SAMPLING_BYTES),
                               "validation.n_per_level or validation.samples")
    micro = min(max(rl.micro_batch_tokens, row), rows * row)                   # tokens in one micro-batch
    logits = (min(micro, rows * cap) if shape.head_on_hidden else micro) * shape.vocab * RL_LOGIT_BYTES
    peaks["update"] = (copies + micro * per_token + logits,
                       f"rl.micro_batch_tokens (now {rl.micro_batch_tokens})" if rl.micro_batch_tokens >= row
                       else f"rl.max_new_tokens (one rollout of {row} tokens is a micro-batch)")
    return peaks


def _is_gym(spec: TaskSpec) -> bool:
    return isinstance(spec, str) and spec.partition(":")[0] == "gym"


def _testbed_lengths(specs: list[TaskSpec], shape: ModelShape) -> bool:
    """Whether the testbed's known lengths apply: testbed tasks read by the testbed's tokenizer."""
    return all(_is_gym(s) for s in specs) and shape.vocab == len(VOCAB)


def _validation_rows(config: RunConfig) -> int:
    """Rollouts a validation generates (0 without validation); a bound where the tasks tell one."""
    v = config.validation
    if not v.every:
        return 0
    bounds = [task_bound(spec, v.n_per_level, config.data.levels) for spec in (v.tasks or config.data.train)]
    return (config.rl.rollout_rows if None in bounds else sum(bounds)) * v.samples


MEMINFO = Path("/proc/meminfo")


def available_memory() -> tuple[float, str] | None:
    """Bytes this process may still take, and where the number comes from: MemAvailable, or
    the cgroup's limit less its usage where that is smaller; None where neither is known."""
    found: list[tuple[float, str]] = []
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    except OSError:
        pass
    limit = _cgroup_limit()
    if limit is not None:
        found.append(limit)
    return min(found) if found else None


def _cgroup_limit() -> tuple[float, str] | None:
    """The memory limit of this process's cgroup less its usage (the reclaimable page cache,
    inactive_file, not counted as used): cgroup v2's memory.max and memory.current, or v1's
    memory.limit_in_bytes and memory.usage_in_bytes; None without a limit."""
    try:
        groups = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if "memory" in groups:                                  # v1
        directory = Path("/sys/fs/cgroup/memory") / groups["memory"].lstrip("/")
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    elif "" in groups:                                      # v2
        directory = Path("/sys/fs/cgroup") / groups[""].lstrip("/")
        names = ("memory.max", "memory.current", "inactive_file")
    else:
        return None
    try:
        limit = (directory / names[0]).read_text().strip()
        used = int((directory / names[1]).read_text())
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if limit == "max" or int(limit) >= 2**60:               # no limit (v1 writes a huge number)
        return None
    used -= int(stat.get(names[2], 0))
    return int(limit) - used, f"the cgroup limit {int(limit) / GB:.1f} GB ({directory / names[0]}) less {used / GB:.1f} GB in use"


def check_memory(estimated: Estimate, resident: float = 0.0) -> str:
    """Refuse a run whose estimate exceeds the memory available (`resident`: what the process
    already holds, part of the estimate); returns the line to show otherwise. With
    TAUT_NO_PREFLIGHT=1 the refusal is a warning."""
    if estimated.on_device:
        return estimated.describe()
    available = available_memory()
    if available is None:
        return f"{estimated.describe()}; the memory available is unknown here (no /proc/meminfo)"
    free, source = available
    reachable = free + resident
    line = f"{estimated.describe()}; {reachable / GB:.1f} GB available ({source})"
    if estimated.total <= reachable:
        return line
    message = (f"{estimated.describe()} exceeds the {reachable / GB:.1f} GB available ({source}): lower {estimated.lower}; "
               f"or set {NO_PREFLIGHT_ENV}=1 to start anyway (docs/reliability.md, \"Inputs that exhaust memory\")")
    if os.environ.get(NO_PREFLIGHT_ENV, "") not in ("", "0"):
        log.warning("%s=1: starting although %s", NO_PREFLIGHT_ENV, message)
        return line
    raise PreflightError(message)


def current_rss() -> float:
    """This process's resident memory now (VmRSS), 0 where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


# ---------------------------------------------------------------------------------------------
# the checks, where the commands and loops make them
# ---------------------------------------------------------------------------------------------


def _on_gpu(model: ModelConfig) -> bool:
    if model.device == "auto":
        import torch

        return torch.cuda.is_available()
    return model.device != "cpu"


def before_load(config: RunConfig, command: Command) -> str:
    """What the CLI checks before loading anything, --dry-run included: the pool's bound, the
    caps against the context and the memory estimate, where the model's files tell its size.
    Returns the line that states the estimate and the memory available."""
    if command == "train":
        check_prompts(config)
    try:
        shape = read_shape(config.model)
    except ShapeUnknown as err:
        return f"memory estimate: made once the model is loaded ({err})"
    check_lengths(config, command, shape)
    if command == "sft" and not _testbed_lengths(config.data.sft, shape):
        return "memory estimate: made once the model's tokenizer has measured the SFT examples"
    return check_memory(estimate(config, command, shape, gpu=_on_gpu(config.model)))


def after_load(config: RunConfig, command: Command, policy: Policy) -> None:
    """Right after loading the model: every cap against its context; for SFT, the longest
    example against it and the memory estimate with that length."""
    shape = ModelShape.of_policy(policy)
    if command == "train":
        check_lengths(config, "train", shape)
        return
    longest = longest_sft_example(config, policy)
    check_lengths(config, "sft", shape, sft_tokens=longest)
    check_memory(estimate(config, "sft", shape, sft_tokens=longest, gpu=policy.model.device.type != "cpu"), current_rss())


def after_pool(config: RunConfig, policy: Policy, prompts: list[str]) -> None:
    """Once the trainer has built its prompt pool: `rl.prompts_per_step` against its size, and
    the memory estimate with its longest prompt."""
    check_prompts(config, len(prompts))
    longest = longest_tokens(prompts, lambda text: len(policy.encode_prompt(text)), _prompt_overhead(policy))
    shape = ModelShape.of_policy(policy)
    check_memory(estimate(config, "train", shape, prompt_tokens=longest, gpu=policy.model.device.type != "cpu"), current_rss())


def longest_tokens(texts: list[str], count, overhead: int) -> int:
    """The most tokens `count` gives any of `texts`, counting only those that could beat the
    longest so far: no tokenizer makes more tokens of a text than its UTF-8 bytes plus the
    `overhead` it adds (a chat template, <bos>)."""
    best = 0
    for text in sorted(set(texts), key=lambda t: -len(t.encode())):
        if len(text.encode()) + overhead <= best:
            break
        best = max(best, count(text))
    return best


def _prompt_overhead(policy: Policy) -> int:
    """Bytes a prompt's encoding adds to the prompt's own: the chat template's text, and two
    special tokens (<bos>, a prefix space)."""
    if not policy.chat:
        return 2
    empty = policy.tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False)
    return len(empty.encode()) + 2


def longest_sft_example(config: RunConfig, policy: Policy) -> int:
    """Tokens of the longest SFT example, prompt and response, as `policy` encodes them: every
    train row of a data file; for traces drawn afresh at every step (the testbed's, written
    arithmetic's) the longest of `SFT_SAMPLE` drawn."""
    import random

    separator = "\x00"                # joins a pair into one text for `longest_tokens`; never in data
    overhead = _prompt_overhead(policy) + 2           # + the response's <eos>
    pairs: list[tuple[str, str]] = []
    gym = [spec for spec in config.data.sft if _is_gym(spec)]
    if gym:
        only_gym = config.model_copy(update={"data": config.data.model_copy(update={"sft": gym})})
        pairs += sft_examples(only_gym, random.Random(f"preflight:{config.seed}"), SFT_SAMPLE)
    for spec in config.data.sft:
        task = None if _is_gym(spec) else load_task(spec, config.data.levels)
        if isinstance(task, FileTask):
            pairs += task.sft_pairs()
        elif isinstance(task, TraceTask):             # traces drawn afresh, as the testbed's
            pairs += task.sft_examples(random.Random(f"preflight:{config.seed}"), SFT_SAMPLE)
    return longest_tokens([f"{p}{separator}{r}" for p, r in pairs],
                          lambda text: _pair_tokens(policy, text.split(separator, 1)), overhead)


def _pair_tokens(policy: Policy, pair: list[str]) -> int:
    return len(policy.encode_prompt(pair[0])) + len(policy.encode_response(pair[1]))
