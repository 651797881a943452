"""Correctness of the trainer: exact zero advantages, the sampled distribution is the trained one,
strategies choose their advantage normalisation, the KL reference is the phase-start policy."""

import json

import pytest
import torch

from taut.config import ConfigError, RunConfig, load_config
from taut.length import GroupBatch, build_strategy
from taut.length.dapo import DapoOverlongConfig
from taut.rl.advantages import group_advantages
from taut.rl.logprobs import SequenceBatch, response_logprobs
from taut.rollout import SamplingParams
from taut.rollout.hf import sample_next

import toytask  # noqa: F401  (registers the toy:… task)

# ---- 1. a group whose rewards are all equal gets exactly zero advantage ---------------------


@pytest.mark.parametrize("value", [0.7, 0.95, 1 / 3, -0.3, 12.1])
@pytest.mark.parametrize("norm", ["group", "batch", "none"])
def test_equal_rewards_not_representable_in_float32_give_exactly_zero(value, norm):
    mixed = torch.tensor([1.0, 0.0, 0.7, 0.3, 1.0, 0.0, 0.0, 1.0])
    rewards = torch.stack([torch.full((8,), value), mixed])                      # [2, 8]
    adv = group_advantages(rewards, norm)
    assert torch.equal(adv[0], torch.zeros(8)), f"equal group got {adv[0].tolist()}"
    assert adv[1].abs().max() > 0.01, "the mixed group keeps its advantages"
    if norm == "group":
        m, s = mixed.mean(), mixed.std(unbiased=False)
        assert torch.allclose(adv[1], (mixed - m) / (s + 1e-6), atol=1e-6)


def test_spread_below_the_tolerance_counts_as_equal_above_it_does_not():
    tiny = torch.tensor([[0.7, 0.7 + 1e-8, 0.7, 0.7]])
    assert torch.equal(group_advantages(tiny, "group"), torch.zeros(1, 4))
    real = torch.tensor([[0.70, 0.71, 0.70, 0.70]])                              # a 0.01 difference is signal
    assert group_advantages(real, "group").abs().max() > 1.0


# ---- 2. the trained distribution is the sampled one ----------------------------------------


def test_trainer_logprobs_equal_the_engines_sampling_distribution_at_temperature(tiny_policy):
    model = tiny_policy.model.eval()
    torch.manual_seed(0)
    prompt = [3, 5, 7, 9]
    response = [4, 6, 8, 10, 12]
    seq = SequenceBatch.build([prompt], [response], tiny_policy.pad_id, model.device)
    T = 0.6
    with torch.no_grad():
        logp, entropy = response_logprobs(model, seq, with_entropy=True, temperature=T)
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]            # [T, V]
    expected = []
    for t, token in enumerate(response):
        step_logits = logits[len(prompt) - 1 + t].unsqueeze(0)                            # [1, V]
        # the engine's sampling distribution at T: the frequencies sample_next draws from
        probs = torch.softmax(step_logits.float() / T, dim=-1)
        expected.append(torch.log(probs[0, token]).item())
    assert logp[0].tolist() == pytest.approx(expected, abs=1e-5)
    at_one = response_logprobs(model, seq, temperature=1.0)[0]
    assert not torch.allclose(at_one, logp), "temperature must change the log-probs"
    # and the engine does sample from that distribution: empirical frequencies of sample_next
    g = torch.Generator().manual_seed(0)
    step_logits = logits[len(prompt) - 1].unsqueeze(0).repeat(20000, 1)
    draws = sample_next(step_logits, SamplingParams(max_new_tokens=1, temperature=T), g)
    freq = (draws == response[0]).float().mean().item()
    assert freq == pytest.approx(float(torch.tensor(expected[0]).exp()), abs=0.02)


def test_rl_top_p_below_one_is_refused_with_a_clear_error():
    with pytest.raises(ConfigError, match="top_p"):
        load_config(None, ["rl.top_p=0.9"])


# ---- 5. a strategy declares the advantage normalisation it requires ------------------------


def test_strategies_declare_their_advantage_normalisation(caplog):
    from taut.rl.objectives import resolve_adv_norm

    sigmoid = build_strategy(RunConfig.model_validate({"strategy": {"name": "sigmoid"}}).strategy)
    lam = build_strategy(RunConfig.model_validate({"strategy": {"name": "grpo-lambda"}}).strategy)
    plain = build_strategy(RunConfig.model_validate({}).strategy)
    assert resolve_adv_norm(None, sigmoid) == "none"
    assert resolve_adv_norm(None, lam) == "group"
    assert resolve_adv_norm(None, plain) == "group"
    with caplog.at_level("WARNING"):
        assert resolve_adv_norm("group", sigmoid) == "group"        # a recipe may override, with a warning
    assert "sigmoid" in caplog.text and "none" in caplog.text


# ---- 6. DAPO's penalty on a {0, 1} reward keeps the paper's proportions ---------------------


def test_dapo_penalty_is_scaled_to_the_reward_range():
    """DAPO adds R_len ∈ [−1, 0] to a ±1 reward. On a {0, 1} reward (r' = (r + 1) / 2) the same
    penalty is R_len / 2: a correct rollout past the limit lands halfway between correct and wrong,
    as in the paper, instead of scoring the same as a wrong one."""
    strategy = build_strategy(DapoOverlongConfig(buffer_fraction=0.5))
    batch = GroupBatch(correct=torch.tensor([[True, True, False, False]]), lengths=torch.tensor([[10, 101, 10, 101]]),
                       truncated=torch.tensor([[False, True, False, True]]), step=0, cap=100)
    rewards = strategy.shape(batch).rewards[0].tolist()
    assert rewards == pytest.approx([1.0, 0.5, 0.0, -0.5])
    # group-normalised advantages equal those of DAPO's own ±1 formulation
    paper = torch.tensor([[1.0, 0.0, -1.0, -2.0]])
    assert torch.allclose(group_advantages(torch.tensor([rewards]), "group"), group_advantages(paper, "group"), atol=1e-5)


TIMINGS = {"step_time", "gen_time", "update_time", "reward_time", "rollout_tokens_per_s", "logprob_time"}


def metrics_without_timings(run_dir):
    """The metrics lines of a run, less the wall-clock timings (which no two runs share)."""
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---- 4. the KL reference is the phase-start policy, also after --resume ---------------------


def _toy(tmp_path, **rl):
    return RunConfig.model_validate({
        "seed": 0, "model": {"preset": "tiny", "threads": 1},
        "data": {"train": ["toy:first-ok"], "pool_per_level": 40},
        "rl": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "lr": 3e-3, "dynamic_sampling": False,
               "checkpoint_every": 2, **rl},
        "phases": [{"name": "a", "steps": 3}, {"name": "b", "steps": 3}],
    })


def test_kl_reference_is_the_phase_start_policy_and_survives_resume(tmp_path):
    import shutil

    from safetensors.torch import load_file

    from taut.rl.trainer import train_rl

    config = _toy(tmp_path, kl_coef=0.5)
    clean, cut = tmp_path / "clean", tmp_path / "cut"
    train_rl(config, clean, quiet=True)
    # the same run as if killed after step 4 (inside phase b, whose reference is the step-3 policy)
    shutil.copytree(clean, cut)
    shutil.rmtree(cut / "checkpoints" / "step-000006")
    state = json.loads((cut / "checkpoints" / "step-000004" / "trainer_state.json").read_text())
    assert state["run"]["reference"] == "step-000003"
    train_rl(config, cut, resume=True, quiet=True)
    a = load_file(str(clean / "checkpoints" / "step-000006" / "model.safetensors"))
    b = load_file(str(cut / "checkpoints" / "step-000006" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run used another KL reference"
    assert metrics_without_timings(clean) == metrics_without_timings(cut)
    kl = [json.loads(line).get("kl") for line in (clean / "metrics.jsonl").read_text().splitlines()]
    assert any(k for k in kl if k), "the KL term is active"


# ---- 7, 8. the command line says what it does ------------------------------------------------


def _cli(*args):
    from typer.testing import CliRunner

    from taut.cli import app

    return CliRunner().invoke(app, list(args))


def test_train_without_a_recipe_is_refused_and_default_must_be_asked_for():
    result = _cli("train")
    assert result.exit_code == 2 and "--config" in result.output
    result = _cli("train", "--config", "default", "--dry-run")
    assert result.exit_code == 0, result.output


def test_dry_run_plan_says_the_clip_ranges_are_inactive_with_one_update():
    result = _cli("train", "--config", "default", "--dry-run")
    assert "inactive" in result.output and "updates_per_batch" in result.output
    result = _cli("train", "--config", "default", "--dry-run", "--set", "rl.updates_per_batch=2")
    assert "inactive" not in result.output


TOY = ["--set", "model.preset=tiny", "--set", "model.path=null", "--set", "model.threads=1", "--set", "data.train=[toy:first-ok]",
       "--set", "rl.prompts_per_step=4", "--set", "rl.group_size=4", "--set", "rl.max_new_tokens=4",
       "--set", "rl.dynamic_sampling=false", "--set", "data.pool_per_level=8"]


def test_resume_extends_a_finished_run_when_its_steps_grow_and_says_when_finished(tmp_path):
    run = tmp_path / "run"
    assert _cli("train", "--config", "default", *TOY, "--set", "rl.steps=3", "--out", str(run), "--quiet").exit_code == 0
    result = _cli("train", "--resume", str(run))
    assert result.exit_code == 0 and "already finished at step 3" in " ".join(result.output.split())
    result = _cli("train", "--resume", str(run), "--set", "rl.steps=5", "--quiet")
    assert result.exit_code == 0, result.output
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "event" not in json.loads(line)]
    assert steps == [1, 2, 3, 4, 5]
    assert (run / "checkpoints" / "step-000005").is_dir()
    phases = json.loads((run / "curriculum.json").read_text())["phases"]
    assert [(p["start_step"], p["end_step"]) for p in phases] == [(0, 5)]


def test_zero_steps_train_nothing(tmp_path):
    assert _cli("train", "--config", "default", *TOY, "--set", "rl.steps=0", "--out", str(tmp_path), "--quiet").exit_code == 0
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000000"]
    assert (tmp_path / "metrics.jsonl").read_text() == ""
