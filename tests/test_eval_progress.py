"""Evaluation with a progress display generates in batches and gets the very same samples."""

from taut.config import EvalConfig, ModelConfig
from taut.evaluate import generate_and_grade
from taut.models.loading import load_policy
from taut.tasks import load_task


def test_progress_batches_do_not_change_the_samples():
    policy = load_policy(ModelConfig(preset="tiny", threads=1))
    tasks = [load_task("gym:add", None)]
    cfg = EvalConfig(n_per_level=3, samples=2, batch_size=4)          # 2 problems per batch: 6 batches
    calls = []
    plain = generate_and_grade(policy, tasks, cfg, max_new_tokens=12, seed=3)
    shown = generate_and_grade(policy, tasks, cfg, max_new_tokens=12, seed=3, progress=calls.append)
    assert calls == [2, 4, 6, 8, 10, 12]
    assert [(s.problem_id, s.text, s.correct) for s in shown] == [(s.problem_id, s.text, s.correct) for s in plain]
