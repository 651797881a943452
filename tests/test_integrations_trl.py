"""taut's strategies inside TRL's GRPOTrainer, on CPU with the tiny testbed model.

The single-process test trains a few steps with a mastery-gated reward under a SIRI cap and
replays every reward call through taut's own strategy; the two-process test launches this file
with torchrun (gloo) and checks that groups split across processes are scored whole when
gathered, and are an error when not.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from taut.integrations.trl import (  # noqa: E402
    LengthCapCallback,
    StrategyReward,
    TaskVerifier,
    problems_dataset,
)
from taut.length import GroupBatch, build_strategy  # noqa: E402
from taut.length.mastery import MasteryGatedConfig  # noqa: E402
from taut.length.schedules import length_cap  # noqa: E402
from taut.length.siri import SiriConfig  # noqa: E402

G = 4
SIRI = SiriConfig(schedule="cosine", l_max=12, l_min=4, period=4)       # caps 12, 8, 4, 8
MASTERY = MasteryGatedConfig(support=1, tau=0.5, alpha=1.0, max_penalty=0.5)


def lenient(completion: str, answer: str) -> bool:
    """A verifier that passes about two thirds of a random model's completions, so the mastery
    gate opens; module-level, hence picklable as TRL expects."""
    return len(completion.split()) % 3 != 0


class RecordingReward(StrategyReward):
    """StrategyReward that keeps what each call saw and returned."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        rewards = super().__call__(prompts, completions, completion_ids, **kwargs)
        self.calls.append({
            "step": kwargs["trainer_state"].global_step, "prompts": list(prompts), "completions": list(completions),
            "ids": [list(ids) for ids in completion_ids], "answers": list(kwargs["answer"]), "rewards": rewards,
        })
        return rewards


def run_grpo(output_dir, *, per_device: int, steps: int, gather: bool = True, seed: int = 0):
    """A few GRPO steps of the tiny testbed model with a mastery-gated reward under a SIRI cap."""
    from trl import GRPOConfig, GRPOTrainer

    from taut.models.testbed import build_testbed_model
    from taut.tasks import load_task

    policy = build_testbed_model("tiny", seed=seed)
    dataset = problems_dataset(load_task("gym:add").problems("train", 4))
    args = GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
        beta=0.0, num_generations=G, per_device_train_batch_size=per_device, max_completion_length=SIRI.l_max,
        max_steps=steps, learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=seed,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    reward = RecordingReward(MASTERY, lenient, schedule=SIRI, num_generations=G, max_completion_length=SIRI.l_max,
                             eos_token_id=policy.tokenizer.eos_token_id, gather=gather)
    trainer = GRPOTrainer(model=policy.model, reward_funcs=[reward], args=args, train_dataset=dataset,
                          processing_class=policy.tokenizer)
    callback = LengthCapCallback(trainer, SIRI)
    trainer.add_callback(callback)
    trainer.train()
    return trainer, reward, callback


def replay(calls, eos_id):
    """taut's own strategy on the same groups: (rewards per call, GroupBatch per call)."""
    strategy = build_strategy(MASTERY)
    out = []
    for call in calls:
        prompts, ids = call["prompts"], call["ids"]
        for start in range(0, len(prompts), G):                       # TRL's layout: G consecutive per prompt
            assert len(set(prompts[start:start + G])) == 1, "a group must hold one prompt"
        cap = length_cap(SIRI.schedule, call["step"], SIRI.l_max, SIRI.l_min, SIRI.period)
        batch = GroupBatch.from_flat(
            prompts, [lenient(c, a) for c, a in zip(call["completions"], call["answers"])],
            [len(i) for i in ids], [i[-1] != eos_id for i in ids], step=call["step"], cap=cap,
        )
        out.append((strategy.shape(batch).rewards.flatten().tolist(), batch))
    return out


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_grpo_trainer_follows_the_schedule_and_taut_shapes_the_rewards(tmp_path, one_thread):
    steps = 4
    trainer, reward, callback = run_grpo(tmp_path, per_device=8, steps=steps)
    caps = {s: length_cap(SIRI.schedule, s, SIRI.l_max, SIRI.l_min, SIRI.period) for s in range(steps)}
    assert callback.applied == caps == {0: 12, 1: 8, 2: 4, 3: 8}

    assert [c["step"] for c in reward.calls] == list(range(steps))
    for call in reward.calls:
        assert len(call["ids"]) == 8 and max(len(i) for i in call["ids"]) <= caps[call["step"]]
    assert any(max(len(i) for i in c["ids"]) == caps[c["step"]] for c in reward.calls)

    eos = trainer.processing_class.eos_token_id
    replayed = replay(reward.calls, eos)
    for call, (want, _batch) in zip(reward.calls, replayed):
        assert call["rewards"] == pytest.approx(want, abs=1e-6)
    assert any(0 < r < 1 for call in reward.calls for r in call["rewards"]), "some correct rollouts should be penalised"

    logged = [entry for entry in trainer.state.log_history if "taut-mastery-gated/cap" in entry]
    assert [entry["taut-mastery-gated/cap"] for entry in logged] == [caps[s] for s in range(steps)]
    assert all("rewards/taut-mastery-gated/mean" in entry for entry in logged)


def test_reward_and_verifier_are_picklable_and_check_their_inputs():
    from taut.models.testbed import build_testbed_model
    from taut.tasks import load_task

    eos = build_testbed_model("tiny").tokenizer.eos_token_id
    verifier = TaskVerifier("gym:add")
    reward = StrategyReward({"name": "siri", "l_max": 12, "l_min": 4, "period": 4}, verifier,
                            num_generations=2, max_completion_length=12, eos_token_id=eos, gather=False)
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "taut-siri" and clone.cap(2) == 4

    task = load_task("gym:add")
    problem = task.problems("train", 1)[0]
    right = f"answer {problem.answer}"
    for text, complete in ((right, True), (right, False), ("answer 0 0 0", True)):
        assert clone.verifier(text, problem.answer, complete) == task.verify(problem, text, complete).correct

    class State:
        global_step = 2                                               # cap 4
    ids_right = [3] * 3 + [eos]                                       # 4 tokens with EOS: complete
    ids_cut = [3] * 4                                                 # 4 tokens without EOS: truncated
    out = clone(prompts=["p", "p"], completions=[right, right], completion_ids=[ids_right, ids_cut],
                trainer_state=State(), answer=[problem.answer] * 2)
    assert out == [1.0, 0.0]                                          # SIRI: the capped rollout scores 0
    with pytest.raises(ValueError, match="exceeds the cap 4"):
        clone(prompts=["p", "p"], completions=[right, right], completion_ids=[ids_right, [3] * 5],
              trainer_state=State(), answer=[problem.answer] * 2)
    with pytest.raises(ValueError, match="not a multiple of num_generations"):
        clone(prompts=["p"], completions=[right], completion_ids=[ids_right], trainer_state=State(), answer=["1"])
    with pytest.raises(ValueError, match="no dataset column 'answer'"):
        clone(prompts=["p", "p"], completions=[right, right], completion_ids=[ids_right, ids_right], trainer_state=State())
    with pytest.raises(ValueError, match="on-policy-sft"):
        StrategyReward({"name": "on-policy-sft"}, lenient, num_generations=2, max_completion_length=8, eos_token_id=eos)
    with pytest.raises(ValueError, match="unknown strategy 'nope'; valid strategies: none, siri"):
        StrategyReward({"name": "nope"}, lenient, num_generations=2, max_completion_length=8, eos_token_id=eos)


# ---- two processes ------------------------------------------------------------------------------


def test_two_processes_score_split_groups_whole(tmp_path):
    """per_device_train_batch_size=2 < G=4: each group is split over the two ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_USE_CPU": "true"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           __file__, "--out", str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    steps = len(ranks[0]["calls"])
    assert steps == 2 and len(ranks[1]["calls"]) == steps
    merged = []
    for s in range(steps):
        local = [rank["calls"][s] for rank in ranks]
        assert all(len(c["ids"]) == 2 for c in local), "each rank holds half of a group"
        assert local[0]["prompts"] == local[1]["prompts"], "the two halves are the same prompt's group"
        merged.append({key: (local[0][key] + local[1][key] if isinstance(local[0][key], list) else local[0][key])
                       for key in local[0]})
    for call, (want, batch) in zip(merged, replay(merged, ranks[0]["eos"])):
        assert batch.correct.shape == (1, G)
        assert call["rewards"] == pytest.approx(want, abs=1e-6)

    for rank in ranks:                                                 # without gathering: a clear error
        assert "split across processes" in rank["error_without_gather"]


def _worker(out: Path) -> None:
    """One rank of the two-process run (launched by torchrun from the test above)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    trainer, reward, _ = run_grpo(out / "gather", per_device=2, steps=2, gather=True)
    record = {"calls": reward.calls, "eos": trainer.processing_class.eos_token_id}
    try:
        run_grpo(out / "no-gather", per_device=2, steps=1, gather=False)
        record["error_without_gather"] = ""
    except ValueError as err:
        record["error_without_gather"] = str(err)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    # Both ranks leave together, then skip interpreter teardown: gloo's threads, torn down while
    # the two trainers above are still referenced, occasionally abort the process at exit.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    _worker(parser.parse_args().out)


@pytest.mark.parametrize("example", ["trl_siri.py", "trl_mastery.py"])
def test_the_examples_train_the_shipped_model_by_default(example, tmp_path):
    """Run as documented (no --model), the examples train something: with random weights every
    reward was 0 and every logged loss and gradient norm 0."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "src")}
    proc = subprocess.run([sys.executable, str(root / "examples" / example), "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import re

    logged = re.findall(r"'grad_norm': '([0-9.e+-]+)'.*?'reward': '([0-9.e+-]+)'", proc.stdout + proc.stderr)
    assert len(logged) == 8 and any(float(g) > 0 for g, _ in logged) and any(float(r) > 0 for _, r in logged), logged
