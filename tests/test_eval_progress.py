"""Evaluation with a progress display generates in batches and gets the very same samples."""

import json

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


class Killed(Exception):
    pass


def _stop_after(batches):
    calls = []

    def progress(done):
        calls.append(done)
        if len(calls) == batches:
            raise Killed
    return progress


def _key(samples):
    return [(s.problem_id, s.text, s.correct, s.length) for s in samples]


def test_a_killed_evaluation_resumes_from_its_journal_with_the_same_samples(tmp_path):
    """Sampled at temperature 1, so the random generator's state must come back with the batches."""
    from taut.evaluate import Journal

    policy = load_policy(ModelConfig(preset="tiny", threads=1))
    tasks = [load_task("gym:add", None)]
    cfg = EvalConfig(n_per_level=3, samples=2, batch_size=4, temperature=1.0)      # 6 batches of 2 problems
    whole = generate_and_grade(policy, tasks, cfg, max_new_tokens=12, seed=3, progress=lambda done: None)
    path = tmp_path / "eval" / "greedy.partial.jsonl"
    try:
        generate_and_grade(policy, tasks, cfg, max_new_tokens=12, seed=3, progress=_stop_after(3), journal=Journal(path, "m"))
    except Killed:
        pass
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 3                                   # the key, then the three batches done
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])   # the third batch's line cut off by the kill
    generated = []
    journal = Journal(path, "m")
    resumed = generate_and_grade(policy, tasks, cfg, max_new_tokens=12, seed=3, progress=generated.append, journal=journal)
    assert generated == [4, 6, 8, 10, 12]                        # two batches read back, the rest generated
    assert _key(resumed) == _key(whole)
    seconds = [json.loads(line)["seconds"] for line in path.read_text().splitlines()[1:]]
    assert journal.earlier_seconds == seconds[1] > 0             # the killed process's time, up to its last whole batch
    assert seconds == sorted(seconds) and len(seconds) == 6      # the evaluation's time so far, across both processes


def test_a_journal_of_other_settings_or_another_model_is_started_afresh(tmp_path):
    from taut.evaluate import Journal

    policy = load_policy(ModelConfig(preset="tiny", threads=1))
    tasks = [load_task("gym:add", None)]
    cfg = EvalConfig(n_per_level=2, samples=1, batch_size=2, temperature=1.0)
    path = tmp_path / "x.partial.jsonl"
    try:
        generate_and_grade(policy, tasks, cfg, max_new_tokens=8, seed=1, progress=_stop_after(2), journal=Journal(path, "m"))
    except Killed:
        pass
    for seed, identity in [(2, "m"), (1, "another model")]:
        calls = []
        fresh = generate_and_grade(policy, tasks, cfg, max_new_tokens=8, seed=seed, progress=calls.append,
                                   journal=Journal(path, identity))
        assert calls[0] == 2                                     # nothing read back: the first batch generated
        assert _key(fresh) == _key(generate_and_grade(policy, tasks, cfg, max_new_tokens=8, seed=seed, progress=lambda d: None))


def test_a_damaged_journal_line_ends_what_is_read_back(tmp_path):
    """Valid JSON that is not a batch (a line written by something else, or damaged in place) is
    read as the end of the journal: the batches before it are kept, the rest generated again."""
    from taut.evaluate import Journal

    policy = load_policy(ModelConfig(preset="tiny", threads=1))
    tasks = [load_task("gym:add", None)]
    cfg = EvalConfig(n_per_level=2, samples=1, batch_size=2, temperature=1.0)
    path = tmp_path / "x.partial.jsonl"
    whole = generate_and_grade(policy, tasks, cfg, max_new_tokens=8, seed=1, progress=lambda d: None, journal=Journal(path, "m"))
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1], json.dumps({"done": 4}), *lines[3:]]) + "\n")
    calls = []
    again = generate_and_grade(policy, tasks, cfg, max_new_tokens=8, seed=1, progress=calls.append, journal=Journal(path, "m"))
    assert calls[:2] == [2, 4] and _key(again) == _key(whole)


def test_the_journal_key_holds_the_decode_settings_and_code(monkeypatch):
    """bf16 and fp32, the decode kernels on and off, or other rollout code generate other tokens
    for the same model and problems: a journal written under one is not read under another."""
    from taut.config import RunConfig
    from taut.workflows import decode_identity

    config = RunConfig.model_validate({"model": {"preset": "tiny", "dtype": "float32"}})
    base = decode_identity(config)
    assert decode_identity(config.model_copy(update={"model": config.model.model_copy(update={"dtype": "bf16-mixed"})})) != base
    monkeypatch.setenv("TAUT_NATIVE", "0")
    assert decode_identity(config) != base
