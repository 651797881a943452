"""Where a model goes wrong on written arithmetic: each wrong response of a `taut eval` classified by
the first step line that differs from the reference working (docs/smollm2-written-start.md, "Where
the first start goes wrong").

    python scripts/written_errors.py RUN/eval/start-greedy.samples.jsonl [--spec written:all] [--seed 0] [--n 300]
    python scripts/written_errors.py A.samples.jsonl --against B.samples.jsonl     two evaluations on the same problems

The samples file is the one `taut eval … --out X.json` writes beside X.json (X.samples.jsonl); `--spec`,
`--seed` and `--n` must name the task, seed and problems per level the evaluation drew (its recipe's
data.eval, seed and eval.n_per_level), so the problems can be drawn again and matched by id. The
kinds: taut.tasks.written.error_kind; a response cut at the token cap counts as "cut off".
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from taut.lab.written_start import paired, read_samples
from taut.tasks.written import error_kind, load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("--spec", default="written:all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=300, help="problems per family and level the evaluation drew")
    parser.add_argument("--levels", default="1,2,3,4")
    parser.add_argument("--against", type=Path, help="another evaluation's samples (say, the other format's start on the "
                        "same problems): both accuracies per family and level on the problems both answered, instead")
    args = parser.parse_args(argv)
    if args.against:
        return compare(args.samples, args.against)
    task = load(args.spec, [int(x) for x in args.levels.split(",")])
    problems = {p.id: p.data for p in task.problems("test", args.n, seed=args.seed)}
    counts: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    with args.samples.open() as f:                  # every sample: a sampled evaluation has several per problem
        for row in map(json.loads, filter(str.strip, f)):
            cell = (row["domain"], row["difficulty"])
            totals[cell] += 1
            if row["correct"]:
                continue
            if row["problem_id"] not in problems:
                raise SystemExit(f"{args.samples}: problem {row['problem_id']} is not among the {args.n} per level drawn "
                                 f"by {args.spec} at seed {args.seed}: give the evaluation's --spec, --seed and --n")
            counts[cell]["cut off" if row["truncated"] else error_kind(problems[row["problem_id"]], row["text"])] += 1
    names = sorted({k for c in counts.values() for k in c})
    print("| family / level | responses | wrong | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for cell in sorted(totals):
        c = counts[cell]
        print(f"| {cell[0]} / {cell[1]} | {totals[cell]} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in names) + " |")


def compare(one: Path, other: Path) -> None:
    """Accuracy of two evaluations per family and level on the problems both answered (one sample each)."""
    a, b = read_samples(one), read_samples(other)
    print(f"| family / level | problems | {one} | {other} | difference | tokens |")
    print("|---|---|---|---|---|---|")
    for cell, ids in paired(a, b, lambda row: (row["domain"], row["difficulty"])).items():
        acc = [sum(x[i]["correct"] for i in ids) / len(ids) for x in (a, b)]
        tokens = [sum(x[i]["length"] for i in ids) / len(ids) for x in (a, b)]
        print(f"| {cell[0]} / {cell[1]} | {len(ids)} | {acc[0]:.2f} | {acc[1]:.2f} | {100 * (acc[0] - acc[1]):+.1f} pts | "
              f"{tokens[0]:.0f} / {tokens[1]:.0f} |")


if __name__ == "__main__":
    main()
