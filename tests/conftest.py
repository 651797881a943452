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
