import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_policy():
    """A randomly initialised testbed model (Qwen2 architecture, 0.53M parameters)."""
    from taut.models import build_testbed_model

    return build_testbed_model("tiny", seed=0)
