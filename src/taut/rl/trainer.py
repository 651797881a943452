"""The RL loop: sample prompts → rollouts → grade → length strategy → advantages → update → log.

GRPO with DAPO's defaults (DESIGN §6): G rollouts per prompt at temperature 1, rewards shaped
by the phase's length strategy, dynamic sampling that drops groups whose *shaped* rewards are
all equal (so a mastered group with a length penalty stays), group-normalised advantages,
PPO-clip with decoupled clip-low / clip-high, token-mean aggregation, no KL by default. The
end-of-sequence token is an action with a log-probability and gets gradient; a truncated
rollout has none and is flagged.

One update per rollout batch is the default: the policy that sampled is the policy being
updated, so π_old = π detached and no extra forward pass is needed. With more updates per
batch, π_old comes from one no-grad forward before the first update.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from taut.checkpoint import (
    SELECTION,
    chosen_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_generators,
    load_optimizer,
    read_state,
    remove_partial,
    save_checkpoint,
    step_name,
    write_json_atomic,
)
from taut.config import RunConfig, to_yaml
from taut.curriculum import Candidate, CollapseDetectors, MasteryTracker, draw_mixture, mixture_share, select
from taut.length import GroupBatch, Strategy, build_strategy
from taut.metrics import mean, percentile
from taut.models import Policy, load_policy, restore_weights, resume_policy
from taut.rl.advantages import group_advantages
from taut.rl.logprobs import SequenceBatch, micro_batches, response_logprobs
from taut.rl.losses import aggregation_weights, clipped_policy_loss, sft_loss
from taut.rollout import RolloutEngine, SamplingParams, build_engine
from taut.runlog import MetricsLog, StepProgress, console
from taut.tasks import Problem, Task, load_task
from taut.tasks.base import OracleTask


# ---------------------------------------------------------------------------------------------
# data: a fixed pool of training prompts, drawn in shuffled epochs
# ---------------------------------------------------------------------------------------------


class PromptPool:
    """Training problems visited in epochs, each epoch in a fresh order seeded by (seed, epoch)."""

    def __init__(self, items: list[tuple[Task, Problem]], seed: int):
        if not items:
            raise ValueError("the RL prompt pool is empty: check data.train and data.levels")
        self.items = items
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.items)).tolist()

    def next(self, n: int) -> list[tuple[Task, Problem]]:
        out = []
        for _ in range(n):
            if self.position == len(self.items):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffle(self.epoch)
            out.append(self.items[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffle(self.epoch)


def build_pool(config: RunConfig) -> PromptPool:
    items = []
    for spec in config.data.train:
        task = load_task(spec, config.data.levels)
        items += [(task, p) for p in task.problems("train", config.data.pool_per_level, config.data.seed) if not p.held_out]
    return PromptPool(items, config.seed)


# ---------------------------------------------------------------------------------------------
# one step's rollouts
# ---------------------------------------------------------------------------------------------


@dataclass
class RolloutBatch:
    """The groups kept for the update (all with G rollouts), plus stats over everything sampled."""

    prompts: list[list[int]] = field(default_factory=list)      # [K*G] prompt ids per rollout
    responses: list[list[int]] = field(default_factory=list)    # [K*G]
    rewards: list[torch.Tensor] = field(default_factory=list)   # K tensors [G]
    sampled: dict[str, list] = field(default_factory=lambda: {"correct": [], "length": [], "truncated": [], "redundancy": [], "thinks": []})
    group_pass: list[tuple[str, float]] = field(default_factory=list)   # (problem id, pass rate) of every sampled group
    verifier_errors: int = 0
    strategy_metrics: dict[str, float] = field(default_factory=dict)
    groups_sampled: int = 0
    rounds: int = 0
    generated_tokens: int = 0
    gen_time: float = 0.0
    reward_time: float = 0.0


def collect(policy: Policy, engine: RolloutEngine, draw, strategy: Strategy, cfg, *, step: int, cap: int,
            generator: torch.Generator, np_rng: np.random.Generator) -> RolloutBatch:
    """Generate, grade and shape; with dynamic sampling, drop equal-reward groups and resample."""
    G, P = cfg.group_size, cfg.prompts_per_step
    out = RolloutBatch()
    params = SamplingParams(max_new_tokens=cap, temperature=cfg.temperature, top_p=cfg.top_p,
                            min_new_tokens=min(cfg.min_new_tokens, cap))
    while out.rounds < cfg.max_sampling_rounds and len(out.rewards) < P:
        out.rounds += 1
        items = draw(P)
        budgets = [strategy.budget(np_rng) for _ in items]
        problems = [p if b is None else task.with_budget(p, b) for (task, p), b in zip(items, budgets)]
        prompt_ids = [policy.encode_prompt(p.prompt) for p in problems]

        t0 = time.perf_counter()
        rollouts = engine.generate(prompt_ids, G, params, generator)
        out.gen_time += time.perf_counter() - t0
        out.generated_tokens += sum(rollouts.lengths)

        t0 = time.perf_counter()
        correct = []
        for row, tokens in enumerate(rollouts.tokens):
            task, problem = items[rollouts.prompt_index[row]][0], problems[rollouts.prompt_index[row]]
            text = policy.decode(tokens)
            complete = not rollouts.truncated[row]
            verdict = task.verify(problem, text, complete)
            correct.append(verdict.correct)
            out.verifier_errors += verdict.error is not None
            if isinstance(task, OracleTask):
                analysis = task.analyze(problem, text, complete)
                out.sampled["redundancy"].append(analysis.redundant_tokens / max(1, analysis.length))
                out.sampled["thinks"].append(analysis.thinks)
        batch = GroupBatch.from_flat(
            [p.id for p in problems for _ in range(G)], correct, rollouts.lengths, rollouts.truncated,
            step=step, cap=cap, budgets=None if budgets[0] is None else [b for b in budgets for _ in range(G)],
            group_size=G,
        )
        shaped = strategy.shape(batch)
        out.reward_time += time.perf_counter() - t0
        if out.rounds == 1:
            out.strategy_metrics = shaped.metrics
        out.sampled["correct"] += correct
        out.sampled["length"] += rollouts.lengths
        out.sampled["truncated"] += rollouts.truncated
        out.groups_sampled += len(items)
        out.group_pass += list(zip(batch.prompt_ids, batch.correct.float().mean(dim=1).tolist()))

        # a group teaches nothing when its shaped rewards are all equal (for the SFT objective:
        # when none of its rollouts is kept)
        if strategy.objective == "sft":
            uninformative = shaped.rewards.amax(dim=1) <= 0                            # [P]
        else:
            uninformative = shaped.rewards.amax(dim=1) - shaped.rewards.amin(dim=1) <= 1e-9
        for g in range(len(items)):
            if len(out.rewards) == P or (cfg.dynamic_sampling and uninformative[g]):
                continue
            out.rewards.append(shaped.rewards[g])
            out.prompts += [prompt_ids[g]] * G
            out.responses += rollouts.tokens[g * G : (g + 1) * G]
        if not cfg.dynamic_sampling:
            break
    return out


# ---------------------------------------------------------------------------------------------
# the update
# ---------------------------------------------------------------------------------------------


LOSS_METRICS = ("loss", "grad_norm", "entropy", "kl", "clip_low_frac", "clip_high_frac", "skipped", "logprob_time")


def update(policy: Policy, optimizer, batch: RolloutBatch, strategy: Strategy, cfg, *, cap: int,
           reference=None) -> dict[str, float]:
    """One or more optimizer updates on the kept groups; returns loss metrics."""
    model = policy.model
    rewards = torch.stack(batch.rewards)                                          # [K, G]
    advantages = group_advantages(rewards, cfg.adv_norm).flatten()               # [K*G]
    lengths = torch.tensor([len(r) for r in batch.responses])
    sft = strategy.objective == "sft"
    if sft:                                   # on-policy SFT: cross-entropy on the kept rollouts only
        rows = rewards.flatten().nonzero().squeeze(-1).tolist()
        weights_all = torch.zeros(len(lengths))
        if rows:
            weights_all[rows] = aggregation_weights(lengths[rows], "token-mean")
    else:                                     # rows with zero advantage add nothing without KL/entropy terms
        weights_all = aggregation_weights(lengths, cfg.loss_agg, norm_length=cap)
        extra_terms = cfg.kl_coef > 0 or cfg.entropy_coef > 0
        rows = [i for i in range(len(lengths)) if extra_terms or advantages[i] != 0]
    if not rows:                              # every advantage is zero: nothing to learn from this batch
        return dict.fromkeys(LOSS_METRICS, None) | {"loss": 0.0, "skipped": 0.0}

    chunks = [[rows[j] for j in mb] for mb in micro_batches([len(batch.prompts[i]) + len(batch.responses[i]) for i in rows], cfg.micro_batch_tokens)]
    sequences = {tuple(c): SequenceBatch.build([batch.prompts[i] for i in c], [batch.responses[i] for i in c], policy.pad_id, model.device)
                 for c in chunks}
    old_logp = {}
    if cfg.updates_per_batch > 1 and not sft:
        with torch.no_grad(), policy.autocast():
            old_logp = {key: response_logprobs(model, seq)[0] for key, seq in sequences.items()}

    stats = {"loss": 0.0, "entropy_sum": 0.0, "tokens": 0.0, "kl_sum": 0.0, "clip_low": 0.0, "clip_high": 0.0,
             "forward_time": 0.0}
    grad_norms, skipped = [], 0
    for _ in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for key, seq in sequences.items():
            idx = torch.tensor(key)
            t_forward = time.perf_counter()
            with policy.autocast():
                logp, entropy = response_logprobs(model, seq, with_entropy=True)      # [n, Tr]
            stats["forward_time"] += time.perf_counter() - t_forward
            weights = weights_all[idx].to(logp.device)
            if sft:
                loss = sft_loss(logp, seq.mask, weights)
            else:
                ref_logp = None
                if reference is not None:
                    with torch.no_grad(), policy.autocast():
                        ref_logp = response_logprobs(reference, seq)[0]
                terms = clipped_policy_loss(
                    logp, old_logp.get(key, logp.detach()), advantages[idx].to(logp.device), seq.mask, weights,
                    clip_low=cfg.clip_low, clip_high=cfg.clip_high, ref_logp=ref_logp, kl_coef=cfg.kl_coef,
                    entropy=entropy, entropy_coef=cfg.entropy_coef,
                )
                loss = terms.loss
                stats["clip_low"] += float(terms.clipped_low.sum())
                stats["clip_high"] += float(terms.clipped_high.sum())
                stats["kl_sum"] += float((terms.kl * seq.mask).sum())
            loss.backward()
            stats["loss"] += loss.item()
            stats["entropy_sum"] += float((entropy.detach() * seq.mask).sum())
            stats["tokens"] += float(seq.mask.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)     # a non-finite step is skipped and counted
            skipped += 1
            continue
        grad_norms.append(grad_norm.item())
        optimizer.step()
    tokens = max(1.0, stats["tokens"])
    return {
        "loss": stats["loss"] / cfg.updates_per_batch,
        "grad_norm": mean(grad_norms) if grad_norms else float("nan"),
        "entropy": stats["entropy_sum"] / tokens,
        "kl": stats["kl_sum"] / tokens,
        "clip_low_frac": stats["clip_low"] / tokens,
        "clip_high_frac": stats["clip_high"] / tokens,
        "skipped": float(skipped),
        "logprob_time": stats["forward_time"],
    }


# ---------------------------------------------------------------------------------------------
# validation: fixed problems, fixed random stream, so checkpoints compare with less noise
# ---------------------------------------------------------------------------------------------


class Validator:
    def __init__(self, config: RunConfig, policy: Policy, engine: RolloutEngine):
        from taut.config import EvalConfig

        v = config.validation
        self.config = EvalConfig(split="validation", n_per_level=v.n_per_level, samples=v.samples,
                                 temperature=v.temperature, budgets=[])
        self.policy = policy
        self.engine = engine                      # the trainer's own engine: same decode path and precision
        self.max_new_tokens = config.rl.max_new_tokens
        self.seed = config.seed
        tasks = [load_task(spec, config.data.levels) for spec in (v.tasks or config.data.train)]
        self.problems = [(t, p) for t in tasks for p in t.problems("validation", v.n_per_level, config.data.seed)]
        if not self.problems:
            raise ValueError("the validation split is empty: check validation.tasks and data.levels")

    def __call__(self) -> dict[str, float]:
        from taut.evaluate import generate_and_grade

        samples = generate_and_grade(self.policy, [], self.config, self.max_new_tokens, seed=self.seed, problems=self.problems,
                                     engine=self.engine)
        return {"val_accuracy": mean([s.correct for s in samples]), "val_tokens_mean": mean([s.length for s in samples]),
                "val_truncation_rate": mean([s.truncated for s in samples])}


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """Where the run stands in its plan; saved in every checkpoint."""

    step: int = 0
    phase_index: int = 0
    phase_start_step: int = 0
    phase_started: bool = False             # the phase-start validation has been done
    candidates: list[dict] = field(default_factory=list)    # validated checkpoints (curriculum.Candidate)
    phases: list[dict] = field(default_factory=list)        # finished phases: boundaries, why they ended
    detectors: dict = field(default_factory=dict)


class Sampler:
    """Draws training prompts: shuffled epochs of the pool, or the phase's mastered/unmastered mix."""

    def __init__(self, pool: PromptPool, tracker: MasteryTracker, seed: int):
        self.pool, self.tracker = pool, tracker
        self.rng = np.random.default_rng([seed, 7])
        self.config = None

    def __call__(self, n: int) -> list[tuple[Task, Problem]]:
        cfg = self.config
        if cfg is None or cfg.mastered_fraction is None:
            return self.pool.next(n)
        ids = [p.id for _, p in self.pool.items]
        mastered = [self.tracker.mastered(i, cfg.mastery_threshold) for i in ids]
        share = mixture_share(cfg, sum(mastered) / len(mastered))
        return [self.pool.items[i] for i in draw_mixture(ids, mastered, n, share, self.rng)]


def train_rl(config: RunConfig, run_dir: Path, resume: bool = False, quiet: bool = False) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = config.rl
    plan = config.plan()

    # ---- policy, optimizer, data, state (fresh, or from the latest checkpoint) ----------------
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        console.print(f"[yellow]no checkpoint in {run_dir} yet: starting from the beginning[/yellow]")
    if ckpt is not None:
        remove_partial(run_dir)
        state = read_state(ckpt)
        policy = resume_policy(config.model, ckpt)
    else:
        (run_dir / "config.yaml").write_text(to_yaml(config))
        policy = load_policy(config.model, seed=config.seed)
    model = policy.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    pool = build_pool(config)
    tracker = MasteryTracker()
    sampler = Sampler(pool, tracker, config.seed)
    generator = torch.Generator(device=model.device).manual_seed(config.seed)
    np_rng = np.random.default_rng(config.seed)
    progress = Progress()
    strategy_state: dict = {}
    if ckpt is not None:
        load_optimizer(optimizer, ckpt)
        load_generators(ckpt, {"sampling": generator})
        pool.load_state_dict(state["pool"])
        tracker.load_state_dict(state["mastery"])
        sampler.rng.bit_generator.state = state["sampler_rng"]
        np_rng.bit_generator.state = state["np_rng"]
        progress = Progress(**state["progress"])
        strategy_state = state["strategy"]
    engine = build_engine(cfg.engine, policy, max_rows=cfg.rollout_rows, fast=cfg.fast_decode)
    validator = Validator(config, policy, engine) if config.validation.every else None
    reference = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    log = MetricsLog(run_dir / "metrics.jsonl", resume_step=progress.step if ckpt is not None else None)
    strategy: Strategy | None = None

    def checkpoint() -> Path:
        return save_checkpoint(run_dir, progress.step, policy, {
            "kind": "rl", "pool": pool.state_dict(), "mastery": tracker.state_dict(),
            "sampler_rng": sampler.rng.bit_generator.state, "np_rng": np_rng.bit_generator.state,
            "strategy": strategy.state_dict() if strategy else {}, "progress": asdict(progress),
        }, optimizer, {"sampling": generator})

    def validate(phase_name: str) -> dict[str, float]:
        """Validate the current weights, save them, and add them to the candidates."""
        result = validator()
        checkpoint()
        progress.candidates.append(Candidate(progress.step, step_name(progress.step), phase_name,
                                             result["val_accuracy"], result["val_tokens_mean"]).to_dict())
        return result

    if ckpt is None:
        checkpoint()                          # the starting point, so every run can be compared to it

    with StepProgress(config.rl_steps(), "rl " + "→".join(p.name for p in plan), quiet, progress.step) as bar:
        while progress.phase_index < len(plan):
            phase = plan[progress.phase_index]
            strategy = build_strategy(phase.strategy)
            strategy.load_state_dict(strategy_state)
            strategy_state = {}
            sampler.config = phase.sampler
            lr = phase.lr or cfg.lr
            if not progress.phase_started:                    # ---- phase start --------------------
                progress.phase_start_step = progress.step
                start_record = {"step": progress.step, "phase": phase.name, "event": "phase-start"}
                if validator:
                    start_record |= validate(phase.name)
                start_accuracy = start_record.get("val_accuracy")
                progress.detectors = CollapseDetectors(phase.stop, start_accuracy).state_dict()
                progress.phase_started = True
                log.write(start_record)
            detectors = CollapseDetectors(phase.stop, None)
            detectors.load_state_dict(progress.detectors)
            phase_start_accuracy = detectors.start_accuracy
            end = progress.phase_start_step + phase.steps
            trip = None
            while progress.step < end and trip is None:
                t_step = time.perf_counter()
                step_in_phase = progress.step - progress.phase_start_step
                current_lr = lr * min(1.0, (progress.step + 1) / cfg.warmup_steps) if cfg.warmup_steps else lr
                for group in optimizer.param_groups:
                    group["lr"] = current_lr
                cap = strategy.cap(step_in_phase, cfg.max_new_tokens)

                # ---- rollouts, grades, shaped rewards --------------------------------------------
                batch = collect(policy, engine, sampler, strategy, cfg, step=step_in_phase, cap=cap,
                                generator=generator, np_rng=np_rng)
                for pid, rate in batch.group_pass:
                    tracker.record(pid, progress.step, rate)

                # ---- update ----------------------------------------------------------------------
                t_update = time.perf_counter()
                losses = (update(policy, optimizer, batch, strategy, cfg, cap=cap, reference=reference) if batch.rewards
                          else dict.fromkeys(LOSS_METRICS, None) | {"skipped": 0.0})
                engine.sync_weights()
                t_update = time.perf_counter() - t_update
                progress.step += 1
                trip = detectors.observe_step(progress.step, losses.get("entropy"), losses.get("grad_norm"))

                # ---- validation, detectors -------------------------------------------------------
                record: dict = {}
                if validator and (progress.step % config.validation.every == 0 or progress.step == end):
                    record |= validate(phase.name)
                    trip = trip or detectors.observe_validation(progress.step, record["val_accuracy"])
                progress.detectors = detectors.state_dict()

                # ---- log -------------------------------------------------------------------------
                lengths = batch.sampled["length"]
                record = {
                    "step": progress.step, "phase": phase.name, "strategy": phase.strategy.name, "cap": cap, "lr": current_lr,
                    "reward": float(torch.stack(batch.rewards).mean()) if batch.rewards else None,
                    "accuracy": mean(batch.sampled["correct"]),
                    "length_mean": mean(lengths), "length_p50": percentile(lengths, 50),
                    "length_p90": percentile(lengths, 90), "length_max": max(lengths),
                    "truncation_rate": mean(batch.sampled["truncated"]),
                    "groups_kept": len(batch.rewards), "groups_sampled": batch.groups_sampled, "sampling_rounds": batch.rounds,
                    "mastered_frac": tracker.mastery_rate([p.id for _, p in pool.items], 1.0),
                    "verifier_errors": batch.verifier_errors,
                    **({"redundancy": mean(batch.sampled["redundancy"]), "thinks_rate": mean(batch.sampled["thinks"])}
                       if batch.sampled["redundancy"] else {}),
                    **batch.strategy_metrics, **losses, **record,
                    "step_time": time.perf_counter() - t_step, "gen_time": batch.gen_time, "update_time": t_update,
                    "reward_time": batch.reward_time, "rollout_tokens_per_s": batch.generated_tokens / max(batch.gen_time, 1e-9),
                }
                log.write(record)
                bar.update(progress.step, reward=record["reward"], acc=record["accuracy"], len=record["length_mean"])
                if progress.step % cfg.checkpoint_every == 0 and progress.step < end and trip is None:
                    checkpoint()
                    _prune(run_dir, cfg.keep_checkpoints, progress)

            # ---- phase end: a tripped detector rolls back to the pre-collapse optimum -------------
            ended = {"name": phase.name, "start_step": progress.phase_start_step, "end_step": progress.step,
                     "planned_steps": phase.steps, "strategy": phase.strategy.name, "ended_by": "steps"}
            if trip is not None:
                ours = [Candidate(**c) for c in progress.candidates if c["phase"] == phase.name and c["step"] >= progress.phase_start_step]
                chosen = select(ours, phase.rollback, phase_start_accuracy) if ours else None
                ended |= {"ended_by": trip.detector, "why": trip.why, "rolled_back_to": chosen.checkpoint if chosen else None}
                console.print(f"[yellow]phase {phase.name!r} stopped at step {progress.step}: {trip.why}"
                              + (f"; rolled back to {chosen.checkpoint}" if chosen else "") + "[/yellow]")
                if chosen is not None:
                    _restore(policy, optimizer, run_dir / "checkpoints" / chosen.checkpoint)
                    engine.sync_weights()
                # this step's checkpoint now holds the rolled-back weights: it is no longer a candidate
                progress.candidates = [c for c in progress.candidates if c["step"] != progress.step]
                log.write({"step": progress.step, "phase": phase.name, "event": "early-stop", "detector": trip.detector,
                           "why": trip.why, "rolled_back_to": ended["rolled_back_to"]})
            progress.phases.append(ended)
            progress.phase_index += 1
            progress.phase_started = False
            progress.detectors = {}
            strategy = None
            checkpoint()
            _write_curriculum(run_dir, config, progress)

    # ---- the checkpoint the run stands for ---------------------------------------------------
    if progress.candidates:
        candidates = [Candidate(**c) for c in progress.candidates]
        chosen = select(candidates, config.selection, candidates[0].accuracy)
        write_json_atomic(run_dir / SELECTION, {"checkpoint": chosen.checkpoint, "rule": config.selection.model_dump(),
                                                "candidate": chosen.to_dict()})
    _write_curriculum(run_dir, config, progress)
    final = chosen_checkpoint(run_dir)
    if not quiet:
        console.print(f"rl: {progress.step} steps; the run's checkpoint: [bold]{final}[/bold]")
    return final


def _restore(policy: Policy, optimizer, checkpoint: Path) -> None:
    """Load a checkpoint's weights and optimizer state into the running policy."""
    restore_weights(policy, checkpoint)
    load_optimizer(optimizer, checkpoint)


def _write_curriculum(run_dir: Path, config: RunConfig, progress: Progress) -> None:
    """curriculum.json: the plan, phase boundaries, detectors that fired and why, the choice."""
    selection = run_dir / SELECTION
    write_json_atomic(run_dir / "curriculum.json", {
        "plan": [{"name": p.name, "steps": p.steps, "strategy": p.strategy.name} for p in config.plan()],
        "phases": progress.phases,
        "candidates": progress.candidates,
        "selection": json.loads(selection.read_text()) if selection.exists() else None,
    })


def _prune(run_dir: Path, keep: int | None, progress: Progress) -> None:
    """Keep the newest `keep` periodic checkpoints; validated ones and phase boundaries stay."""
    if keep is None:
        return
    protected = {c["checkpoint"] for c in progress.candidates} | {step_name(0)}
    protected |= {step_name(p["end_step"]) for p in progress.phases}
    periodic = [p for p in list_checkpoints(run_dir) if p.name not in protected]
    for path in periodic[:-keep]:
        shutil.rmtree(path)
