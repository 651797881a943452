import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_policy():
    """A randomly initialised testbed model (Qwen2 architecture, 0.53M parameters)."""
    from taut.models.testbed import build_testbed_model

    return build_testbed_model("tiny", seed=0)


@pytest.fixture(scope="session")
def sft_policy():
    """The shipped SFT checkpoint of the testbed (TAUT_TEST_MODEL points elsewhere when set)."""
    from taut.config import ModelConfig
    from taut.models.loading import load_policy

    return load_policy(ModelConfig(path=os.environ.get("TAUT_TEST_MODEL", "builtin:testbed-sft")))


@pytest.fixture
def arith_study():
    """taut.lab.arith_study, the overthinking study's one command."""
    import taut.lab.arith_study

    return taut.lab.arith_study


@pytest.fixture
def kill_with_timed_checkpoints(monkeypatch):
    """The checkpoint clock advancing 11 minutes a reading — with `checkpoint_minutes: 10` a timed
    checkpoint follows every step — and `kill(module, name, call, run_dir)`: `module.name` raises
    KeyboardInterrupt at its `call`-th call, having recorded the run's checkpoints at each call.
    Returns (the record, a function that puts `module.name` back)."""
    import taut.checkpoint as ck

    clock = iter(range(0, 10**6, 11 * 60))
    monkeypatch.setattr(ck, "_clock", lambda: next(clock))

    def kill(module, name, call, run_dir):
        seen, inner = [], getattr(module, name)

        def wrapped(*args, **kwargs):
            seen.append([p.name for p in ck.list_checkpoints(run_dir)])
            if len(seen) == call:
                raise KeyboardInterrupt
            return inner(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)
        return seen, lambda: monkeypatch.setattr(module, name, inner)

    return kill
