"""The RL loop, one `train_step` at a time: generate and grade → shape → drop uninformative
groups → advantages → update → observe and validate → commit.

GRPO with DAPO's defaults (DESIGN §6): G rollouts per prompt at temperature 1, rewards shaped
by the phase's length strategy, dynamic sampling that drops groups whose *shaped* rewards are
all equal (so a mastered group with a length penalty stays), group-normalised advantages,
token-mean aggregation, no KL by default. The end-of-sequence token is an action with a
log-probability and gets gradient; a truncated rollout has none and is flagged.

A run is a plan of phases (one phase without a curriculum). Its whole state — where it stands
in the plan, data order, random streams, mastery history, the strategy's memory, validated
candidates, collapse detectors, how many metrics lines are written — lives in one `Run` object
saved whole in every checkpoint. A checkpoint is the commit point of a step: the step's
metrics lines are written first, then the checkpoint that records how many lines it covers, so
a run killed anywhere and resumed from its latest checkpoint redoes exactly the uncommitted
work and ends as an uninterrupted run would.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taut import failpoints
from taut.checkpoint import (
    CHECKPOINTS,
    SELECTION,
    CheckpointTimer,
    chosen_checkpoint,
    drop_older_timed,
    is_timed,
    latest_checkpoint,
    latest_intact_checkpoint,
    list_checkpoints,
    load_generators,
    load_optimizer,
    read_state,
    remove_partial,
    restore_weights,
    save_checkpoint,
    step_name,
    write_json_atomic,
)
from taut.config import EvalConfig, PhaseConfig, RunConfig, to_yaml
from taut.curriculum import Candidate, CollapseDetectors, MasteryTracker, Trip, select
from taut.evaluate import generate_and_grade
from taut.heartbeat import Heartbeat
from taut.length import Strategy, build_strategy
from taut.metrics import mean, percentile
from taut.models.loading import load_policy, resume_policy
from taut.models.policy import Policy, enable_activation_checkpointing
from taut.preempt import Preempted, StopRequest, resume_command
from taut.preflight import after_load, after_pool
from taut.rl.data import Sampler, build_pool
from taut.rl.guard import NonFiniteGuard
from taut.rl.objectives import LOSS_METRICS, Objective, build_objective, update
from taut.rl.rollouts import RolloutBatch, collect
from taut.rollout import RolloutEngine, build_engine
from taut.runlog import MetricsLog, StepProgress, console
from taut.tasks import load_task
from taut.tasks.base import PromptLimit
from taut.trackers import open_trackers

# ---------------------------------------------------------------------------------------------
# the run's state
# ---------------------------------------------------------------------------------------------


class Run:
    """Everything a run needs to continue exactly; saved whole in every checkpoint."""

    def __init__(self, config: RunConfig, device: torch.device, prompt_limit: PromptLimit | None = None):
        self.pool = build_pool(config, prompt_limit)
        self.tracker = MasteryTracker()
        self.sampler = Sampler(self.pool, self.tracker, config.seed)
        self.generator = torch.Generator(device=device).manual_seed(config.seed)   # rollout sampling
        self.np_rng = np.random.default_rng(config.seed)                           # prompt budgets (L1)
        self.step = 0
        self.phase_index = 0
        self.phase_start_step = 0
        self.phase_started = False            # the phase-start record and checkpoint are committed
        self.reference: str | None = None     # checkpoint of the phase-start policy (the KL reference)
        self.candidates: list[dict] = []      # validated checkpoints (curriculum.Candidate)
        self.phases: list[dict] = []          # finished phases: boundaries, why they ended
        self.detectors: dict = {}             # the current phase's collapse detectors
        self.strategy: Strategy | None = None  # the current phase's strategy (its memory is state)
        self.strategy_state: dict = {}
        self.metrics_lines = 0                # metrics.jsonl lines this state covers
        self.nonfinite_in_a_row = 0           # optimizer steps skipped as non-finite since the last good one

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "phase_index": self.phase_index, "phase_start_step": self.phase_start_step,
            "phase_started": self.phase_started, "reference": self.reference, "candidates": self.candidates,
            "phases": self.phases, "detectors": self.detectors,
            "strategy": self.strategy.state_dict() if self.strategy else self.strategy_state,
            "pool": self.pool.state_dict(), "mastery": self.tracker.state_dict(),
            "sampler_rng": self.sampler.rng.bit_generator.state, "np_rng": self.np_rng.bit_generator.state,
            "metrics_lines": self.metrics_lines, "nonfinite_in_a_row": self.nonfinite_in_a_row,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("step", "phase_index", "phase_start_step", "phase_started", "reference", "candidates", "phases",
                    "detectors", "metrics_lines", "nonfinite_in_a_row"):
            setattr(self, key, state[key])
        self.strategy_state = state["strategy"]
        self.pool.load_state_dict(state["pool"])
        self.tracker.load_state_dict(state["mastery"])
        self.sampler.rng.bit_generator.state = state["sampler_rng"]
        self.np_rng.bit_generator.state = state["np_rng"]

    def record_mastery(self, group_pass: list[tuple[str, float]]) -> None:
        """Each sampled group's pass rate enters its prompt's mastery history."""
        for pid, rate in group_pass:
            self.tracker.record(pid, self.step, rate)

    def commit(self, run_dir: Path, policy: Policy, optimizer, log: MetricsLog, timed: bool = False) -> Path:
        """Save the weights, optimizer and this state as the checkpoint of the current step (`timed`:
        written because time had passed; the next checkpoint replaces it)."""
        self.metrics_lines = log.lines
        return save_checkpoint(run_dir, self.step, policy, {"kind": "rl", "run": self.state_dict(), "timed": timed}, optimizer,
                               {"sampling": self.generator})

    def reopen_finished_phase(self, plan: list[PhaseConfig]) -> bool:
        """A finished run resumed with more steps in its last phase continues that phase."""
        if self.phase_index != len(self.phases) or not self.phases or self.phase_index > len(plan):
            return False
        last, phase = self.phases[-1], plan[self.phase_index - 1]
        if last["name"] != phase.name or last["ended_by"] != "steps" or last["start_step"] + phase.steps <= self.step:
            return False
        self.phases.pop()
        self.phase_index -= 1
        self.phase_start_step = last["start_step"]
        self.phase_started = True
        return True


# ---------------------------------------------------------------------------------------------
# validation: fixed problems, fixed random stream, so checkpoints compare with less noise
# ---------------------------------------------------------------------------------------------


class Validator:
    def __init__(self, config: RunConfig, policy: Policy, engine: RolloutEngine, prompt_limit: PromptLimit | None = None):
        v = config.validation
        self.config = EvalConfig(split="validation", n_per_level=v.n_per_level, samples=v.samples,
                                 temperature=v.temperature, budgets=[])
        self.policy = policy
        self.engine = engine                      # the trainer's own engine: same decode path and precision
        self.max_new_tokens = config.rl.max_new_tokens
        self.seed = config.seed
        tasks = [load_task(spec, config.data.levels, prompt_limit) for spec in (v.tasks or config.data.train)]
        self.problems = [(t, p) for t in tasks for p in t.problems("validation", v.n_per_level, config.data.seed)]
        if not self.problems:
            raise ValueError("the validation split is empty: check validation.tasks and data.levels")

    def __call__(self) -> dict[str, float]:
        samples = generate_and_grade(self.policy, [], self.config, self.max_new_tokens, seed=self.seed, problems=self.problems,
                                     engine=self.engine)
        return {"val_accuracy": mean([s.correct for s in samples]), "val_tokens_mean": mean([s.length for s in samples]),
                "val_truncation_rate": mean([s.truncated for s in samples])}


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def train_rl(config: RunConfig, run_dir: Path, resume: bool = False, quiet: bool = False,
             stop: StopRequest | None = None) -> Path:
    """Train `config`'s phases into `run_dir` and return the run's chosen checkpoint. `stop`
    (taut.preempt, set by SIGTERM or SIGUSR1 under the CLI): when it is set, the step under way
    finishes, its checkpoint is written and `Preempted` is raised. A heartbeat file in `run_dir`
    records each finished step while it runs (taut.heartbeat)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with Heartbeat(run_dir, "train") as heartbeat:
        t = Trainer.open(config, run_dir, resume, quiet, stop, heartbeat)
        plan = config.plan()
        with t.trackers, StepProgress(config.rl_steps(), "rl " + "→".join(p.name for p in plan), quiet, t.run.step) as bar:
            while t.run.phase_index < len(plan):
                checkpoint = train_phase(t, plan[t.run.phase_index], bar)
                if stop and t.run.phase_index < len(plan):
                    raise Preempted(stop.signal_name, t.run.step, checkpoint, resume_command("train", run_dir))
        return t.finish()


class Trainer:
    """What every step of a run uses: the policy, its optimizer and engine, the validator, the
    guard, the metrics log; and the run's state (`Run`). `open` builds it fresh or exactly where
    the latest intact checkpoint left it; `commit` is a step's commit point."""

    def __init__(self, config: RunConfig, run_dir: Path, policy: Policy, optimizer, run: Run, engine: RolloutEngine,
                 validator: Validator | None, guard: NonFiniteGuard, log: MetricsLog, trackers, heartbeat: Heartbeat,
                 stop: StopRequest | None, quiet: bool):
        self.config, self.cfg, self.run_dir = config, config.rl, run_dir
        self.policy, self.optimizer, self.run, self.engine = policy, optimizer, run, engine
        self.validator, self.guard, self.log, self.trackers = validator, guard, log, trackers
        self.heartbeat, self.stop, self.quiet = heartbeat, stop, quiet
        self.last_progress: dict[str, Any] = {}          # the progress bar's fields of the latest step
        self.timer = CheckpointTimer(self.cfg.checkpoint_minutes)

    @classmethod
    def open(cls, config: RunConfig, run_dir: Path, resume: bool, quiet: bool, stop: StopRequest | None,
             heartbeat: Heartbeat) -> "Trainer":
        cfg = config.rl
        if resume:
            remove_partial(run_dir)           # first: it puts back a checkpoint a kill left mid-swap
        ckpt = latest_intact_checkpoint(run_dir) if resume else None
        if resume and ckpt is None:
            console.print(f"[yellow]no checkpoint in {run_dir} yet: starting from the beginning[/yellow]")
        if ckpt is not None:
            policy = resume_policy(config.model, ckpt)
        else:
            (run_dir / "config.yaml").write_text(to_yaml(config))
            policy = load_policy(config.model, seed=config.seed)
        after_load(config, "train", policy)           # every rollout cap against the model's context
        model = policy.model
        model.train()
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        prompt_limit = PromptLimit.for_policy(config.data.max_prompt_tokens, policy, cfg.max_new_tokens)
        run = Run(config, model.device, prompt_limit)
        after_pool(config, policy, [p.prompt for _, p in run.pool.items])     # prompts_per_step; memory with its longest prompt
        if ckpt is not None:
            load_optimizer(optimizer, ckpt)
            load_generators(ckpt, {"sampling": run.generator})
            run.load_state_dict(read_state(ckpt)["run"])
            if run.phase_index >= len(config.plan()) and not run.reopen_finished_phase(config.plan()) and not quiet:
                console.print(f"{run_dir}: already finished at step {run.step}; nothing to train "
                              f"(raise rl.steps or add phases with --set to continue it)")
        trackers = open_trackers(config, run_dir, resume_step=run.step if ckpt is not None else None)
        log = MetricsLog(run_dir / "metrics.jsonl", committed=run.metrics_lines if ckpt is not None else None, forward=trackers.log)
        engine = build_engine(cfg.engine, policy, max_rows=cfg.rollout_rows, fast=cfg.fast_decode, logprobs=cfg.records_rollout_logprobs,
                              dtype=cfg.rollout_dtype)
        validator = Validator(config, policy, engine, prompt_limit) if config.validation.every else None
        guard = NonFiniteGuard(model, optimizer, cfg.max_nonfinite_skips, snapshot=cfg.undo_nonfinite_steps,
                               max_grad_norm=cfg.grad_clip, section="rl")
        guard.consecutive = run.nonfinite_in_a_row
        heartbeat.beat(run.step)
        return cls(config, run_dir, policy, optimizer, run, engine, validator, guard, log, trackers, heartbeat, stop, quiet)

    def commit(self, failpoint: str | None = None, timed: bool = False) -> Path:
        """The commit point: after the metrics lines, the checkpoint that covers them."""
        if failpoint:
            failpoints.reach(failpoint, self.run.step)
        self.timer.restart()
        checkpoint = self.run.commit(self.run_dir, self.policy, self.optimizer, self.log, timed)
        drop_older_timed(self.run_dir, checkpoint)
        return checkpoint

    def commit_step(self, record: dict[str, Any], periodic: bool, settled: bool = True) -> None:
        """Write the step's metrics line; checkpoint when the step is periodic, validated or stopped,
        or, when it is `settled` (the phase goes on from it unchanged), once `rl.checkpoint_minutes`
        have passed since the last checkpoint."""
        self.log.write(record)
        failpoints.reach("step-logged", self.run.step)
        self.heartbeat.beat(self.run.step)
        timed = settled and not periodic and not self.stop and self.timer.overdue()
        if periodic or timed or self.stop:
            checkpoint = self.commit(timed=timed)
            prune(self.run_dir, self.cfg.keep_checkpoints, self.run)
            if self.stop:
                raise Preempted(self.stop.signal_name, self.run.step, checkpoint, resume_command("train", self.run_dir))

    def finish(self) -> Path:
        """Select the checkpoint the run stands for; write curriculum.json; return it."""
        run, run_dir = self.run, self.run_dir
        if latest_checkpoint(run_dir) is None:                 # a run of zero steps: its start
            self.commit()
        if run.candidates:
            candidates = [Candidate(**c) for c in run.candidates]
            chosen = select(candidates, self.config.selection, candidates[0].accuracy)
            write_json_atomic(run_dir / SELECTION, {"checkpoint": chosen.checkpoint, "rule": self.config.selection.model_dump(),
                                                    "candidate": chosen.to_dict()})
        write_curriculum(run_dir, self.config, run, finished=True)
        final = chosen_checkpoint(run_dir)
        if not self.quiet:
            console.print(f"rl: {run.step} steps; the run's checkpoint: [bold]{final}[/bold]")
        return final


def train_phase(t: Trainer, phase: PhaseConfig, bar: StepProgress) -> Path:
    """The phase's steps, until its plan ends or a collapse detector trips; then its end, committed
    (its checkpoint is returned)."""
    run = t.run
    run.strategy = build_strategy(phase.strategy)
    run.sampler.config = phase.sampler
    objective = build_objective(run.strategy, t.cfg.loss, t.cfg.adv_norm)
    if run.phase_started:
        run.strategy.load_state_dict(run.strategy_state)
    else:
        start_phase(run, phase, t.validator, t.log)
        t.commit("phase-start")                                  # also the KL reference's weights
    reference = load_reference(t.config, t.run_dir, run.reference) if objective.uses_reference else None
    detectors = CollapseDetectors(phase.stop, None)
    detectors.load_state_dict(run.detectors)
    end = run.phase_start_step + phase.steps
    trip: Trip | None = None
    while run.step < end and trip is None:
        trip = train_step(t, phase, objective, reference, detectors, end)
        bar.update(run.step, **t.last_progress, phase=phase.name)
    end_phase(run, phase, trip, t.run_dir, t.policy, t.optimizer, t.engine, t.log)
    checkpoint = t.commit("phase-end")
    write_curriculum(t.run_dir, t.config, run)
    return checkpoint


def train_step(t: Trainer, phase: PhaseConfig, objective: Objective, reference: torch.nn.Module | None,
               detectors: CollapseDetectors, end: int) -> Trip | None:
    """One RL step: generate and grade → shape → drop uninformative groups → advantages →
    update → observe and validate → commit. Returns the detector that tripped, if one did."""
    run, cfg, tick = t.run, t.cfg, time.perf_counter()
    step_in_phase = run.step - run.phase_start_step
    lr = set_lr(t.optimizer, phase.lr or cfg.lr, run.step, cfg.warmup_steps)
    cap = run.strategy.cap(step_in_phase, cfg.max_new_tokens)

    batch = collect(t.policy, t.engine, run.sampler, run.strategy, objective.informative, cfg.sampling,   # generate, grade,
                    step=step_in_phase, cap=cap, generator=run.generator, np_rng=run.np_rng)            # shape, drop
    run.record_mastery(batch.group_pass)
    t_update = time.perf_counter()
    if batch.rewards:
        plan = objective.plan(batch.reward_matrix(), batch.response_lengths(), cap)                     # advantages
        losses = update(t.policy, t.optimizer, batch, plan, objective, cfg.update, reference=reference,  # the update
                        guard=t.guard, where=f"step {run.step + 1}")
    else:
        losses = dict.fromkeys(LOSS_METRICS, None) | {"skipped": 0.0}
    run.nonfinite_in_a_row = t.guard.consecutive
    t.engine.sync_weights()
    t_update = time.perf_counter() - t_update
    run.step += 1

    trip = detectors.observe_step(run.step, losses.get("entropy"), losses.get("grad_norm"))          # observe
    validation: dict[str, float] = {}
    if t.validator and (run.step % t.config.validation.every == 0 or run.step == end):               # validate
        validation = t.validator()
        add_candidate(run, phase, validation)
        trip = trip or detectors.observe_validation(run.step, validation["val_accuracy"])
    run.detectors = detectors.state_dict()

    record = step_record(run, phase, batch, losses, validation, cap=cap, lr=lr)                       # commit
    record |= {"step_time": time.perf_counter() - tick, "update_time": t_update}
    t.last_progress = {"reward": record["reward"], "acc": record["accuracy"], "len": record["length_mean"], "cap": cap}
    settled = run.step < end and trip is None           # the phase's end (or a rollback) commits this step itself
    t.commit_step(record, periodic=bool(validation) or (run.step % cfg.checkpoint_every == 0 and settled), settled=settled)
    return trip


# ---------------------------------------------------------------------------------------------
# the steps of the loop
# ---------------------------------------------------------------------------------------------


def start_phase(run: Run, phase: PhaseConfig, validator: Validator | None, log: MetricsLog) -> None:
    """Fresh strategy memory and detectors; validate the starting weights; they become the KL reference."""
    run.phase_start_step = run.step
    run.strategy.load_state_dict({})
    record: dict[str, Any] = {"step": run.step, "phase": phase.name, "event": "phase-start"}
    if validator:
        record |= validator()
        add_candidate(run, phase, record)
    run.detectors = CollapseDetectors(phase.stop, record.get("val_accuracy")).state_dict()
    run.reference = step_name(run.step)
    run.phase_started = True
    log.write(record)


def end_phase(run: Run, phase: PhaseConfig, trip: Trip | None, run_dir: Path, policy: Policy, optimizer,
              engine: RolloutEngine, log: MetricsLog) -> None:
    """Record the phase; a tripped detector first rolls back to the pre-collapse optimum."""
    ended = {"name": phase.name, "start_step": run.phase_start_step, "end_step": run.step,
             "planned_steps": phase.steps, "strategy": phase.strategy.name, "ended_by": "steps"}
    if trip is not None:
        ours = [Candidate(**c) for c in run.candidates if c["phase"] == phase.name and c["step"] >= run.phase_start_step]
        start_accuracy = CollapseDetectors(phase.stop, None)
        start_accuracy.load_state_dict(run.detectors)
        chosen = select(ours, phase.rollback, start_accuracy.start_accuracy) if ours else None
        ended |= {"ended_by": trip.detector, "why": trip.why, "rolled_back_to": chosen.checkpoint if chosen else None}
        console.print(f"[yellow]phase {phase.name!r} stopped at step {run.step}: {trip.why}"
                      + (f"; rolled back to {chosen.checkpoint}" if chosen else "") + "[/yellow]")
        if chosen is not None:
            checkpoint = run_dir / CHECKPOINTS / chosen.checkpoint
            restore_weights(policy, checkpoint)
            load_optimizer(optimizer, checkpoint)
            engine.sync_weights()
        # this step's checkpoint will hold the rolled-back weights: it is no longer a candidate
        run.candidates = [c for c in run.candidates if c["step"] != run.step]
        log.write({"step": run.step, "phase": phase.name, "event": "early-stop", "detector": trip.detector,
                   "why": trip.why, "rolled_back_to": ended["rolled_back_to"]})
    run.phases.append(ended)
    run.phase_index += 1
    run.phase_started = False


def add_candidate(run: Run, phase: PhaseConfig, validation: dict[str, float]) -> None:
    """The current weights, validated, become a candidate; the step's commit saves them."""
    run.candidates.append(Candidate(run.step, step_name(run.step), phase.name, validation["val_accuracy"],
                                    validation["val_tokens_mean"]).to_dict())


def load_reference(config: RunConfig, run_dir: Path, checkpoint: str) -> torch.nn.Module:
    """The KL reference: the policy at the start of the current phase, read from its checkpoint."""
    return resume_policy(config.model, run_dir / CHECKPOINTS / checkpoint).model.eval().requires_grad_(False)


def set_lr(optimizer, lr: float, step: int, warmup_steps: int) -> float:
    current = lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps else lr
    for group in optimizer.param_groups:
        group["lr"] = current
    return current


def step_record(run: Run, phase: PhaseConfig, batch: RolloutBatch, losses: dict, validation: dict, *, cap: int,
                lr: float) -> dict[str, Any]:
    """The metrics line of one step."""
    lengths = batch.sampled["length"]
    oracle = {"redundancy": mean(batch.sampled["redundancy"]), "thinks_rate": mean(batch.sampled["thinks"])} \
        if batch.sampled["redundancy"] else {}
    return {
        "step": run.step, "phase": phase.name, "strategy": phase.strategy.name, "cap": cap, "lr": lr,
        "reward": float(torch.stack(batch.rewards).mean()) if batch.rewards else None,
        "accuracy": mean(batch.sampled["correct"]),
        "score_mean": mean(batch.sampled["score"]),           # partial credit where the grader gives it, else = accuracy
        "length_mean": mean(lengths), "length_p50": percentile(lengths, 50),
        "length_p90": percentile(lengths, 90), "length_max": max(lengths),
        "truncation_rate": mean(batch.sampled["truncated"]),
        "groups_kept": len(batch.rewards), "groups_sampled": batch.groups_sampled, "sampling_rounds": batch.rounds,
        "mastered_frac": run.tracker.mastery_rate([p.id for _, p in run.pool.items], phase.sampler.mastery_threshold),
        "verifier_errors": batch.verifier_errors,
        **oracle, **batch.strategy_metrics, **losses, **validation,
        "gen_time": batch.gen_time, "reward_time": batch.reward_time,
        "rollout_tokens_per_s": batch.generated_tokens / max(batch.gen_time, 1e-9),
    }


def write_curriculum(run_dir: Path, config: RunConfig, run: Run, finished: bool = False) -> None:
    """curriculum.json: the plan, phase boundaries, detectors that fired and why, the choice, and
    whether the run has finished (written after each phase, so its presence alone says nothing:
    taut.checkpoint.run_finished)."""
    selection = run_dir / SELECTION
    write_json_atomic(run_dir / "curriculum.json", {
        "finished": finished,
        "plan": [{"name": p.name, "steps": p.steps, "strategy": p.strategy.name} for p in config.plan()],
        "phases": run.phases,
        "candidates": run.candidates,
        "selection": json.loads(selection.read_text()) if selection.exists() else None,
    })


def prune(run_dir: Path, keep: int | None, run: Run) -> None:
    """Keep the newest `keep` periodic checkpoints; validated ones, phase boundaries and the KL
    reference stay."""
    if keep is None:
        return
    protected = {c["checkpoint"] for c in run.candidates} | {step_name(0), run.reference}
    protected |= {step_name(p["end_step"]) for p in run.phases}
    periodic = [p for p in list_checkpoints(run_dir) if p.name not in protected and not is_timed(p)]
    for path in periodic[:-keep]:
        shutil.rmtree(path)
