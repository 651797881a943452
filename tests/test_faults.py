"""Faults a run meets in practice: a reused or shared run directory, non-finite updates, damaged
checkpoints, oversized or mis-encoded data, operational errors. Each ends in a clear, named
error or a documented recovery, never a silent wreck or a raw traceback."""

import copy
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from taut.checkpoint import (
    CheckpointError,
    NonFiniteCheckpointError,
    latest_intact_checkpoint,
    list_checkpoints,
    load_optimizer,
    read_state,
    remove_partial,
    save_checkpoint,
    verify_checkpoint,
)
from taut.config import ConfigError, FileTaskConfig, load_config
from taut.rl.guard import NonFiniteGuard, TrainingDiverged, first_nonfinite
from taut.rundir import LOCK_FILE, RunDirBusy, RunDirError, claim_run_dir, run_files
from taut.tasks.files import (
    CHARS_PER_TOKEN_BOUND,
    DataError,
    FileTask,
    PromptLimit,
    read_rows,
)

SRC = str(Path(__file__).parent.parent / "src")


def _python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


# ---------------------------------------------------------------------------------------------
# 2. a run directory is never destroyed or shared by accident
# ---------------------------------------------------------------------------------------------


def _fake_run(run_dir: Path) -> None:
    (run_dir / "checkpoints" / "step-000000").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')


def test_a_directory_holding_a_run_is_refused_unless_resumed_or_overwritten(tmp_path):
    run = tmp_path / "run"
    _fake_run(run)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"already holds a run \(config.yaml, metrics.jsonl, checkpoints\).*--resume.*--overwrite"):
        with claim_run_dir(run, resume=False, overwrite=False):
            pass
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'       # untouched
    with claim_run_dir(run, resume=True, overwrite=False):
        assert (run / "checkpoints" / "step-000000").is_dir()             # resuming keeps everything
    with claim_run_dir(run, resume=False, overwrite=True):
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE, "notes.txt"]   # the run's files only
    with pytest.raises(RunDirError, match="choose one"):
        with claim_run_dir(run, resume=True, overwrite=True):
            pass
    with claim_run_dir(tmp_path / "new" / "deep", resume=False, overwrite=False) as fresh:
        assert fresh.is_dir()


def test_a_fresh_run_that_fails_before_any_result_leaves_nothing_to_overwrite(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(OSError):
        with claim_run_dir(run, resume=False, overwrite=False):
            (run / "config.yaml").write_text("seed: 0\n")
            (run / "metrics.jsonl").write_text("")
            (run / "checkpoints" / ".tmp-step-000001").mkdir(parents=True)
            raise OSError("the model could not be loaded")
    assert run_files(run) == []
    with claim_run_dir(run, resume=False, overwrite=False):          # the same command runs again
        pass
    # one with a result keeps everything, and so does a resumed run that fails
    for resume, result in ((False, lambda: (run / "metrics.jsonl").write_text('{"step": 1}\n')),
                           (False, lambda: (run / "checkpoints" / "step-000001").mkdir(parents=True)),
                           (True, lambda: None)):
        with pytest.raises(KeyboardInterrupt):
            with claim_run_dir(run, resume=resume, overwrite=not resume):
                (run / "config.yaml").write_text("seed: 0\n")
                result()
                raise KeyboardInterrupt
        assert "config.yaml" in run_files(run)


def test_cli_a_failed_start_can_be_corrected_and_run_again(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    code, err = _main(monkeypatch, capsys, "train", "--config", "builtin:grpo", "--set", "model.path=/nonexistent/model",
                      "--out", str(run), "--quiet")
    assert code == 2 and "does not exist" in _one_line(err)
    assert run_files(run) == []                  # retrying is not refused with "already holds a run"


def test_a_second_process_is_locked_out_with_the_holders_pid_until_the_holder_dies(tmp_path):
    run = tmp_path / "run"
    holder = _python(f"""
        import sys, time
        from taut.rundir import claim_run_dir
        with claim_run_dir({str(run)!r}, resume=False, overwrite=False):
            print("held", flush=True)
            time.sleep(60)
    """)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        with pytest.raises(RunDirBusy, match=rf"in use by another taut process \(PID {holder.pid}\)"):
            with claim_run_dir(run, resume=True, overwrite=False):
                pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)           # dies holding the lock: no cleanup code runs
        holder.wait()
    with claim_run_dir(run, resume=True, overwrite=False):   # the kernel released it
        assert (run / LOCK_FILE).read_text().strip() == str(os.getpid())
    assert (run / LOCK_FILE).read_text() == ""


def test_remove_partial_spares_live_writers_and_restores_an_interrupted_swap(tmp_path):
    root = tmp_path / "checkpoints"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for name in (f".tmp-step-000004-{live.pid}", f".tmp-step-000004-{dead.pid}",
                     f".tmp-old-step-000002-{dead.pid}", f".tmp-old-step-000003-{dead.pid}", "step-000003"):
            (root / name).mkdir(parents=True)
        (root / f".tmp-old-step-000002-{dead.pid}" / "model.safetensors").write_text("complete")
        remove_partial(tmp_path)
        assert sorted(p.name for p in root.iterdir()) == [f".tmp-step-000004-{live.pid}", "step-000002", "step-000003"]
        assert (root / "step-000002" / "model.safetensors").read_text() == "complete"
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------------------------------------
# 3. non-finite values never reach a checkpoint
# ---------------------------------------------------------------------------------------------


def _tiny_net(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _backward(model, scale: float = 1.0) -> torch.Tensor:
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    (model(x).sum() * scale).backward()
    return torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def _same_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_an_infinite_gradient_skips_the_step_and_the_run_continues_as_if_it_never_happened(caplog):
    model, opt = _tiny_net()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    guard = NonFiniteGuard(model, opt, max_consecutive=3)
    for m, o in ((model, opt), (reference, ref_opt)):       # one good step on both
        o.zero_grad()
        _backward(m)
        o.step()
    opt.zero_grad()
    _backward(model)
    model[0].weight.grad[0, 0] = float("inf")                # the injected fault
    with caplog.at_level(logging.WARNING):
        assert not guard.step(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0), where="step 2")
    assert "skipped the optimizer step at step 2: gradient norm is" in caplog.text
    assert guard.skipped == 1 and guard.consecutive == 1
    assert _same(model, reference) and _same_state(opt, ref_opt)
    for m, o, g in ((model, opt, guard), (reference, ref_opt, None)):
        o.zero_grad()
        norm = _backward(m)
        g.step(norm) if g else o.step()
    assert guard.consecutive == 0 and _same(model, reference) and _same_state(opt, ref_opt)


@pytest.mark.parametrize("first", [True, False], ids=["first-step", "later-step"])
def test_a_step_that_overflows_the_weights_is_undone_with_its_optimizer_state(first):
    model, opt = _tiny_net()
    if not first:
        opt.zero_grad()
        _backward(model)
        opt.step()
    with torch.no_grad():
        model[0].weight[0, 0] = 2.0
    before, before_opt = copy.deepcopy(model), copy.deepcopy(opt)
    guard = NonFiniteGuard(model, opt, max_consecutive=2)
    opt.param_groups[0]["lr"] = 1e37                         # huge: decoupled weight decay scales
    opt.param_groups[0]["weight_decay"] = 30.0               # the 2.0 by 1 - 3e38, past fp32's range
    opt.zero_grad()
    assert not guard.step(_backward(model))
    assert first_nonfinite(model.named_parameters()) is None
    assert _same(model, before) and _same_state(opt, before_opt)
    assert (len(opt.state) == 0) == first                     # no state appears from an undone first step
    opt.zero_grad()
    with pytest.raises(TrainingDiverged, match=r"2 optimizer steps in a row were not finite.*rl.max_nonfinite_skips"):
        guard.step(_backward(model))
    assert _same(model, before)                               # diverged, yet the weights are the last good ones


def test_without_a_snapshot_an_overflowing_step_stops_at_once():
    model, opt = _tiny_net()
    with torch.no_grad():
        model[0].weight[0, 0] = 2.0
    guard = NonFiniteGuard(model, opt, max_consecutive=5, snapshot=False)
    opt.param_groups[0].update(lr=1e37, weight_decay=30.0)
    with pytest.raises(TrainingDiverged, match="no snapshot"):
        guard.step(_backward(model))


def test_auto_keeps_a_copy_only_where_a_step_can_overflow_the_weights():
    """`snapshot="auto"`: none for fp32 weights under AdamW with a clipped gradient and a learning
    rate in bounds; one for bf16 weights, without clipping, or once the learning rate leaves the
    bounds (read at every step) — and then the overflowing step is undone as with `True`."""
    model, opt = _tiny_net()
    assert not NonFiniteGuard(model, opt, snapshot="auto", max_grad_norm=1.0).snapshot
    assert NonFiniteGuard(model, opt, snapshot="auto").snapshot                        # no clipping: no bound
    assert NonFiniteGuard(model, torch.optim.SGD(model.parameters(), lr=1e-2), snapshot="auto", max_grad_norm=1.0).snapshot
    assert NonFiniteGuard(model, torch.optim.AdamW(model.parameters(), eps=0.0), snapshot="auto", max_grad_norm=1.0).snapshot
    low, low_opt = _tiny_net()
    low.to(torch.bfloat16)
    assert NonFiniteGuard(low, low_opt, snapshot="auto", max_grad_norm=1.0).snapshot
    with pytest.raises(ValueError, match="snapshot must be"):
        NonFiniteGuard(model, opt, snapshot="sometimes")

    with torch.no_grad():
        model[0].weight[0, 0] = 2.0
    before, before_opt = copy.deepcopy(model), copy.deepcopy(opt)
    guard = NonFiniteGuard(model, opt, max_consecutive=2, snapshot="auto", max_grad_norm=1.0)
    opt.param_groups[0].update(lr=1e37, weight_decay=30.0)                             # out of bounds: the copy is back
    assert guard.snapshot and not guard.step(_backward(model))
    assert _same(model, before) and _same_state(opt, before_opt)


def test_fp32_adamw_steps_with_clipped_gradients_stay_finite_where_auto_keeps_no_copy():
    """The bound auto relies on, by property: random fp32 weights up to 1e6, gradients of any finite
    size clipped to norm 1, learning rates and decays up to auto's bounds, 20 steps: every weight
    stays finite (each update is at most lr·max_norm/eps = 1e8 here)."""
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        weights = torch.nn.Parameter((torch.rand(64, generator=g) - 0.5) * 2 * 10 ** float(torch.randint(0, 7, (1,), generator=g)))
        lr = float(10 ** (-6 * torch.rand(1, generator=g)))                           # 1e-6 … 1
        opt = torch.optim.AdamW([weights], lr=lr, weight_decay=float(2 / lr * torch.rand(1, generator=g)))
        guard = NonFiniteGuard(torch.nn.ParameterList([weights]), opt, snapshot="auto", max_grad_norm=1.0)
        assert not guard.snapshot, trial
        for _ in range(20):
            scale = 10 ** float(torch.randint(-30, 37, (1,), generator=g))
            weights.grad = (torch.randn(64, generator=g) * scale).clamp(-3e38, 3e38)
            norm = torch.nn.utils.clip_grad_norm_([weights], 1.0)
            if torch.isfinite(norm):
                assert guard.step(norm), trial
        assert torch.isfinite(weights).all(), trial


def test_auto_without_a_copy_stops_at_a_non_finite_step_and_says_why(monkeypatch):
    import taut.rl.guard as guard_module

    model, opt = _tiny_net()
    guard = NonFiniteGuard(model, opt, snapshot="auto", max_grad_norm=1.0, section="sft")
    monkeypatch.setattr(guard_module, "first_nonfinite", lambda params: "0.weight")
    with pytest.raises(TrainingDiverged, match=r"auto keeps none for fp32 weights.*set sft\.undo_nonfinite_steps: true"):
        guard.step(_backward(model))


def test_a_step_that_raises_midway_is_undone_and_the_error_propagates():
    model, opt = _tiny_net()
    opt.zero_grad()
    _backward(model)
    opt.step()
    before, before_opt = copy.deepcopy(model), copy.deepcopy(opt)
    guard = NonFiniteGuard(model, opt)
    opt.param_groups[0]["lr"] = 1e39                         # torch refuses the scalar after updating the moments
    opt.zero_grad()
    with pytest.raises(RuntimeError, match="overflow"):
        guard.step(_backward(model))
    assert _same(model, before) and _same_state(opt, before_opt)


def test_first_nonfinite_names_the_tensor_and_ignores_a_sum_that_merely_overflows():
    big = torch.full((4,), 3e38)                              # finite; its sum is inf
    assert first_nonfinite([("big", big), ("ok", torch.ones(3))]) is None
    nan = torch.ones(5)
    nan[3] = float("nan")
    assert first_nonfinite([("ok", torch.ones(3)), ("bad", nan), ("ints", torch.arange(3))]) == "bad"


def test_a_checkpoint_is_never_written_from_non_finite_weights(tmp_path):
    from taut.models.testbed import build_testbed_model

    policy = build_testbed_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(policy.model.parameters())
    name, param = next(iter(policy.model.named_parameters()))
    with torch.no_grad():
        param[0, 0] = float("nan")
    with pytest.raises(NonFiniteCheckpointError, match=rf"step 5: parameter {name} holds NaN or infinity"):
        save_checkpoint(tmp_path, 5, policy, {"kind": "rl"}, optimizer)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize("override, message", [
    ("rl.lr=inf", "rl.lr: Input should be a finite number"),
    ("rl.lr=1e38", "rl.lr: Input should be less than or equal to 1"),
    ("rl.lr=1e6", "rl.lr: Input should be less than or equal to 1"),
    ("sft.lr=.nan", "sft.lr: Input should be a finite number"),
    ("rl.temperature=0", "rl.temperature: Input should be greater than 0"),
    ("rl.temperature=.inf", "rl.temperature: Input should be a finite number"),
    ("rl.kl_coef=.inf", "rl.kl_coef: Input should be a finite number"),
    ("rl.betas=[0.9, 1.0]", "rl.betas: Value error, Adam betas must each lie in [0, 1)"),
    ("rl.clip_low=1.5", "rl.clip_low: Input should be less than 1"),
    ("strategy={name: kimi, weight: .inf}", "strategy.weight: Input should be a finite number"),
    ("phases=[{name: a, steps: 3, lr: 5.0}]", "phases.0.lr: Input should be less than or equal to 1"),
    ("rl.max_nonfinite_skips=0", "rl.max_nonfinite_skips: Input should be greater than or equal to 1"),
    ("data.max_prompt_tokens=-1", "data.max_prompt_tokens: Input should be greater than 0"),
])
def test_config_numbers_must_be_finite_and_sane_and_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value), str(err.value)


def test_config_defaults_and_zero_steps():
    config = load_config(None, ["rl.steps=0"])
    assert config.plan() == [] and config.rl_steps() == 0
    assert config.rl.max_nonfinite_skips == 3 and config.data.max_prompt_tokens is None
    phased = load_config(None, ["rl.steps=0", "phases=[{name: a, steps: 3}]"])
    assert phased.plan() == [] and phased.rl_steps() == 0


# ---------------------------------------------------------------------------------------------
# 4. resume survives damaged files
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A run directory with checkpoints at steps 1 and 2 (optimizer state included)."""
    from taut.models.testbed import build_testbed_model

    run = tmp_path_factory.mktemp("run")
    policy = build_testbed_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for step in (1, 2):
        optimizer.zero_grad()
        ids = torch.arange(8).reshape(1, 8) % policy.model.config.vocab_size
        policy.model(input_ids=ids).logits.sum().backward()
        optimizer.step()
        save_checkpoint(run, step, policy, {"kind": "rl", "note": step}, optimizer, {"sampling": generator})
    return run


def _flip_header_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b'"dtype":"F32"') + len(b'"dtype":"')
    data[at:at + 3] = b"F16"                                   # same size, a different tensor table
    path.write_bytes(bytes(data))


DAMAGE = {
    "missing weights": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
    "truncated weights": (lambda c: os.truncate(c / "model.safetensors", 1000), "model.safetensors has 1000 bytes"),
    "tampered header": (lambda c: _flip_header_byte(c / "model.safetensors"), "model.safetensors does not match its checksum"),
    "empty optimizer": (lambda c: os.truncate(c / "optimizer.safetensors", 0), "optimizer.safetensors has 0 bytes"),
    "garbled config": (lambda c: (c / "config.json").write_text("{not json"), "config.json has 9 bytes"),
    "garbled trainer state": (lambda c: (c / "trainer_state.json").write_text("[" * 3), "trainer_state.json has 3 bytes"),
    "garbled manifest": (lambda c: (c / "manifest.json").write_text("{"), "manifest.json is damaged"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_resume_falls_back_to_the_newest_intact_checkpoint_naming_the_damage(kind, saved_run, tmp_path, caplog):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    damage, problem = DAMAGE[kind]
    latest = run / "checkpoints" / "step-000002"
    assert verify_checkpoint(latest) is None
    damage(latest)
    assert problem in verify_checkpoint(latest)
    with caplog.at_level(logging.WARNING):
        chosen = latest_intact_checkpoint(run)
    assert chosen.name == "step-000001"
    assert f"step-000002: {problem}" in caplog.text
    assert read_state(chosen)["note"] == 1                     # and it loads
    from taut.models.testbed import build_testbed_model

    load_optimizer(torch.optim.AdamW(build_testbed_model("tiny", seed=0).model.parameters()), chosen)

    damage(run / "checkpoints" / "step-000001")
    with pytest.raises(CheckpointError) as err:
        latest_intact_checkpoint(run)
    assert "no intact checkpoint" in str(err.value) and "step-000001" in str(err.value) and "\n" not in str(err.value)


def test_checkpoints_without_a_manifest_are_checked_by_structure(saved_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    for checkpoint in list_checkpoints(run):
        (checkpoint / "manifest.json").unlink()
    latest = run / "checkpoints" / "step-000002"
    assert verify_checkpoint(latest) is None
    os.truncate(latest / "model.safetensors", 5000)
    assert "model.safetensors: " in verify_checkpoint(latest) and "truncated" in verify_checkpoint(latest)
    (run / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{")
    assert "trainer_state.json is not valid JSON" in verify_checkpoint(run / "checkpoints" / "step-000001")


def test_stray_entries_in_checkpoints_are_ignored(saved_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    (run / "checkpoints" / "step-final").mkdir()
    (run / "checkpoints" / "step-000009").write_text("a file, not a checkpoint")
    (run / "checkpoints" / "notes").mkdir()
    assert [p.name for p in list_checkpoints(run)] == ["step-000001", "step-000002"]
    assert latest_intact_checkpoint(run).name == "step-000002"
    assert latest_intact_checkpoint(tmp_path / "empty") is None


def test_garbled_run_files_are_named(saved_run, tmp_path):
    import shutil

    from taut.checkpoint import chosen_checkpoint

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    (run / "selection.json").write_text('{"checkpoint": ')
    with pytest.raises(CheckpointError, match=r"selection\.json: the run's checkpoint choice is not valid JSON"):
        chosen_checkpoint(run)
    (run / "selection.json").write_text('{"checkpoint": "step-000007"}')
    with pytest.raises(CheckpointError, match=r"names checkpoint 'step-000007', which is not in"):
        chosen_checkpoint(run)
    state = run / "checkpoints" / "step-000002" / "trainer_state.json"
    state.write_text("\x00\x01")
    with pytest.raises(CheckpointError, match=rf"{state}: the trainer state is not valid JSON"):
        read_state(state.parent)


# ---------------------------------------------------------------------------------------------
# 5. inputs that exhaust memory; encodings
# ---------------------------------------------------------------------------------------------


def _jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return path


def test_over_long_prompts_are_skipped_with_a_count_and_the_first_location(tmp_path, caplog):
    path = _jsonl(tmp_path / "d.jsonl", ["short one", "x " * 400, "short two", "y " * 400, "short three"])
    words = PromptLimit(100, count_tokens=lambda text: len(text.split()))
    with caplog.at_level(logging.WARNING):
        task = FileTask(FileTaskConfig(path=str(path), verifier="exact"), prompt_limit=words)
    assert [r.prompt for r in task.rows] == ["short one", "short two", "short three"]
    assert [r.index for r in task.rows] == [1, 3, 5]                         # ids do not shift
    assert task.skipped_long == [f"{path}:2", f"{path}:4"]
    assert "skipped 2 of 5 rows whose prompt is longer than 100 tokens" in caplog.text and f"the first: {path}:2" in caplog.text
    assert len(FileTask(FileTaskConfig(path=str(path), verifier="exact")).rows) == 5   # no limit: all rows

    chars = PromptLimit(2)                                                   # no tokenizer: a character bound
    assert not chars.too_long("z" * 2 * CHARS_PER_TOKEN_BOUND) and chars.too_long("z" * (2 * CHARS_PER_TOKEN_BOUND + 1))
    with pytest.raises(DataError, match=rf"every prompt is longer than .* the first at {path}:1"):
        FileTask(FileTaskConfig(path=str(path), verifier="exact"), prompt_limit=PromptLimit(1, lambda t: 10 ** 6))


def test_the_default_prompt_limit_is_the_context_minus_the_rollout_cap(tiny_policy):
    limit = PromptLimit.for_policy(None, tiny_policy, max_new_tokens=128)
    assert limit.max_tokens == tiny_policy.model.config.max_position_embeddings - 128
    text = " ".join(["1"] * 2000)
    assert limit.too_long(text) and not limit.too_long("1 + 1")
    assert PromptLimit.for_policy(7, tiny_policy, 128).max_tokens == 7
    context = tiny_policy.model.config.max_position_embeddings          # a cap beyond the context: the context bounds
    assert PromptLimit.for_policy(None, tiny_policy, max_new_tokens=10 ** 6).max_tokens == context


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_non_utf8_bytes_name_the_file_and_line(fmt, tmp_path):
    path = tmp_path / f"d.{fmt}"
    head = b"prompt,answer\nfine,1\n" if fmt == "csv" else b'{"prompt": "fine", "answer": "1"}\n'
    bad = b"caf\xe9,2\n" if fmt == "csv" else b'{"prompt": "caf\xe9", "answer": "2"}\n'
    path.write_bytes(head + bad)
    with pytest.raises(DataError, match=rf"{path}:{3 if fmt == 'csv' else 2}: not valid UTF-8 \(byte 0xe9"):
        read_rows(FileTaskConfig(path=str(path)))


def test_a_non_utf8_recipe_names_its_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_bytes(b"seed: 0\nrl:\n  lr: 0.001 # \xff\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: not valid UTF-8"):
        load_config(path)


# ---------------------------------------------------------------------------------------------
# 6. one clear line for every operational error
# ---------------------------------------------------------------------------------------------


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    from taut import cli

    monkeypatch.setattr(sys, "argv", ["taut", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    return exit_.value.code, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_cli_refuses_a_used_run_directory_and_a_locked_one(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _fake_run(run)
    code, err = _main(monkeypatch, capsys, "train", "--config", "default", "--out", str(run), "--quiet")
    assert code == 2 and "already holds a run" in _one_line(err)
    with claim_run_dir(run, resume=True, overwrite=False):
        code, err = _main(monkeypatch, capsys, "train", "--resume", str(run), "--quiet")
    assert code == 2 and f"(PID {os.getpid()})" in _one_line(err)


def test_cli_demo_refuses_a_used_run_directory_and_a_locked_one(tmp_path, monkeypatch, capsys):
    """`taut demo --out` into another run's directory replaced that run's metrics without asking."""
    run = tmp_path / "run"
    _fake_run(run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, err = _main(monkeypatch, capsys, "demo", "--out", str(run), "--quiet")
    assert code == 2 and "already holds a run" in _one_line(err) and "--resume" not in err     # demo has no --resume
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_FILE} == before
    with claim_run_dir(run, resume=True, overwrite=False):
        code, err = _main(monkeypatch, capsys, "demo", "--out", str(run), "--overwrite", "--quiet")
    assert code == 2 and f"(PID {os.getpid()})" in _one_line(err)
    assert (run / "metrics.jsonl").exists()                   # --overwrite removes nothing while another holds it


@pytest.mark.parametrize("suite", [None, "gate"])
def test_cli_bench_keeps_out_a_second_process_and_reuses_its_own_directory(tmp_path, monkeypatch, capsys, suite):
    """Two `taut bench` processes on one --out both trained the same methods into the same run
    directories; the second now stops before it starts, and a bench directory is still reused."""
    import taut.lab.bench.matrix as matrix
    import taut.lab.bench.suite as suites

    runs = []
    monkeypatch.setattr(matrix, "run_bench", lambda *a: runs.append(a) or {"seconds": 0.0, "rows": []})
    monkeypatch.setattr(suites, "run_suite", lambda *a: runs.append(a) or {"seconds": 0.0, "suite": {"rows": []}})
    out = tmp_path / "bench"
    args = ["bench", "--quick", "--out", str(out)] + (["--suite", suite] if suite else [])
    with claim_run_dir(out, resume=True, overwrite=False):
        code, err = _main(monkeypatch, capsys, *args)
    assert code == 2 and f"in use by another taut process (PID {os.getpid()})" in _one_line(err) and not runs
    (out / "report").mkdir()            # a bench directory holding its runs and report is continued, not refused
    code, _ = _main(monkeypatch, capsys, *args)
    assert code == 0 and len(runs) == 1 and runs[0][1] == out and (out / LOCK_FILE).read_text() == ""


def test_cli_eval_of_a_run_without_an_intact_checkpoint(saved_run, tmp_path, monkeypatch, capsys):
    import shutil

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("seed: 0\n")
    code, err = _main(monkeypatch, capsys, "eval", str(empty), "--quiet")
    assert code == 2 and "has no checkpoints yet" in _one_line(err)

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    os.truncate(run / "checkpoints" / "step-000002" / "model.safetensors", 10)
    code, err = _main(monkeypatch, capsys, "eval", str(run), "--quiet")
    assert code == 2 and "step-000002 is damaged: model.safetensors has 10 bytes" in _one_line(err)
    (run / "selection.json").write_text("{")
    code, err = _main(monkeypatch, capsys, "eval", str(run), "--quiet")
    assert code == 2 and "selection.json: the run's checkpoint choice is not valid JSON" in _one_line(err)


def test_cli_not_a_directory_and_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "file" / "run")
    code, err = _main(monkeypatch, capsys, "train", "--config", "default", "--out", out, "--quiet")
    assert code == 2 and "not a directory" in _one_line(err) and str(tmp_path / "file") in err
    code, err = _main(monkeypatch, capsys, "--debug", "train", "--config", "default", "--out", out, "--quiet")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("error, expected", [
    (OSError(errno.ENOSPC, "No space left on device", "/runs/a/metrics.jsonl"), "/runs/a/metrics.jsonl: no space left on the device"),
    (PermissionError(errno.EACCES, "Permission denied", "/runs/a"), "/runs/a: permission denied"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/runs/f/x"), "/runs/f/x: not a directory"),
    (TrainingDiverged("training diverged: 3 optimizer steps in a row"), "training diverged"),
    (NonFiniteCheckpointError("refusing to write a checkpoint"), "refusing to write a checkpoint"),
    (RunDirBusy("in use"), "in use"),
])
def test_cli_maps_operational_errors_to_one_line_and_an_exit_code(error, expected, monkeypatch, capsys):
    from taut import cli

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, "app", fail)
    code, err = _main(monkeypatch, capsys, "train")
    assert code == (3 if isinstance(error, (TrainingDiverged, NonFiniteCheckpointError)) else 2)
    assert expected in _one_line(err)


def test_cli_lets_a_bug_raise(monkeypatch):
    from taut import cli

    def bug(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "app", bug)
    monkeypatch.setattr(sys, "argv", ["taut"])
    with pytest.raises(KeyError):
        cli.main()


def test_zero_rl_steps_train_zero_steps(tmp_path):
    from taut.rl.trainer import train_rl

    config = load_config(None, ["model.preset=tiny", "model.path=null", "model.threads=1", "rl.prompts_per_step=4",
                                "rl.group_size=4", "rl.max_new_tokens=12", "data.pool_per_level=5", "rl.steps=0"])
    final = train_rl(config, tmp_path / "run", quiet=True)
    assert final.name == "step-000000" and [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-000000"]
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""


# ---- the guards inside the RL loop ------------------------------------------------------------


def _toy_run(**rl):
    from taut.config import RunConfig

    import toytask  # noqa: F401  (registers the toy:… task)

    return RunConfig.model_validate({
        "seed": 0, "model": {"preset": "tiny", "threads": 1},
        "data": {"train": ["toy:first-ok"], "pool_per_level": 16},
        "rl": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4, "lr": 3e-3, "dynamic_sampling": False,
               "checkpoint_every": 2, **rl},
    })


def test_the_rl_loop_skips_non_finite_steps_and_stops_after_too_many(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import taut.rl.objectives as objectives
    from taut.rl.trainer import train_rl

    calls = {"n": 0}
    real = torch.nn.utils.clip_grad_norm_

    def exploding(params, max_norm):                  # the third update onwards: an infinite gradient
        calls["n"] += 1
        norm = real(params, max_norm)
        return norm if calls["n"] < 3 else torch.tensor(float("inf"))

    monkeypatch.setattr(objectives.torch.nn.utils, "clip_grad_norm_", exploding)
    with pytest.raises(TrainingDiverged, match="3 optimizer steps in a row"):
        train_rl(_toy_run(steps=10, max_nonfinite_skips=3, checkpoint_every=1), tmp_path, quiet=True)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "event" not in line]
    skipped = [r["step"] for r in records if r["skipped"]]
    assert skipped == [r["step"] for r in records[-2:]], "two skipped steps logged; the third raised before its line"
    first, last = skipped[0] - 1, skipped[-1]           # checkpoints (every step) before the first skip and after the second
    before = load_file(str(tmp_path / "checkpoints" / f"step-{first:06d}" / "model.safetensors"))
    after = load_file(str(tmp_path / "checkpoints" / f"step-{last:06d}" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before), "skipped steps must leave the weights"


def test_the_rl_loop_resumes_from_the_newest_intact_checkpoint_and_cuts_the_log_back(tmp_path):
    from safetensors.torch import load_file

    from taut.rl.trainer import train_rl

    config = _toy_run(steps=4)
    clean, damaged = tmp_path / "clean", tmp_path / "damaged"
    train_rl(config, clean, quiet=True)
    train_rl(config.model_copy(update={"rl": config.rl.model_copy(update={"steps": 3})}), damaged, quiet=True)
    weights = damaged / "checkpoints" / "step-000003" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])                        # the newest checkpoint is torn
    train_rl(config, damaged, resume=True, quiet=True)                     # back to step 2, then on to 4
    a = load_file(str(clean / "checkpoints" / "step-000004" / "model.safetensors"))
    b = load_file(str(damaged / "checkpoints" / "step-000004" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in (damaged / "metrics.jsonl").read_text().splitlines() if "event" not in line]
    assert steps == [1, 2, 3, 4]


def test_a_torn_last_metrics_line_is_dropped_on_resume_with_a_warning(tmp_path, capsys):
    from taut.rl.trainer import train_rl

    config = _toy_run(steps=4)
    clean, torn = tmp_path / "clean", tmp_path / "torn"
    train_rl(config, clean, quiet=True)
    train_rl(config.model_copy(update={"rl": config.rl.model_copy(update={"steps": 2})}), torn, quiet=True)
    with open(torn / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "phase": "main", "rew')                       # killed during an append
    train_rl(config, torn, resume=True, quiet=True)
    warning = " ".join(capsys.readouterr().err.split())
    assert "metrics.jsonl:4:dropped" in warning.replace(" ", "") and "its step will be redone" in warning
    strip = lambda run: [{k: v for k, v in json.loads(line).items() if not k.endswith(("_time", "_per_s"))}  # noqa: E731
                         for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert strip(torn) == strip(clean)


def _toy_sft(tmp_path, **sft):
    from taut.config import RunConfig
    from taut.sft import train_sft

    config = RunConfig.model_validate({
        "seed": 0, "model": {"preset": "tiny", "threads": 1}, "data": {"sft": ["gym:add"]},
        "sft": {"steps": 5, "batch_size": 4, "bucket_batches": 1, "warmup_steps": 0, "log_every": 1, **sft},
    })
    return train_sft(config, tmp_path, quiet=True)


@pytest.mark.parametrize("undo", [True, False])
def test_sft_undoes_or_stops_on_non_finite_weights_and_names_its_own_keys(tmp_path, monkeypatch, undo):
    import taut.rl.guard as guard

    monkeypatch.setattr(guard, "first_nonfinite", lambda params: "lm_head.weight")   # every step "overflows"
    if undo:
        with pytest.raises(TrainingDiverged, match=r"2 optimizer steps in a row.*sft\.max_nonfinite_skips sets the limit"):
            _toy_sft(tmp_path, max_nonfinite_skips=2, undo_nonfinite_steps=True)
    else:
        with pytest.raises(TrainingDiverged, match=r"sft step 1 .*no snapshot.*set sft\.undo_nonfinite_steps: true"):
            _toy_sft(tmp_path, max_nonfinite_skips=2, undo_nonfinite_steps=False)


def test_a_damaged_last_line_the_checkpoint_covers_is_reported_lost_not_redone(tmp_path, capsys):
    """The last line of a step whose checkpoint is intact, damaged afterwards: resuming said the
    step would be redone, but it was not, and the line silently went missing."""
    from taut.rl.trainer import train_rl

    config = _toy_run(steps=4)
    run = tmp_path / "run"
    train_rl(config.model_copy(update={"rl": config.rl.model_copy(update={"steps": 2})}), run, quiet=True)
    log = run / "metrics.jsonl"
    lines = log.read_text().splitlines()
    assert json.loads(lines[-1])["step"] == 2
    log.write_text("\n".join(lines[:-1] + [lines[-1][:25]]) + "\n")        # step 2's line, damaged
    train_rl(config, run, resume=True, quiet=True)
    warning = " ".join(capsys.readouterr().err.split())
    assert f"{log}:{len(lines)}:droppedatornlastline" in warning.replace(" ", "")
    assert "already covers its step, so the step is not redone and the line is lost" in warning
    assert "fewer than" not in warning
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines() if "event" not in line]
    assert steps == [1, 3, 4]
