"""The verl plugin, called through verl's own registry and trainer helper (CPU).

verl pins transformers<5.11, so it lives in its own environment: `make test-verl` creates
.venv-verl and runs this file there. In taut's main environment the file is skipped.
"""

import asyncio

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn  # noqa: E402
from verl.utils.skip.skip_manager import SkipManager  # noqa: E402

from taut.integrations import verl as plugin  # noqa: E402
from taut.length import GroupBatch, build_strategy  # noqa: E402
from taut.length.mastery import MasteryGatedConfig  # noqa: E402
from taut.length.schedules import length_cap  # noqa: E402
from taut.length.siri import SiriConfig  # noqa: E402

# verl warns at import about engines a CPU machine does not have (megatron, torchtitan, …)
pytestmark = pytest.mark.filterwarnings("ignore:.*engine is not available:UserWarning")

T = 16   # padded response length of the batch

# Three prompts, four rollouts each: (correct, length). "a" is mastered with varied lengths (the
# mastery gate opens and penalises its long correct rollouts); "b" is mixed; "c" has two rollouts
# at the cap of 16 tokens.
GROUPS = {
    "a": [(1, 4), (1, 8), (1, 12), (1, 5)],
    "b": [(1, 3), (0, 9), (1, 7), (0, 2)],
    "c": [(1, 16), (0, 16), (1, 6), (1, 10)],
}


def verl_batch(seed=0):
    """token_level_rewards, response_mask, uid index — rows shuffled as verl's balance_batch does."""
    rows = [(uid, c, n) for uid, members in GROUPS.items() for c, n in members]
    order = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    mask = torch.zeros(len(rows), T)
    rewards = torch.zeros(len(rows), T)
    for i, (_, c, n) in enumerate(rows):
        mask[i, :n] = 1
        rewards[i, n - 1] = float(c)
    return rewards, mask, np.array([uid for uid, _, _ in rows], dtype=object)


def algorithm_config(strategy, schedule=None, norm=True):
    taut = {"strategy": strategy.model_dump(), "max_response_length": T}
    if schedule is not None:
        taut["schedule"] = schedule.model_dump()
    return OmegaConf.create({"adv_estimator": "taut", "norm_adv_by_std_in_grpo": norm, "taut": taut})


def expected(strategy_cfg, rewards, mask, index, *, cap, step, norm=True):
    """taut's strategy on the same groups, then verl's GRPO on the shaped scores."""
    uids = list(dict.fromkeys(index.tolist()))
    rows = [[i for i in range(len(index)) if index[i] == uid] for uid in uids]
    lengths = mask.sum(-1).long()
    scores = rewards.sum(-1)
    batch = GroupBatch(
        correct=torch.stack([scores[r] == 1 for r in rows]),
        lengths=torch.stack([lengths[r] for r in rows]),
        truncated=torch.stack([lengths[r] >= cap for r in rows]),
        step=step, cap=cap, prompt_ids=tuple(uids),
    )
    shaped = build_strategy(strategy_cfg).shape(batch).rewards
    flat = torch.zeros(len(index))
    for r, values in zip(rows, shaped):
        flat[r] = values
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=flat.unsqueeze(-1).expand(-1, T) * (torch.arange(T) == 0),   # score in one slot
        response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm,
    )
    return flat, advantages


@pytest.fixture
def at_step():
    def set_step(verl_step):
        SkipManager.set_step(verl_step)
    yield set_step
    SkipManager.set_step(-1)


def test_the_plugin_is_registered_by_importing_verl():
    assert get_adv_estimator_fn("taut") is plugin.compute_taut_advantage
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert _agent_loop_registry["taut_capped"]["_target_"] == "taut.integrations.verl.CappedSingleTurnAgentLoop"


def test_mastery_gated_through_verls_registry_equals_taut_then_grpo(at_step):
    cfg = MasteryGatedConfig(support=1, tau=1.0, alpha=1.0, max_penalty=0.5)
    rewards, mask, index = verl_batch()
    at_step(1)
    fn = get_adv_estimator_fn("taut")
    advantages, returns = fn(token_level_rewards=rewards, response_mask=mask, config=algorithm_config(cfg), index=index)
    shaped, want = expected(cfg, rewards, mask, index, cap=T, step=0)
    torch.testing.assert_close(advantages, want)
    torch.testing.assert_close(returns, want)
    assert ((shaped > 0) & (shaped < 1)).any(), "the gate should open and penalise some long correct rollouts"
    assert torch.all(advantages[mask == 0] == 0)

    # Dr. GRPO (no std division) equals taut's own group advantages with adv_norm "none"
    from taut.rl.advantages import group_advantages

    no_std, _ = fn(token_level_rewards=rewards, response_mask=mask, config=algorithm_config(cfg, norm=False), index=index)
    uids = list(dict.fromkeys(index.tolist()))
    rows = [[i for i in range(len(index)) if index[i] == uid] for uid in uids]
    grouped = torch.stack([shaped[r] for r in rows])
    taut_adv = group_advantages(grouped, norm="none")
    for r, values in zip(rows, taut_adv):
        torch.testing.assert_close(no_std[r, 0], values)


def test_through_verls_compute_advantage_with_a_dataproto(at_step):
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    cfg = MasteryGatedConfig(support=1, tau=0.5, slack=0.1)
    rewards, mask, index = verl_batch(seed=1)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": index})
    at_step(5)
    out = compute_advantage(data, adv_estimator="taut", num_repeat=4, config=algorithm_config(cfg))
    _, want = expected(cfg, rewards, mask, index, cap=T, step=4)
    torch.testing.assert_close(out.batch["advantages"], want)


def test_siri_schedule_sets_the_cap_and_truncation_per_step(at_step):
    siri = SiriConfig(schedule="cosine", l_max=T, l_min=8, period=4)
    fn = get_adv_estimator_fn("taut")
    # step 0: cap 16 — group "c" has two rollouts at the cap, scored 0 by SIRI
    rewards, mask, index = verl_batch()
    at_step(1)
    advantages, _ = fn(token_level_rewards=rewards, response_mask=mask, config=algorithm_config(siri), index=index)
    shaped, want = expected(siri, rewards, mask, index, cap=length_cap("cosine", 0, T, 8, 4), step=0)
    torch.testing.assert_close(advantages, want)
    assert shaped[torch.from_numpy(index == "c") & (mask.sum(-1) == T)].tolist() == [0.0, 0.0]

    # step 2 (verl step 3): cap 8 — responses must fit it (the capped agent loop makes them)
    assert length_cap("cosine", 2, T, 8, 4) == 8
    short_mask = mask.clone()
    short_mask[:, 8:] = 0
    short_rewards = torch.zeros_like(rewards)
    lengths = short_mask.sum(-1).long()
    short_rewards[torch.arange(len(index)), lengths - 1] = rewards.sum(-1)
    at_step(3)
    advantages, _ = fn(token_level_rewards=short_rewards, response_mask=short_mask, config=algorithm_config(siri), index=index)
    shaped, want = expected(siri, short_rewards, short_mask, index, cap=8, step=2)
    torch.testing.assert_close(advantages, want)
    assert torch.all(shaped[lengths == 8] == 0) and shaped[lengths < 8].sum() > 0

    # generated without the capped agent loop: a response longer than the cap is an error
    with pytest.raises(ValueError, match="exceeds the cap 8"):
        fn(token_level_rewards=rewards, response_mask=mask, config=algorithm_config(siri), index=index)


def test_mastery_reward_under_a_siri_schedule(at_step):
    cfg, siri = MasteryGatedConfig(support=1, tau=1.0), SiriConfig(schedule="stair", l_max=T, l_min=12, period=4)
    rewards, mask, index = verl_batch()
    at_step(3)                                   # taut step 2: the stair is at l_max = 16
    fn = get_adv_estimator_fn("taut")
    advantages, _ = fn(token_level_rewards=rewards, response_mask=mask, config=algorithm_config(cfg, siri), index=index)
    _, want = expected(cfg, rewards, mask, index, cap=16, step=2)
    torch.testing.assert_close(advantages, want)


def test_errors_name_what_to_do(at_step):
    fn = get_adv_estimator_fn("taut")
    rewards, mask, index = verl_batch()
    cfg = algorithm_config(MasteryGatedConfig(support=1))
    at_step(1)
    with pytest.raises(ValueError, match="must be 1, 0 or -1"):
        fn(token_level_rewards=rewards * 0.7, response_mask=mask, config=cfg, index=index)
    with pytest.raises(ValueError, match="algorithm.taut"):
        fn(token_level_rewards=rewards, response_mask=mask, config=OmegaConf.create({"norm_adv_by_std_in_grpo": True}), index=index)
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        fn(token_level_rewards=rewards, response_mask=mask, index=index,
           config=OmegaConf.create({"norm_adv_by_std_in_grpo": True, "taut": {"strategy": {"name": "nope"}, "max_response_length": T}}))
    with pytest.raises(ValueError, match="use_best_seen"):
        fn(token_level_rewards=rewards, response_mask=mask, config=algorithm_config(MasteryGatedConfig(support=1, use_best_seen=True)), index=index)
    with pytest.raises(ValueError, match="unequal sizes"):
        fn(token_level_rewards=rewards[1:], response_mask=mask[1:], config=cfg, index=index[1:])
    SkipManager.set_step(-1)
    with pytest.raises(RuntimeError, match="training step"):
        fn(token_level_rewards=rewards, response_mask=mask, config=cfg, index=index)


def test_capped_agent_loop_sets_max_tokens_from_the_schedule(monkeypatch):
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    seen = []

    async def fake_run(self, sampling_params, **kwargs):
        seen.append(dict(sampling_params))
        return "output"

    monkeypatch.setattr(SingleTurnAgentLoop, "run", fake_run)
    siri = SiriConfig(schedule="cosine", l_max=T, l_min=8, period=4)
    loop = plugin.CappedSingleTurnAgentLoop.__new__(plugin.CappedSingleTurnAgentLoop)   # no LLM server here
    loop.settings = plugin.VerlSettings.from_algorithm(algorithm_config(siri))
    for verl_step in (1, 2, 3, 4, 5):
        assert asyncio.run(loop.run({"temperature": 1.0}, global_steps=verl_step, raw_prompt=[])) == "output"
    assert [p["max_tokens"] for p in seen] == [length_cap("cosine", s, T, 8, 4) for s in range(5)]
    assert all(p["temperature"] == 1.0 for p in seen)
    with pytest.raises(RuntimeError, match="use_v1"):
        asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[]))
