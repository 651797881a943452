"""Supervised cold start: cross-entropy on prompt + response, loss on response tokens only.

Batches are drawn fresh from the task's SFT examples, seeded by (seed, step), so a resumed run
sees exactly the batches it would have seen. Every `bucket_batches` batches are drawn together,
sorted by length and split, which cuts padding roughly in half.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from taut.checkpoint import (
    CHECKPOINTS,
    SELECTION,
    CheckpointTimer,
    checkpoint_step,
    drop_older_timed,
    latest_checkpoint,
    latest_intact_checkpoint,
    load_optimizer,
    read_state,
    remove_partial,
    save_checkpoint,
    write_json_atomic,
)
from taut.config import RunConfig, SFTConfig, to_yaml
from taut.heartbeat import Heartbeat
from taut.models.loading import load_policy, resume_policy
from taut.models.policy import Policy, enable_activation_checkpointing
from taut.preempt import Preempted, StopRequest, resume_command
from taut.preflight import after_load
from taut.rl.guard import NonFiniteGuard
from taut.rl.logprobs import decoder_and_head
from taut.runlog import MetricsLog, StepProgress, console, read_metrics
from taut.tasks.traces import sft_examples
from taut.trackers import open_trackers


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up, then cosine decay to `min_ratio · lr` at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def encode_batch(policy: Policy, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """input ids [B, T] (right-padded) and labels [B, T] (-100 outside the responses)."""
    rows = []
    for prompt, response in pairs:
        p, r = policy.encode_prompt(prompt), policy.encode_response(response)
        rows.append((p + r, [-100] * len(p) + r))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), policy.pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
    return ids, labels


LOSS_CHUNK_TOKENS = 1024      # response tokens whose logits exist at once in the chunked SFT loss (taut.preflight counts the same)


def response_loss(policy: Policy, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of the response tokens (`target` −100 elsewhere, [B, T−1]).

    Where the LM head runs on hidden states (taut.rl.logprobs: any real tokenizer), the decoder's
    hidden states are gathered at the response tokens and the head, the log-softmax and the loss
    run on `LOSS_CHUNK_TOKENS` of them at a time, each chunk checkpointed: its logits are freed
    after its loss and recomputed in the backward. No fp32 logits of the whole batch, nor any for
    prompt tokens and padding, ever exist (on SmolLM2's 49k vocabulary, 20 bytes per token and
    entry). Otherwise (the testbed's 37-token vocabulary) the model's own logits of every position.
    The same loss either way, rounded differently."""
    model = policy.model
    parts = decoder_and_head(model)
    if parts is None:
        with policy.autocast():
            logits = model(input_ids=ids).logits[:, :-1]                    # [B, T-1, V]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                               ignore_index=-100, reduction="sum")
    decoder, head = parts
    real = target != -100
    with policy.autocast():
        hidden = decoder(input_ids=ids).last_hidden_state[:, :-1][real]         # [M, H]: response positions only
    targets = target[real]

    def chunk_loss(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with policy.autocast():
            logits = head(h)
        return F.cross_entropy(logits.float(), t, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], LOSS_CHUNK_TOKENS):
        h, t = hidden[start:start + LOSS_CHUNK_TOKENS], targets[start:start + LOSS_CHUNK_TOKENS]
        total = total + torch.utils.checkpoint.checkpoint(chunk_loss, h, t, use_reentrant=False)
    return total


_bucket_cache: dict[tuple, list] = {}


def step_batch(config: RunConfig, step: int) -> list[tuple[str, str]]:
    """The (prompt, response) examples `taut sft` trains on at `step`: from its bucket of
    `bucket_batches` batches, sorted by length (public so that other loops can be fed the same
    batches: scripts/sft_baseline.py, scripts/sft_step_ab.py)."""
    sft = config.sft
    bucket = step // sft.bucket_batches
    key = (config.model_dump_json(), bucket)
    if key not in _bucket_cache:
        _bucket_cache.clear()
        _bucket_cache[key] = _draw_bucket(config, bucket)
    return _bucket_cache[key][step % sft.bucket_batches]


_token_cache: dict[int, int] = {}


def _bucket_tokens(config: RunConfig, policy: Policy, step: int) -> int:
    """Response tokens of the whole bucket `step` belongs to: every batch of a bucket divides by
    the same count, so an example weighs the same whether it landed in a short or a long batch
    (a per-batch token mean would up-weight the short, direct-answer batches)."""
    bucket = step // config.sft.bucket_batches
    if bucket not in _token_cache:
        _token_cache.clear()
        first = bucket * config.sft.bucket_batches
        _token_cache[bucket] = sum(len(policy.encode_response(r)) for b in range(config.sft.bucket_batches)
                                   for _, r in step_batch(config, first + b))
    return _token_cache[bucket]


def _draw_bucket(config: RunConfig, bucket: int) -> list[list[tuple[str, str]]]:
    sft = config.sft
    rng = random.Random(f"sft:{config.seed}:{bucket}")
    pairs = sft_examples(config, rng, sft.batch_size * sft.bucket_batches)
    pairs.sort(key=lambda pr: len(pr[0].split()) + len(pr[1].split()))
    batches = [pairs[i * sft.batch_size : (i + 1) * sft.batch_size] for i in range(sft.bucket_batches)]
    rng.shuffle(batches)
    return batches


def validation_examples(config: RunConfig) -> list[tuple[str, str]]:
    """The fixed examples of the validation loss: `sft.val_examples` pairs from the validation
    split of the SFT tasks (problems no training example uses), the same at every evaluation."""
    return sft_examples(config, random.Random(f"sft-validation:{config.seed}"), config.sft.val_examples, split="validation")


@torch.no_grad()
def validation_loss(policy: Policy, pairs: list[tuple[str, str]], batch_size: int) -> float:
    """Mean loss per response token over `pairs` (the training loss's definition, no dropout)."""
    model = policy.model
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    try:
        ordered = sorted(pairs, key=lambda pr: len(pr[0]) + len(pr[1]))       # less padding
        for start in range(0, len(ordered), batch_size):
            ids, labels = encode_batch(policy, ordered[start:start + batch_size])
            target = labels[:, 1:].to(model.device)
            total += response_loss(policy, ids.to(model.device), target).item()
            tokens += int((target != -100).sum())
    finally:
        model.train(was_training)
    return total / max(1, tokens)


def train_sft(config: RunConfig, run_dir: Path, resume: bool = False, quiet: bool = False,
              stop: StopRequest | None = None) -> Path:
    """Supervised training on the SFT tasks into `run_dir`; returns the last checkpoint. `stop`
    (taut.preempt): when it is set, the step under way finishes, its checkpoint is written and
    `Preempted` is raised. A heartbeat file in `run_dir` records each finished step while it runs
    (taut.heartbeat)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with Heartbeat(run_dir, "sft") as heartbeat:
        return _train_sft(config, run_dir, resume, quiet, stop, heartbeat)


def start_or_resume(config: RunConfig, run_dir: Path, resume: bool) -> tuple[Policy, torch.optim.Optimizer, int, tuple[float, int]]:
    """The policy in training mode and its optimizer, fresh or from the run's latest intact checkpoint;
    the step to start at; the loss and tokens since the last metrics line (a checkpoint can fall between two)."""
    sft = config.sft
    if resume:
        remove_partial(run_dir)           # first: it puts back a checkpoint a kill left mid-swap
    settings = config.model.model_copy(update={"keep_freed_memory": config.model.keeps_freed_memory("sft")})
    start, window, ckpt = 0, (0.0, 0), latest_intact_checkpoint(run_dir) if resume else None
    if ckpt is not None:
        policy = resume_policy(settings, ckpt)
        state = read_state(ckpt)
        start, window = state["step"], tuple(state.get("window", (0.0, 0)))
    else:
        policy = load_policy(settings, seed=config.seed)
    after_load(config, "sft", policy)             # the longest example against the context; memory
    policy.model.train()
    if sft.activation_checkpointing:
        enable_activation_checkpointing(policy.model)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=sft.lr, betas=sft.betas, weight_decay=sft.weight_decay)
    if start:
        load_optimizer(optimizer, ckpt)
    return policy, optimizer, start, window


def _train_sft(config: RunConfig, run_dir: Path, resume: bool, quiet: bool, stop: StopRequest | None,
               heartbeat: Heartbeat) -> Path:
    (run_dir / "config.yaml").write_text(to_yaml(config))
    sft = config.sft
    policy, optimizer, start, (window_loss, window_tokens) = start_or_resume(config, run_dir, resume)
    model = policy.model
    trackers = open_trackers(config, run_dir, resume_step=start if start else None)
    log = MetricsLog(run_dir / "metrics.jsonl", resume_step=start if start else None, forward=trackers.log)
    guard = NonFiniteGuard(model, optimizer, sft.max_nonfinite_skips, snapshot=sft.undo_nonfinite_steps,
                           max_grad_norm=sft.grad_clip, section="sft")
    heartbeat.beat(start)

    held_back = validation_examples(config) if sft.val_every else []
    checkpoints = Checkpoints(run_dir, sft)
    # tokens/s counts the steps' time only: validation losses and checkpoints (elapsed_s has them) are not training
    tokens_seen, training_s, t0 = 0, 0.0, time.perf_counter()
    with trackers, StepProgress(sft.steps, "sft", quiet, start) as progress:
        if held_back and start == 0:
            log.write({"step": 0, "val_loss": validation_loss(policy, held_back, sft.batch_size)})
        for step in range(start, sft.steps):
            tick = time.perf_counter()
            lr, loss_sum, n_tokens, grad_norm = sft_step(config, policy, optimizer, guard, step)
            training_s += time.perf_counter() - tick
            tokens_seen += n_tokens
            window_loss += loss_sum
            window_tokens += n_tokens
            done = step + 1
            if done % sft.log_every == 0 or done == sft.steps:
                elapsed = time.perf_counter() - t0
                log.write({"step": done, "loss": window_loss / max(1, window_tokens), "lr": lr, "grad_norm": grad_norm,
                           "tokens_per_s": tokens_seen / training_s if training_s else None, "elapsed_s": elapsed})
                progress.update(done, loss=window_loss / max(1, window_tokens))
                window_loss, window_tokens = 0.0, 0
            if held_back and (done % sft.val_every == 0 or done == sft.steps):
                log.write({"step": done, "val_loss": validation_loss(policy, held_back, sft.batch_size)})
            checkpoint = checkpoints.after(done, policy, optimizer, [window_loss, window_tokens], bool(stop))
            if stop and done < sft.steps:
                raise Preempted(stop.signal_name, done, checkpoint, resume_command("sft", run_dir))
            heartbeat.beat(done)
    final = latest_checkpoint(run_dir)
    chosen = select_lowest_validation_loss(run_dir) if held_back else None
    if not quiet:
        print_summary(run_dir, sft.steps, final, chosen, bool(held_back))
    return final


class Checkpoints:
    """When the SFT loop writes a checkpoint: every `checkpoint_every` steps, at the last step, at a
    stop, and once `checkpoint_minutes` have passed since the last one. A timed checkpoint is there
    to resume from: the next checkpoint replaces it, so a finished run holds the same checkpoints
    with or without them."""

    def __init__(self, run_dir: Path, sft: SFTConfig) -> None:
        self.run_dir, self.sft, self.timer = run_dir, sft, CheckpointTimer(sft.checkpoint_minutes)

    def after(self, done: int, policy: Policy, optimizer: torch.optim.Optimizer, window: list, stopping: bool) -> Path | None:
        sft = self.sft
        due = done % sft.checkpoint_every == 0 or done == sft.steps or stopping
        timed = not due and self.timer.overdue()
        if not (due or timed):
            return None
        checkpoint = save_checkpoint(self.run_dir, done, policy, {"kind": "sft", "window": window, "timed": timed}, optimizer)
        self.timer.restart()
        drop_older_timed(self.run_dir, checkpoint)
        return checkpoint


def sft_step(config: RunConfig, policy: Policy, optimizer: torch.optim.Optimizer, guard: NonFiniteGuard,
             step: int) -> tuple[float, float, int, float]:
    """One optimizer step on the step's batch: (lr, summed response-token loss, response tokens, gradient norm)."""
    sft = config.sft
    lr = lr_at(step, lr=sft.lr, warmup=sft.warmup_steps, total=sft.steps, min_ratio=sft.min_lr_ratio)
    for group in optimizer.param_groups:
        group["lr"] = lr
    ids, labels = encode_batch(policy, step_batch(config, step))
    ids, labels = ids.to(policy.model.device), labels.to(policy.model.device)
    target = labels[:, 1:]                                              # [B, T-1]
    token_loss = response_loss(policy, ids, target)
    loss = token_loss * sft.bucket_batches / _bucket_tokens(config, policy, step)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), sft.grad_clip).item()
    guard.step(grad_norm, where=f"sft step {step + 1}")        # a non-finite step is undone and counted
    return lr, token_loss.item(), int((target != -100).sum()), grad_norm


def print_summary(run_dir: Path, steps: int, final: Path, chosen: Path | None, validated: bool) -> None:
    console.print(f"sft: {steps} steps, checkpoint [bold]{final}[/bold]")
    if validated:
        curve = [r for r in read_metrics(run_dir) if "val_loss" in r]
        best = min(curve, key=lambda r: r["val_loss"])
        console.print(f"sft: validation loss {curve[0]['val_loss']:.4f} at step 0, lowest {best['val_loss']:.4f} at step "
                      f"{best['step']}, {curve[-1]['val_loss']:.4f} at the end (metrics.jsonl has the curve)")
        console.print(f"sft: the run stands for {chosen.name if chosen else final.name} "
                      f"({'the checkpoint with the lowest validation loss' if chosen else 'no checkpoint was saved at a validation step'})")


def select_lowest_validation_loss(run_dir: Path) -> Path | None:
    """Make the run stand for its checkpoint with the lowest validation loss (selection.json, which
    `taut eval RUN`, `model.path: RUN` and RL starts read): the SFT → RL guideline of moving to RL at
    the validation minimum. Only steps that have both a checkpoint and a validation loss compete;
    None (and no selection) when there are none."""
    saved = {checkpoint_step(c): c for c in (run_dir / CHECKPOINTS).iterdir() if c.is_dir() and c.name.startswith("step-")}
    curve = [r for r in read_metrics(run_dir) if "val_loss" in r and r["step"] in saved]
    if not curve:
        return None
    best = min(curve, key=lambda r: (r["val_loss"], r["step"]))
    chosen = saved[best["step"]]
    write_json_atomic(run_dir / SELECTION, {"checkpoint": chosen.name, "rule": "lowest SFT validation loss",
                                            "val_loss": best["val_loss"], "step": best["step"]})
    return chosen

