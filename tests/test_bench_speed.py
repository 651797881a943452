"""The throughput benchmark's plumbing, at toy sizes (one pair, one step, four tokens): both
trainers run on the same chat model and reasoning-gym prompts, the load guard and the
matrix-product limits are recorded. The measurement itself is `make bench-speed-real`, not a
test: timings here would say nothing."""

import json
import math

import pytest
from typer.testing import CliRunner

from taut.cli import app
from taut.lab.bench.speed import Workload, limits

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")


def test_one_pair_of_each_side_records_times_load_and_limits(tmp_path):
    from test_real_models import tiny_chat_model

    model = tiny_chat_model(tmp_path / "model")
    task = {"task": "reasoning-gym:basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}
    out = tmp_path / "speed.json"
    result = CliRunner().invoke(app, ["bench", "speed", "--vs", "trl", "--pairs", "1", "--steps", "1", "--modes", "forced",
                                      "--model", str(model), "--task", json.dumps(task), "--max-new-tokens", "4",
                                      "--rollout-dtype", "auto,bf16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    series = json.loads(out.read_text())["forced"]
    assert set(series["runs"]) == {"taut", "taut+bf16-rollouts", "trl"} and len(series["load"]) == 1
    assert [series["runs"][s][0]["rollout_dtype"] for s in ("taut", "taut+bf16-rollouts")] == ["auto", "bf16"]
    for side, runs in series["runs"].items():
        run = runs[0]
        assert run["steps"] == 1 and run["mean_completion_tokens"] == pytest.approx(4), side    # forced: every row 4 tokens
        assert run["peak_rss_mb"] > 0 and all(v >= 0 for v in run["split_s_per_step"].values())
        assert run["process_system_cpu_s"] >= 0 and run["process_page_faults"] > 0    # a process faults its memory in once
        assert 0 < run["limit_fraction"]["generation"] < math.inf and 0 <= run["limit_fraction"]["update"] < math.inf
        assert 0 <= run["prompts_forwarded"] <= run["rows_trained"] <= 1, side    # a prompt counts once per micro-batch
    for side in ("taut", "taut+bf16-rollouts"):         # each taut side against the same TRL run
        assert series["ratios"][side]["pairs"] == [series["runs"][side][0]["steps_per_s"] / series["runs"]["trl"][0]["steps_per_s"]]
    assert series["ratio"] == series["ratios"]["taut"]
    assert "taut+bf16-rollouts/trl" in result.output
    limits_ = series["limits"]
    assert set(limits_["rates_gflops"]) == {"decode fp32", "train fp32", "decode bf16", "train bf16"}
    assert limits_["model"]["params"] == sum(o * i for o, i in limits_["model"]["shapes"]) > 0
    assert "taut/trl" in result.output and "GFLOP/s" in result.output


def test_limit_fractions_follow_the_necessary_arithmetic():
    """2·N per generated token, 6·N per trained token (4·N with LoRA; a shared prompt's tokens
    once), at the measured rates."""
    w = Workload(prompts_per_step=1, group_size=2)
    run = {"mean_completion_tokens": 10, "steps_per_s": 0.5,
           "split_s_per_step": {"generation": 1.0, "log-probs (forward)": 0.5, "backward + optimizer": 0.5, "rewards": 0.0}}
    model = {"params": 1e9, "prompt_tokens": 5}
    rates = {"decode bf16": 100.0, "train bf16": 300.0}
    got = limits(run, w, model, rates)
    assert got["generation"] == pytest.approx(2 * 1e9 * 20 / 100e9 / 1.0)          # 20 generated tokens
    assert got["update"] == pytest.approx(6 * 1e9 * 30 / 300e9 / 1.0)              # 2 rows × (10 + 5) trained tokens
    assert limits(run, Workload(prompts_per_step=1, group_size=2, lora=True), model, rates)["update"] == pytest.approx(4 / 6 * got["update"])
    assert got["step"] == pytest.approx((0.4 + 0.6) * 0.5)
    half = limits(run | {"rows_trained": 0.5}, w, model, rates)                     # taut forwarded half the rows
    assert half["update"] == pytest.approx(got["update"] / 2) and half["generation"] == got["generation"]
    shared = limits(run | {"prompts_forwarded": 0.5}, w, model, rates)              # one prompt forward for both rows
    assert shared["update"] == pytest.approx(6 * 1e9 * (2 * 10 + 1 * 5) / 300e9 / 1.0)


@pytest.mark.parametrize("args, message", [(["--dtype", "fp16"], "--dtype 'fp16': 'fp16' is not one of float32, bf16-mixed"),
                                           (["--modes", "natural,slow"], "'slow' is not one of natural, forced"),
                                           (["--lora", "qlora"], "'qlora' is not one of full, lora"),
                                           (["--rollout-dtype", "fp16"], "'fp16' is not one of auto, bf16")])
def test_unknown_settings_are_refused_before_anything_runs(args, message):
    result = CliRunner().invoke(app, ["bench", "speed", *args])
    assert result.exit_code == 2 and message in " ".join(result.output.split())
