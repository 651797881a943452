"""Evaluation: accuracy against tokens, per domain and difficulty, in-domain vs held-out.

For every problem, K samples are generated with the same rollout engine as training, graded by
the task's verifier, and summarised as:
- accuracy (mean over samples), pass@k (unbiased estimator), verifier errors;
- response tokens mean / p50 / p90, truncation rate, lengths of correct vs wrong responses;
- a response that never finished (it hit the token cap without end-of-sequence) is not correct,
  even when the text before the cut held the right answer; `truncated_but_right` counts those;
- accuracy under token budgets: a response cut at B tokens scores only if its answer was
  already complete within the first B tokens;
- on the testbed, from the oracle: redundancy (redundant tokens / tokens), necessary-step
  coverage, how often the model thinks, how often it writes post-answer rounds.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import torch
from rich import box
from rich.table import Table

from taut.config import EvalConfig
from taut.metrics import (
    histogram,
    mean,
    overthinking,
    pass_at_k,
    percentile,
    tokens_per_correct,
)
from taut.models.policy import Policy
from taut.rollout import RolloutEngine, Rollouts, SamplingParams, build_engine
from taut.tasks import Problem, Task
from taut.tasks.base import OracleTask

LENGTH_EDGES = [0, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]


@runtime_checkable
class ScoredTask(Protocol):
    """A task that reports named scores besides correctness (IFEval: strict and loose, prompt and
    instruction level); evaluation averages each over the samples that have it."""

    def scores(self, problem: Problem, response: str, complete: bool) -> dict[str, float]: ...


@dataclass
class Sample:
    problem_id: str
    domain: str
    difficulty: int | None
    held_out: bool
    length: int
    truncated: bool
    correct: bool                   # right, and finished: a truncated response is never correct
    verifier_error: bool
    budget_correct: list[bool]
    truncated_but_right: bool = False   # truncated, and its answer finished before the cut was right
    # the oracle (testbed, written arithmetic; None elsewhere, and where the response does not follow its format)
    oracle_unknown: bool | None = None
    redundant_tokens: int | None = None
    necessary_length: int | None = None
    coverage: float | None = None
    thinks: bool | None = None
    post_answer_rounds: bool | None = None
    scores: dict[str, float] | None = None     # a ScoredTask's named scores
    text: str = field(default="", repr=False)


def generate_and_grade(
    policy: Policy,
    tasks: list[Task],
    cfg: EvalConfig,
    max_new_tokens: int,
    seed: int = 0,
    engine: RolloutEngine | None = None,
    response_prefix: list[int] | None = None,
    ban_first: list[int] | None = None,
    problems: list[tuple[Task, Problem]] | None = None,
    progress: Callable[[int], None] | None = None,
    journal: Journal | None = None,
) -> list[Sample]:
    """Sample `cfg.samples` responses per problem and grade them.

    With `progress`, problems are generated in batches of `cfg.batch_size // cfg.samples` (the
    chunks an engine built with `max_rows=cfg.batch_size` generates in anyway, so the samples do
    not change) and `progress(problems done)` is called after each. With a `journal` too, each
    batch is written to it as it finishes, and batches a killed evaluation of the same problems,
    settings and model already wrote are read back instead of generated (the random generator
    restored after them): the samples are those of an uninterrupted run.
    """
    engine = engine or build_engine("hf", policy, max_rows=cfg.batch_size)
    if problems is None:
        problems = [(task, p) for task in tasks for p in task.problems(cfg.split, cfg.n_per_level, seed)]
    generator = torch.Generator(device=policy.model.device).manual_seed(seed)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    prompts = [policy.encode_prompt(p.prompt) for _, p in problems]
    per_call = max(1, cfg.batch_size // cfg.samples) if progress else max(1, len(prompts))
    rollouts = Rollouts([], [], [])
    first = 0
    if journal is not None:
        key = [[p.id for _, p in problems], cfg.samples, cfg.temperature, cfg.top_p, max_new_tokens, seed, per_call,
               response_prefix, ban_first]
        first = journal.resume(key, rollouts, generator)
        if progress and first:
            progress(first)
    for start in range(first, len(prompts), per_call):
        chunk = engine.generate(prompts[start:start + per_call], cfg.samples, params, generator,
                                response_prefix=response_prefix, ban_first=ban_first)
        chunk.prompt_index = [start + i for i in chunk.prompt_index]
        rollouts.prompt_index += chunk.prompt_index
        rollouts.tokens += chunk.tokens
        rollouts.truncated += chunk.truncated
        if journal is not None:
            journal.append(min(start + per_call, len(prompts)), chunk, generator)
        if progress:
            progress(min(start + per_call, len(prompts)))
    out = []
    for row, tokens in enumerate(rollouts.tokens):
        task, problem = problems[rollouts.prompt_index[row]]
        out.append(grade(task, problem, policy, tokens, rollouts.truncated[row], cfg.budgets))
    return out


BATCH_FIELDS = {"done", "prompt_index", "tokens", "truncated", "generator"}


class Journal:
    """An evaluation's generated batches, one JSON line each as it finishes (`RUN/eval/X.partial.jsonl`
    beside the report it will become), so that `taut eval` killed after an hour of a long
    evaluation resumes where it stopped. The first line holds a key: a hash of the problems, the
    sampling settings and `identity` (the model's files); a journal with another key is started
    afresh, and a line cut off by the kill is dropped. Each batch line carries the random
    generator's state after it and the evaluation's seconds so far (`earlier_seconds`: those of
    the batches read back). Removed once the report is written."""

    def __init__(self, path: Path, identity: str):
        self.path, self.identity = Path(path), identity
        self.earlier_seconds = 0.0       # generation time of the batches read back (earlier processes)
        self._since = time.perf_counter()

    def resume(self, key: list, rollouts: Rollouts, generator: torch.Generator) -> int:
        """Read the batches of a journal with this key into `rollouts` and restore the generator
        after the last; start one (replacing a journal with another key) otherwise. The number of
        problems already done."""
        digest = hashlib.sha256(json.dumps([key, self.identity]).encode()).hexdigest()
        done, state, kept = 0, None, []
        lines = self.path.read_text().splitlines(keepends=True) if self.path.exists() else []
        if lines and _json_line(lines[0]) == {"key": digest}:
            kept.append(lines[0])
            for line in lines[1:]:
                batch = _json_line(line)
                if not line.endswith("\n") or not isinstance(batch, dict) or not BATCH_FIELDS <= batch.keys():
                    break                                          # cut off by the kill, or damaged
                rollouts.prompt_index += batch["prompt_index"]
                rollouts.tokens += batch["tokens"]
                rollouts.truncated += batch["truncated"]
                done, state = batch["done"], batch["generator"]
                self.earlier_seconds = batch.get("seconds", 0.0)      # journals written before lines kept time: none
                kept.append(line)
        else:
            kept = [json.dumps({"key": digest}) + "\n"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(kept))
        if state is not None:
            generator.set_state(torch.frombuffer(bytearray(base64.b64decode(state)), dtype=torch.uint8))
        self._since = time.perf_counter()
        return done

    def append(self, done: int, chunk: Rollouts, generator: torch.Generator) -> None:
        state = base64.b64encode(generator.get_state().numpy().tobytes()).decode()
        seconds = self.earlier_seconds + time.perf_counter() - self._since      # this evaluation's time so far, all processes
        line = {"done": done, "prompt_index": chunk.prompt_index, "tokens": chunk.tokens, "truncated": chunk.truncated,
                "generator": state, "seconds": seconds}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _json_line(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def grade(task: Task, problem: Problem, policy: Policy, tokens: list[int], truncated: bool, budgets: list[int]) -> Sample:
    text = policy.decode(tokens)
    verdict = task.verify(problem, text, complete=not truncated)
    correct = verdict.correct and not truncated
    budget_correct = []
    for b in budgets:
        if len(tokens) <= b:
            budget_correct.append(correct)
        else:
            budget_correct.append(task.verify(problem, policy.decode(tokens[:b]), complete=False).correct)
    sample = Sample(
        problem_id=problem.id, domain=problem.domain, difficulty=problem.difficulty, held_out=problem.held_out,
        length=len(tokens), truncated=truncated, correct=correct, truncated_but_right=truncated and verdict.correct,
        verifier_error=verdict.error is not None, budget_correct=budget_correct, text=text,
    )
    if isinstance(task, OracleTask):
        a = task.analyze(problem, text, complete=not truncated, count=policy.count_tokens)
        sample.oracle_unknown = a is None           # the response does not follow the format the oracle reads
        if a is not None:
            sample.redundant_tokens, sample.necessary_length = a.redundant_tokens, a.necessary_length
            sample.coverage, sample.thinks, sample.post_answer_rounds = a.coverage, a.thinks, a.post_answer_rounds
    if isinstance(task, ScoredTask):
        sample.scores = task.scores(problem, text, complete=not truncated)
    if verdict.score is not None:                   # partial credit (reasoning-gym): reported as the "score" mean
        sample.scores = (sample.scores or {}) | {"score": 0.0 if truncated else verdict.score}
    return sample


def outcomes(samples: list[Sample] | list[dict[str, Any]]) -> dict[str, list[tuple[int, bool]]]:
    """Problem id → its samples' (length, correct), from Samples or their JSON records."""
    out: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for s in samples:
        if isinstance(s, dict):
            out[s["problem_id"]].append((s["length"], s["correct"]))
        else:
            out[s.problem_id].append((s.length, s.correct))
    return dict(out)


def read_outcomes(samples_path: Path) -> dict[str, list[tuple[int, bool]]] | None:
    """`outcomes` of a samples file written beside an evaluation (`write_report`), gzipped or not
    (a study's committed `*.outcomes.jsonl.gz`); None without it."""
    if not Path(samples_path).is_file():
        return None
    with (gzip.open(samples_path, "rt") if str(samples_path).endswith(".gz") else open(samples_path)) as f:
        return outcomes([json.loads(line) for line in f if line.strip()])


def summarize(samples: list[Sample], budgets: list[int]) -> dict[str, Any]:
    if not samples:
        return {"n_samples": 0}
    by_problem: dict[str, list[bool]] = defaultdict(list)
    for s in samples:
        by_problem[s.problem_id].append(s.correct)
    k_max = min(len(v) for v in by_problem.values())
    lengths = [s.length for s in samples]
    out: dict[str, Any] = {
        "n_problems": len(by_problem),
        "n_samples": len(samples),
        "accuracy": mean([s.correct for s in samples]),
        "pass_at_k": {str(k): mean([pass_at_k(len(v), sum(v), k) for v in by_problem.values()])
                      for k in sorted({1, k_max}) if k <= k_max},
        "tokens_mean": mean(lengths),
        "tokens_p50": percentile(lengths, 50),
        "tokens_p90": percentile(lengths, 90),
        "truncation_rate": mean([s.truncated for s in samples]),
        "truncated_but_right": sum(s.truncated_but_right for s in samples),
        "verifier_errors": sum(s.verifier_error for s in samples),
        "budget_accuracy": {str(b): mean([s.budget_correct[i] for s in samples]) for i, b in enumerate(budgets)},
        "correct_tokens_mean": mean([s.length for s in samples if s.correct]),
        "wrong_tokens_mean": mean([s.length for s in samples if not s.correct]),
        # efficiency without an oracle (taut.metrics): tokens spent per correct answer, and
        # ThoughtTerminator's local overthinking (mean spend over the shortest correct sample)
        "tokens_per_correct": tokens_per_correct(outcomes(samples)),
        "overthinking_tokens": overthinking(outcomes(samples)),
    }
    oracle = [s for s in samples if s.redundant_tokens is not None]
    if oracle:
        covered = [s.coverage for s in oracle if s.coverage is not None]
        out.update({
            "redundancy": sum(s.redundant_tokens for s in oracle) / max(1, sum(s.length for s in oracle)),
            "redundant_tokens_mean": mean([s.redundant_tokens for s in oracle]),
            "necessary_tokens_mean": mean([s.necessary_length for s in oracle]),
            "coverage": mean(covered) if covered else None,
            "thinks_rate": mean([s.thinks for s in oracle]),
            "rounds_rate": mean([s.post_answer_rounds for s in oracle]),
        })
    judged = [s.oracle_unknown for s in samples if s.oracle_unknown is not None]
    if judged:                  # a task with an oracle: the share of responses it could not read (no answer line)
        out["oracle_unknown_rate"] = mean(judged)
    scored = [s.scores for s in samples if s.scores is not None]
    if scored:
        out["scores"] = {k: mean([s[k] for s in scored if k in s]) for k in sorted({k for s in scored for k in s})}
    return out


def report(samples: list[Sample], cfg: EvalConfig, meta: dict[str, Any]) -> dict[str, Any]:
    """The evaluation JSON: overall, in-domain / held-out, per domain, per domain × difficulty."""
    budgets = cfg.budgets
    groups: dict[str, dict[str, list[Sample]]] = {"by_domain": defaultdict(list), "by_level": defaultdict(list), "by_cell": defaultdict(list)}
    for s in samples:
        groups["by_domain"][s.domain].append(s)
        groups["by_level"][str(s.difficulty)].append(s)
        groups["by_cell"][f"{s.domain}/{s.difficulty}"].append(s)
    return {
        **meta,
        "eval": cfg.model_dump(mode="json"),
        "overall": summarize(samples, budgets),
        "in_domain": summarize([s for s in samples if not s.held_out], budgets),
        "held_out": summarize([s for s in samples if s.held_out], budgets),
        "held_out_domains": sorted({s.domain for s in samples if s.held_out}),
        **{name: {k: summarize(v, budgets) for k, v in sorted(g.items())} for name, g in groups.items()},
        "length_hist": {
            "edges": LENGTH_EDGES,
            "correct": histogram([s.length for s in samples if s.correct], LENGTH_EDGES),
            "wrong": histogram([s.length for s in samples if not s.correct], LENGTH_EDGES),
        },
    }


def write_report(result: dict[str, Any], path: Path, samples: list[Sample] | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(result), indent=1))
    if samples is not None:
        with open(path.with_suffix(".samples.jsonl"), "w") as f:
            for s in samples:
                f.write(json.dumps(asdict(s)) + "\n")


def finite(value: Any) -> Any:
    """The same structure with NaN and infinities replaced by None (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def table(result: dict[str, Any], title: str = "evaluation") -> Table:
    """Per domain/level, then in-domain, held-out and overall; fits 80 columns. The oracle's
    columns (redund, thinks, rounds) only where there is one (the testbed), leaving the room to
    other tasks' longer names."""
    oracle = "redundancy" in result["overall"]
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False,
              caption="pass@k: k = samples per problem; tpc: tokens spent per correct answer; trunc: share hitting "
                      "the cap (never correct); t-ok: how many of those held the right answer"
                      + ("; redund: redundant-token share" if oracle else ""),
              caption_justify="left")
    columns = ["domain/level", "acc", "pass@k", "tokens", "tpc", "trunc", "t-ok"] + ["redund", "thinks", "rounds"] * oracle
    for col in columns:
        t.add_column(col, justify="right" if col != "domain/level" else "left", no_wrap=True)

    def row(name, s, style=None):
        pk = s.get("pass_at_k", {})
        per_correct = s.get("tokens_per_correct")
        cells = [name, f"{s['accuracy']:.3f}", f"{pk[max(pk, key=int)]:.3f}" if pk else "-", f"{s['tokens_mean']:.1f}",
                 "-" if per_correct is None or math.isnan(per_correct) else f"{per_correct:.0f}",
                 f"{s['truncation_rate']:.2f}", str(s["truncated_but_right"])]
        if oracle:
            cells += [_fmt(s.get("redundancy")), _fmt(s.get("thinks_rate")), _fmt(s.get("rounds_rate"))]
        t.add_row(*cells, style=style)

    for name, s in result["by_cell"].items():
        row(name.removesuffix("/None"), s)              # tasks without difficulty levels: the domain alone
    for name in ("in_domain", "held_out", "overall"):
        if result[name].get("n_samples"):
            row(name.replace("_", "-"), result[name], style="bold")
    return t


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"
