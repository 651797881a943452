"""Typed configuration: one pydantic model per component, YAML recipes, `--set` overrides.

A recipe is a YAML mapping whose top-level keys are the fields of `RunConfig`. Every command
reads the sections it needs. Unknown or misspelled keys are errors naming the key, the file
and line where it stands, and the valid keys.

Numbers are checked for sense, not only type: every float is finite (`Strict`), learning rates
lie in (0, 1] (above that AdamW moves each weight by more than its typical size per step),
Adam betas in [0, 1), the PPO lower clip in [0, 1), sampling temperatures above 0 (0 = greedy
where evaluation allows it).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

import yaml
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from taut.length import REGISTRY, StrategyConfig
from taut.length.none import NoneConfig
from taut.schema import Strict


def _betas(v: tuple[float, float]) -> tuple[float, float]:
    if not all(0 <= b < 1 for b in v):
        raise ValueError(f"Adam betas must each lie in [0, 1), got {v}")
    return v


class ConfigError(ValueError):
    """A recipe or override that does not validate; the message says where and what to do."""


# ---------------------------------------------------------------------------------------------
# components
# ---------------------------------------------------------------------------------------------


class LoraConfig(Strict):
    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class ModelConfig(Strict):
    """Which model to start from. A plain string is shorthand for `path`."""

    path: str | None = Field(None, description="local directory, run directory, hub id in the local cache, or builtin:<name>")
    preset: Literal["tiny", "small"] | None = Field(None, description="build a testbed model from a config, random weights")
    dtype: Literal["auto", "float32", "bf16-mixed", "bfloat16", "float16"] = Field(
        "auto", description="auto: fp32 on CPU; fp32 weights with bf16 autocast on GPU (= bf16-mixed); bfloat16/float16: pure")
    device: str = Field("auto", description="auto, cpu, cuda, cuda:1, …")
    threads: int | None = Field(None, gt=0, description="CPU threads for torch (default: all cores)")
    keep_freed_memory: bool | None = Field(
        None, description="on a CPU (Linux, glibc): true: memory torch frees stays in the process for the next step, not "
                          "given back to the kernel and faulted in again (faster RL updates); false: blocks of 1 MB and more "
                          "are given back when freed, so resident memory follows the live tensors; unset: given back by "
                          "`taut sft`, kept by the other commands (taut.allocator)")
    lora: LoraConfig | None = None
    chat_template: Literal["auto", "none"] = Field("auto", description="auto: use the tokenizer's chat template if it has one")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value

    def keeps_freed_memory(self, command: str) -> bool:
        """`keep_freed_memory` as `taut COMMAND` applies it: unset, an SFT gives freed memory back
        (16 × 512 tokens of SmolLM2, fully fine-tuned: 5.2 GB against more than 7.5 GB kept, growing,
        docs/real-models.md) and the other commands keep it (RL updates 1.6–2.0× as fast)."""
        return self.keep_freed_memory if self.keep_freed_memory is not None else command != "sft"

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.preset is None):
            raise ValueError("set exactly one of model.path and model.preset")
        return self


class MixtureConfig(Strict):
    """How testbed SFT traces are written (see docs/testbed.md)."""

    p_direct: float = Field(0.5, ge=0, le=1, description="share of traces that answer without steps")
    p_direct_easy: float | None = Field(None, ge=0, le=1, description="that share on problems whose minimal response is "
                                        "the direct answer (level 1 of most domains); default: p_direct")
    rounds: list[float] = Field(default_factory=lambda: [0.3, 0.3, 0.4], description="P(0, 1, 2, … post-answer rounds)")

    @field_validator("rounds")
    @classmethod
    def _distribution(cls, v: list[float]) -> list[float]:
        if not v or any(p < 0 for p in v) or abs(sum(v) - 1) > 1e-6:
            raise ValueError(f"rounds must be probabilities summing to 1, got {v}")
        return v


class ColumnMap(Strict):
    """Which column of a data file holds what."""

    prompt: str = "prompt"
    answer: str = "answer"
    response: str | None = Field(None, description="a worked response, for SFT")
    domain: str | None = None
    difficulty: str | None = None
    id: str | None = Field(None, description="a stable problem id (default: the row number; splits then hash the prompt)")


class FileTaskConfig(Strict):
    """A task read from a file: JSONL, Parquet, CSV, or a `datasets` dataset saved on disk."""

    path: str
    format: Literal["auto", "jsonl", "parquet", "csv", "datasets"] = "auto"
    columns: ColumnMap = Field(default_factory=ColumnMap)
    verifier: Literal["math", "exact"] = "math"
    name: str | None = Field(None, description="task name in reports (default: the file name)")
    held_out: bool = Field(False, description="evaluated only; RL never trains on it")
    split: Literal["train", "validation", "test"] | None = Field(
        None, description="the split this file holds; default: rows are assigned to splits by a hash of their id")


class ReasoningGymTaskConfig(Strict):
    """A reasoning-gym task with its settings (taut.tasks.reasoning_gym); the plain string
    `reasoning-gym:<name>` is the same task with the library's defaults."""

    task: str = Field(pattern=r"^reasoning-gym:\w+$", description="reasoning-gym:<name>, e.g. reasoning-gym:chain_sum")
    config: dict[str, Any] = Field(default_factory=dict, description="the library's config fields, for every level")
    levels: dict[int, dict[str, Any]] | Literal["curriculum"] | None = Field(
        None, description="difficulty level -> config fields; curriculum: the library's curriculum levels; default: one level")
    answer_format: Literal["boxed", "answer-tags", "answer-line"] = Field(
        "boxed", description="how the prompt asks for the final answer, and the only form read")
    instruction: str | None = Field(None, description="the line after the question (default: the answer format's line)")
    fallback_last_number: bool | None = Field(      # None, not True: a boxed task written to config.yaml reads back
        None, description="answer-line only: a response without an 'Answer:' line answers its last number (default: true)")
    name: str | None = Field(None, description="task name in reports (default: the library's name)")
    held_out: bool = Field(False, description="evaluated only; RL never trains on it")
    partial_credit: bool = Field(
        False, description="reward the library's partial scores (a policy learns to pad answers); default: correctness only")

    @field_validator("instruction")
    @classmethod
    def _instruction_text(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("instruction is empty: write the line the prompt should end with, or omit it "
                             "for the answer format's own line")
        return v if v is None else v.strip()

    @model_validator(mode="after")
    def _fallback_needs_answer_line(self):
        if self.fallback_last_number is not None and self.answer_format != "answer-line":
            raise ValueError(f"fallback_last_number applies to answer_format: answer-line only (this task reads "
                             f"{self.answer_format}); remove it or set answer_format: answer-line")
        return self

    @property
    def reads_last_number(self) -> bool:
        """Whether a response without an 'Answer:' line answers its last number."""
        return self.answer_format == "answer-line" and self.fallback_last_number is not False


def _task_kind(value: Any) -> str:
    """Which form a task spec takes, so that a bad one is reported against that form only."""
    if isinstance(value, dict):
        return "reasoning-gym" if "task" in value else "file"
    if isinstance(value, (FileTaskConfig, ReasoningGymTaskConfig)):
        return "file" if isinstance(value, FileTaskConfig) else "reasoning-gym"
    return "str"


TASK_FORMS = {"file": FileTaskConfig, "reasoning-gym": ReasoningGymTaskConfig}
TaskSpec = Annotated[Union[Annotated[str, Tag("str")], Annotated[FileTaskConfig, Tag("file")],
                           Annotated[ReasoningGymTaskConfig, Tag("reasoning-gym")]], Discriminator(_task_kind)]


class DataConfig(Strict):
    train: list[TaskSpec] = Field(default_factory=lambda: ["gym:train"], description="tasks RL trains on")
    eval: list[TaskSpec] = Field(default_factory=lambda: ["gym:all"], description="tasks evaluated")
    sft: list[TaskSpec] = Field(default_factory=lambda: ["gym:all"], description="tasks the SFT cold start covers")
    levels: list[int] | None = Field(None, description="difficulty levels to use (default: all)")
    pool_per_level: int = Field(200, gt=0, description="RL prompt pool: train-split problems per domain and level")
    max_prompt_tokens: int | None = Field(
        None, gt=0, description="longer prompts in data files are skipped at load, with a warning naming how many and the first; "
                                "default: the model's context length minus rl.max_new_tokens (the context itself when the cap reaches it)")
    seed: int = 0
    mixture: MixtureConfig = Field(default_factory=MixtureConfig)


UNDO_DESCRIPTION = (
    "keep a copy of the trainable weights and their optimizer state before each step, to undo a step whose weights become "
    "non-finite (it costs three times the trainable weights: 1.6 GB for a 135M-parameter model; a non-finite gradient is "
    "skipped either way, and non-finite weights with no copy stop the run). auto: only where a step can overflow the "
    "weights from a finite gradient — weights in bf16/fp16, or a learning rate far outside the usual; fp32 weights under "
    "AdamW with the gradient clipped cannot overflow (taut.rl.guard), so auto keeps no copy for them")


class SFTConfig(Strict):
    steps: int = Field(2000, ge=0)
    batch_size: int = Field(64, gt=0)
    lr: float = Field(3e-3, gt=0, le=1)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = Field(0.01, ge=0)
    warmup_steps: int = Field(30, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine decay floor, as a fraction of lr")
    grad_clip: float = Field(1.0, gt=0)
    bucket_batches: int = Field(4, gt=0, description="batches drawn together and sorted by length (less padding)")
    activation_checkpointing: bool = Field(
        False, description="keep each decoder layer's input for the backward and recompute the layer in it (Hugging Face's "
                           "gradient checkpointing): less activation memory for more compute, the same numbers "
                           "(docs/real-models.md, 'SFT from files', has the measured peaks)")
    log_every: int = Field(50, gt=0)
    checkpoint_every: int = Field(500, gt=0)
    checkpoint_minutes: float | None = Field(
        10.0, gt=0, description="also write a checkpoint once this many minutes have passed since the last one, so a killed "
                                "run loses at most that much; only the newest of these timed checkpoints is kept (the "
                                "checkpoint_every ones all stay); null: by steps only")
    val_every: int | None = Field(None, gt=0, description="log the loss on held-back validation-split examples every this "
                                                          "many steps (and at 0 and the end): where to stop SFT before RL")
    val_examples: int = Field(256, gt=0, description="validation examples (drawn once from the validation split)")
    max_nonfinite_skips: int = Field(3, ge=1, description="stop after this many optimizer steps in a row skipped for NaN/inf")
    undo_nonfinite_steps: bool | Literal["auto"] = Field(
        "auto", description=UNDO_DESCRIPTION)

    _betas_in_range = field_validator("betas")(_betas)


class RLConfig(Strict):
    engine: Literal["hf", "vllm"] = Field("hf", description="rollout engine: taut's HF sampler, or vLLM (GPU extra)")
    rollout_rows: int = Field(1024, gt=0, description="rollouts generated together; more are generated in chunks")
    fast_decode: bool = Field(True, description="hf engine: the preallocated decode path for Llama-family models (false: the generic path)")
    rollout_dtype: Literal["auto", "bf16"] = Field(
        "auto", description="hf engine: the precision rollouts are generated in. auto: the model's (model.dtype); bf16: "
                            "bf16 products over the fp32 weights (autocast, as under bf16-mixed) while the update stays in "
                            "model.dtype — on a CPU with AMX about a fifth of fp32 generation's time; the log-probs the update "
                            "uses are still recomputed by the model's forward, and rollout_is corrects the sampling gap; "
                            "validation generates with the same engine, `taut eval` in model.dtype (docs/performance.md)")
    steps: int | None = Field(None, ge=0, description="RL steps; default: the sum of the phases' steps (100 without phases)")
    prompts_per_step: int = Field(16, gt=0)
    group_size: int = Field(8, ge=2, description="rollouts per prompt (G)")
    max_new_tokens: int = Field(128, gt=0, description="rollout cap when the strategy sets none")
    min_new_tokens: int = Field(0, ge=0, description="forbid <eos> before this many tokens (throughput benchmarks at forced length)")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1, description="must be 1: the trained log-probs are those of the full tempered distribution")
    lr: float = Field(2e-4, gt=0, le=1)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, ge=0, lt=1, description="ε_low: the ratio's lower clip is 1 − ε_low; acts only with updates_per_batch > 1 (with one update the ratio is 1)")
    clip_high: float = Field(0.28, ge=0, description="ε_high; acts only with updates_per_batch > 1")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    adv_norm: Literal["group", "batch", "batch-centred", "none"] | None = Field(
        None, description="divide advantages by the group std, the batch std, the batch std of the group-centred "
                          "rewards (REINFORCE++-baseline), or nothing (Dr. GRPO); "
                          "default: what the strategy requires (none for sigmoid), else group")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the policy at the start of the current phase; 0 = no reference model")
    entropy_coef: float = Field(0.0, ge=0)
    dynamic_sampling: bool = Field(True, description="drop groups whose shaped rewards are all equal; resample to refill")
    max_sampling_rounds: int = Field(3, ge=1, description="generation rounds per step to refill a dynamic-sampling batch")
    updates_per_batch: int = Field(1, ge=1, description="optimizer updates per rollout batch (>1 uses old log-probs)")
    micro_batch_tokens: int = Field(2048, gt=0, description="padded tokens per forward/backward micro-batch (rows sorted by length; "
                                                             "with share_prompts, a prompt's rows together and their responses packed)")
    activation_checkpointing: bool = Field(
        False, description="keep each decoder layer's input for the backward and recompute the layer in it (Hugging Face's "
                           "gradient checkpointing): less activation memory for more compute, the same numbers "
                           "(docs/real-models.md, 'SFT from files', has the measured peaks)")
    share_prompts: bool = Field(
        True, description="forward each distinct prompt of a micro-batch once and its rollouts' responses against its keys and "
                          "values, instead of every row its own copy (Llama-family models with sdpa attention, no sliding window "
                          "and a vocabulary wider than the hidden state; the same arithmetic, rounded differently; micro-batches then count a "
                          "prompt's tokens once, and its responses are packed end to end in rows as wide as the longest, so that "
                          "rollouts of different lengths are not each padded to it)")
    rollout_logprobs: bool = Field(
        False, description="record each sampled token's log-prob in the engine and log the sampling gap: mean and max "
                           "|log π_rollout − log π_train| per token (the engine's numerics against the trainer's)")
    rollout_is: Literal["none", "token-truncate"] = Field(
        "none", description="correct for the sampling gap: weight each token's policy-gradient term by "
                            "min(π_train / π_rollout, rollout_is_cap), truncated importance sampling as verl's rollout "
                            "correction does (records the log-probs, as rollout_logprobs)")
    rollout_is_cap: float = Field(2.0, gt=1, description="rollout_is: the importance weight's upper bound")
    checkpoint_every: int = Field(50, gt=0)
    checkpoint_minutes: float | None = Field(
        10.0, gt=0, description="also write a checkpoint once this many minutes have passed since the last one (not at a "
                                "phase's last step), so a killed run loses at most that much; only the newest of these timed "
                                "checkpoints is kept; null: by steps only")
    keep_checkpoints: int | None = Field(None, gt=0, description="keep only the newest N step checkpoints (phase-boundary and best ones are kept)")
    max_nonfinite_skips: int = Field(3, ge=1, description="stop after this many optimizer steps in a row skipped for NaN/inf "
                                                           "(each skipped step is undone and counted)")
    undo_nonfinite_steps: bool | Literal["auto"] = Field(
        "auto", description=UNDO_DESCRIPTION)

    _betas_in_range = field_validator("betas")(_betas)

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        """`rl.log_every` was accepted and never read (every step writes its metrics line): configs
        saved with it — every run's config.yaml before 2026-12-07 — still load, without it."""
        if isinstance(data, dict) and "log_every" in data:
            data = {k: v for k, v in data.items() if k != "log_every"}
        return data

    @field_validator("top_p")
    @classmethod
    def _full_distribution(cls, v: float) -> float:
        if v < 1:
            raise ValueError("rl.top_p below 1 is not supported: the trainer's log-probs are those of the full "
                             "distribution at rl.temperature, and nucleus sampling would train another policy than the "
                             "one that sampled; set rl.top_p=1 (evaluation may use eval.top_p)")
        return v

    @model_validator(mode="after")
    def _rollout_dtype_engine(self) -> "RLConfig":
        if self.rollout_dtype != "auto" and self.engine != "hf":
            raise ValueError(f"rl.rollout_dtype={self.rollout_dtype} applies to the hf engine; vLLM generates in its own "
                             f"dtype (set rl.rollout_dtype=auto, or rl.engine=hf)")
        return self

    @property
    def records_rollout_logprobs(self) -> bool:
        """Whether the engine returns sampled tokens' log-probs (to log the gap, or to correct for it)."""
        return self.rollout_logprobs or self.rollout_is != "none"

    # The narrow views each stage of a step reads (taut.rl): sampling, the loss, the update.

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.prompts_per_step, self.group_size, self.temperature, self.top_p, self.min_new_tokens,
                                self.records_rollout_logprobs, self.dynamic_sampling, self.max_sampling_rounds)

    @property
    def loss(self) -> LossSettings:
        return LossSettings(self.loss_agg, self.temperature, self.clip_low, self.clip_high, self.kl_coef, self.entropy_coef,
                            self.rollout_is, self.rollout_is_cap, self.updates_per_batch)

    @property
    def update(self) -> UpdateSettings:
        return UpdateSettings(self.updates_per_batch, self.micro_batch_tokens, self.share_prompts, self.grad_clip,
                              self.entropy_coef > 0, self.rollout_is != "none")


@dataclass(frozen=True)
class SamplingSettings:
    """What generating a step's groups reads (`rl.*`)."""

    prompts_per_step: int
    group_size: int
    temperature: float
    top_p: float
    min_new_tokens: int
    logprobs: bool                  # the engine returns each sampled token's log-prob
    dynamic_sampling: bool
    max_sampling_rounds: int


@dataclass(frozen=True)
class LossSettings:
    """What an objective's loss reads (`rl.*`)."""

    loss_agg: str
    temperature: float              # log π of the distribution the rollouts were sampled from
    clip_low: float
    clip_high: float
    kl_coef: float
    entropy_coef: float
    rollout_is: str
    rollout_is_cap: float
    updates_per_batch: int


@dataclass(frozen=True)
class UpdateSettings:
    """What the optimizer step reads (`rl.*`)."""

    updates_per_batch: int
    micro_batch_tokens: int
    share_prompts: bool
    grad_clip: float
    entropy_grad: bool              # the entropy term has a coefficient: its gradient is needed
    rollout_is: bool                # the sampling gap is corrected (its truncated share is reported)


class EvalConfig(Strict):
    tasks: list[TaskSpec] | None = Field(None, description="default: data.eval")
    split: Literal["train", "validation", "test"] = "test"
    n_per_level: int = Field(100, gt=0, description="problems per domain and level (fewer where the split has fewer)")
    samples: int = Field(4, gt=0, description="samples per problem (accuracy is their mean)")
    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int | None = Field(None, gt=0, description="default: rl.max_new_tokens")
    budgets: list[int] = Field(default_factory=lambda: [8, 16, 24, 32, 48, 64, 96, 128])
    batch_size: int = Field(512, gt=0, description="rollouts generated together")
    prefill: str | None = Field(
        None, min_length=1, description="text every response starts with, counted and graded as response (e.g. 'Answer:' "
                                        "forces a direct answer on written arithmetic: what thinking is worth)")


class StopRules(Strict):
    """Collapse detectors for a phase. A tripped detector ends the phase early and rolls back."""

    accuracy_drop: float | None = Field(None, gt=0, description="δ: validation accuracy below the phase start's − δ")
    entropy_ratio: float | None = Field(None, gt=0, lt=1, description="entropy (moving mean) below this × the phase start's")
    grad_norm_spike: float | None = Field(None, gt=1, description="grad norm above this × its running median in the phase")
    patience: int = Field(1, ge=1, description="consecutive checks a detector must trip before it fires")
    window: int = Field(5, ge=1, description="steps in the entropy moving mean, and the minimum history for the spike median")


class SelectionConfig(Strict):
    """How a checkpoint is chosen among validated ones (after a rollback, and for the run)."""

    criterion: Literal["shortest-within", "best-accuracy", "last-good", "last"] = Field(
        "shortest-within", description="shortest-within: fewest validation tokens among those within tolerance of the reference accuracy")
    tolerance: float = Field(0.02, ge=0, description="accuracy below the reference allowed for a candidate")
    reference: Literal["start", "best"] = Field("start", description="reference accuracy: the start of the phase (run), or the best seen")


class SamplerConfig(Strict):
    """Which prompts a phase draws: plain shuffled epochs, or a mix of mastered and unmastered ones."""

    mastered_fraction: float | Literal["adaptive"] | None = Field(
        None, description="share of each batch drawn from mastered prompts; adaptive: the pool's current mastery rate, clipped")
    adaptive_bounds: tuple[float, float] = Field((0.25, 0.75), description="clip range of the adaptive share")
    mastery_threshold: float = Field(1.0, gt=0, le=1, description="a prompt is mastered when its latest pass rate is at least this")

    @field_validator("mastered_fraction")
    @classmethod
    def _fraction(cls, v):
        if isinstance(v, float) and not 0 <= v <= 1:
            raise ValueError(f"mastered_fraction must be in [0, 1] or 'adaptive', got {v}")
        return v


class PhaseConfig(Strict):
    name: str
    steps: int = Field(gt=0)
    strategy: StrategyConfig = Field(default_factory=NoneConfig)
    stop: StopRules = Field(default_factory=StopRules)
    rollback: SelectionConfig = Field(default_factory=SelectionConfig, description="where a tripped detector rolls back to")
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    lr: float | None = Field(None, gt=0, le=1, description="this phase's learning rate (default rl.lr)")


class ValidationConfig(Strict):
    every: int = Field(0, ge=0, description="validate every N steps (0: never; phases with accuracy_drop need it)")
    tasks: list[TaskSpec] | None = Field(None, description="default: data.train, validation split")
    n_per_level: int = Field(20, gt=0)
    samples: int = Field(2, gt=0)
    temperature: float = Field(1.0, ge=0)


class RunConfig(Strict):
    seed: int = 0
    model: ModelConfig = Field(default_factory=lambda: ModelConfig(path="builtin:testbed-sft"))
    data: DataConfig = Field(default_factory=DataConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    strategy: StrategyConfig = Field(default_factory=NoneConfig)
    phases: list[PhaseConfig] | None = Field(None, description="a curriculum; without it one phase runs `strategy` for rl.steps")
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    selection: SelectionConfig = Field(default_factory=lambda: SelectionConfig(criterion="last"),
                                       description="which validated checkpoint the run stands for (selection.json)")
    eval: EvalConfig = Field(default_factory=EvalConfig)
    report_to: list[Literal["wandb", "tensorboard", "trackio"]] = Field(
        default_factory=list, description="experiment trackers that receive every metrics.jsonl record (extras: tracking)")

    @model_validator(mode="after")
    def _plan(self):
        if self.phases is not None:
            if not self.phases:
                raise ValueError("phases must list at least one phase")
            names = [p.name for p in self.phases]
            if len(set(names)) != len(names):
                raise ValueError(f"phase names must be unique, got {names}")
            if self.rl.steps is not None and self.rl.steps > sum(p.steps for p in self.phases):
                raise ValueError(f"rl.steps ({self.rl.steps}) exceeds the phases' total ({sum(p.steps for p in self.phases)} steps)")
            needs_validation = [p.name for p in self.phases if p.stop.accuracy_drop is not None]
            if needs_validation and self.validation.every == 0:
                raise ValueError(f"phases {needs_validation} stop on validation accuracy: set validation.every")
        for strategy in [self.strategy, *(p.strategy for p in self.phases or [])]:
            support, visits = getattr(strategy, "support", None), getattr(strategy, "visits", 1)
            if isinstance(support, int) and support > self.rl.group_size * visits:
                raise ValueError(f"{strategy.name}: support={support} exceeds the {self.rl.group_size * visits} rollouts it "
                                 f"pools (rl.group_size × visits), so its penalty could never apply; use support: half or "
                                 f"at most {self.rl.group_size * visits}")
        return self

    def plan(self) -> list[PhaseConfig]:
        """The phases to run, cut at rl.steps when it is set (rl.steps=0: none)."""
        if self.rl.steps == 0:
            return []
        phases = self.phases or [PhaseConfig(name="main", steps=100 if self.rl.steps is None else self.rl.steps,
                                             strategy=self.strategy)]
        if self.phases and self.rl.steps is not None:
            out, left = [], self.rl.steps
            for p in phases:
                if left <= 0:
                    break
                out.append(p.model_copy(update={"steps": min(p.steps, left)}))
                left -= p.steps
            phases = out
        return phases

    def rl_steps(self) -> int:
        if self.phases is None:
            return 100 if self.rl.steps is None else self.rl.steps
        return sum(p.steps for p in self.plan())


# ---------------------------------------------------------------------------------------------
# loading, overrides, friendly errors
# ---------------------------------------------------------------------------------------------


def load_config(path: str | Path | None = None, overrides: list[str] = (), model: type[BaseModel] = RunConfig) -> BaseModel:
    """Read a YAML recipe (or start from defaults), apply `key.path=value` overrides, validate."""
    raw: dict[str, Any] = {}
    lines: dict[tuple, int] = {}
    source = str(path) if path else "<defaults>"
    if path is not None:
        data = Path(path).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data[:err.start].count(b"\n") + 1
            raise ConfigError(f"{source}:{line}: not valid UTF-8 (byte 0x{data[err.start]:02x}); save the recipe as UTF-8") from None
        try:
            raw = yaml.safe_load(text) or {}
            lines = _key_lines(text, source)
        except yaml.YAMLError as err:
            raise ConfigError(f"{source}: not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: a recipe must be a mapping of sections, got {type(raw).__name__}")
    overridden: dict[tuple, str] = {}
    had_model = "model" in raw
    for item in overrides:
        overridden[apply_override(raw, item)] = item
    if not had_model and isinstance(raw.get("model"), dict) and not {"path", "preset"} & raw["model"].keys():
        # `--set model.threads=1` without a model section refines the default model, not none
        default = model.model_fields["model"].default_factory() if "model" in model.model_fields else None
        if default is not None:
            raw["model"] = {"path": default.path, "preset": default.preset, **raw["model"]}
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_explain(err, model, source, lines, raw, overridden)) from None


def apply_override(raw: dict, item: str) -> tuple[str | int, ...]:
    """Apply one `key.path=value` override in place; the value is parsed as YAML. A number in the
    path indexes a list the recipe already has (`phases.1.steps=2`). Returns the key path."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key.path=value")
    parts: list[str | int] = key.strip().split(".")
    node: dict | list = raw
    for i, part in enumerate(parts):
        if isinstance(node, list):
            if not (part.isdigit() and int(part) < len(node)):
                where = ".".join(map(str, parts[:i]))
                if not node:
                    raise ConfigError(f"--set {item!r}: {where} is an empty list in the recipe: nothing to index")
                raise ConfigError(f"--set {item!r}: {where} is a list of {len(node)}; "
                                  f"expected an index 0–{len(node) - 1} after it, got {part!r}")
            parts[i] = part = int(part)
        if i == len(parts) - 1:
            break
        child = node[part] if isinstance(node, list) else node.get(part)
        if isinstance(child, str):
            child = {"path": child}     # the `model: PATH` shorthand, refined by `model.dtype=…`
        elif not isinstance(child, (dict, list)):
            child = {}
        node[part] = child
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"--set {item!r}: the value is not valid YAML ({problem}); "
                          f"quote it as a string: --set '{key.strip()}=\"…\"'") from None
    return tuple(parts)


def to_yaml(config: BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content, with the recipes' rules: a key written twice in one mapping and a
    document that is not YAML are ConfigErrors naming the file (and the line)."""
    text = Path(path).read_text()
    try:
        data = yaml.safe_load(text)
        _key_lines(text, str(path))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return data


def _key_lines(text: str, source: str = "<recipe>") -> dict[tuple, int]:
    """Map each key path of a YAML document to its 1-based line number. A key written twice in
    one mapping is an error (YAML loaders keep the last silently)."""
    out: dict[tuple, int] = {}

    def walk(node, prefix):
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, v in node.value:
                path = prefix + (k.value,)
                line = k.start_mark.line + 1
                if k.value in seen:
                    dotted = ".".join(map(str, path))
                    raise ConfigError(f"{source}:{line}: {dotted} is given twice (lines {seen[k.value]} and {line}); "
                                      f"keep one")
                seen[k.value] = line
                out[path] = line
                walk(v, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                out[prefix + (i,)] = v.start_mark.line + 1
                walk(v, prefix + (i,))

    walk(yaml.compose(text), ())
    return out


def _explain(err: ValidationError, model: type[BaseModel], source: str, lines: dict[tuple, int], raw: dict,
             overridden: dict[tuple, str]) -> str:
    messages = []
    for e in err.errors():
        loc = _data_path(e["loc"], raw)
        where = _blame(loc, source, lines, overridden)
        dotted = ".".join(str(p) for p in loc) or "<top level>"
        if e["type"] == "extra_forbidden":
            valid = _valid_keys(model, e["loc"][:-1], raw)
            hint = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            did = f" (did you mean {'.'.join(map(str, loc[:-1] + (hint[0],)))!r}?)" if hint else ""
            messages.append(f"{where}: unknown key {dotted!r}{did}; valid keys here: {', '.join(valid)}")
        elif e["type"] == "union_tag_invalid":
            messages.append(f"{where}: unknown strategy {e['input'].get('name')!r} at {dotted!r}; valid strategies: {', '.join(REGISTRY)}")
        elif isinstance(e.get("input"), dict):       # a check across keys: the whole section is no help
            messages.append(f"{where}: {dotted}: {e['msg']}")
        else:
            messages.append(f"{where}: {dotted}: {e['msg']} (got {e.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(messages)


def _blame(loc: tuple, source: str, lines: dict[tuple, int], overridden: dict[tuple, str]) -> str:
    """Where a bad value came from: the last `--set` that wrote it, a key above it or a key inside
    it (`--set rl.lr.x=3` turns rl.lr into a mapping), else the recipe line, else the recipe."""
    for path, item in reversed(overridden.items()):
        if loc[:len(path)] == path or loc and len(path) == len(loc) + 1 and path[:len(loc)] == loc:
            return f"--set {item}"
    return f"{source}:{lines[loc]}" if loc in lines else source


def _data_path(loc: tuple, raw: dict) -> tuple:
    """Drop the discriminator tags pydantic inserts into a location (e.g. strategy.<name>.key)."""
    out, node = [], raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            out.append(part)
            node = node[part]
        elif isinstance(node, dict):
            continue   # a union tag, not a key of the data
        else:
            out.append(part)
    return tuple(out)


def _valid_keys(model: type[BaseModel], loc: tuple, raw: dict) -> list[str]:
    """Field names of the model found by following `loc` through nested models."""
    current: Any = model
    for part in loc:
        if isinstance(part, str) and part in REGISTRY:
            current = REGISTRY[part].config
            continue
        if isinstance(part, str) and part in TASK_FORMS:
            current = TASK_FORMS[part]
            continue
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        current = _model_in(current.model_fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside Optional[...] / list[...] / Annotated[...] annotations."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
