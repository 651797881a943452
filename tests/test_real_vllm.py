"""The vLLM rollout engine's side of the contract, against a stand-in `vllm` module.

vLLM itself needs a CUDA GPU and is not installed where these tests run: this checks only how
`VLLMEngine` drives vLLM's offline API (requests, sampling parameters, weight sync) and turns
its outputs into `Rollouts` (grouping by prompt, the end-of-sequence token, truncation flags,
response prefixes). Whether vLLM behaves as its documentation says is untested here.
"""

import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch

EOS = 2


class FakeLLM:
    """Scripted replies: completion j of prompt i is [10*i + j] * (j + 1), ending with EOS on even j."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.loaded: list = []
        self.resets = 0
        self.calls: list = []

    def apply_model(self, func):
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.append(dict(weights)))
        return [func(model)]

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, requests, settings, use_tqdm=True):
        self.calls.append((requests, settings))
        out = []
        for i, (request, params) in enumerate(zip(requests, settings)):
            completions = []
            for j in reversed(range(params.n)):               # out of order: the engine sorts by index
                ended = j % 2 == 0
                tokens = [10 * i + j] * (j + 1) + ([EOS] if ended else [])
                logprobs = None
                if getattr(params, "logprobs", None) == 0:           # the drawn token's log-prob at each position
                    logprobs = [{t: SimpleNamespace(logprob=-0.1 * (k + 1))} for k, t in enumerate(tokens)]
                completions.append(SimpleNamespace(index=j, token_ids=tokens, finish_reason="stop" if ended else "length",
                                                   logprobs=logprobs))
            out.append(SimpleNamespace(outputs=completions, prompt_token_ids=request["prompt_token_ids"]))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kw: dict(kw)
    module.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    return module


class GpuLooking(torch.nn.Linear):
    """A module that reports a CUDA device without using one."""

    @property
    def device(self):
        return torch.device("cuda")


def _policy(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return SimpleNamespace(model=GpuLooking(2, 2), source=str(tmp_path), eos_id=EOS)


def test_generate_groups_rows_by_prompt_with_eos_and_truncation_flags(fake_vllm, tmp_path):
    import os

    from taut.rollout import SamplingParams, build_engine

    policy = _policy(tmp_path)
    engine = build_engine("vllm", policy, max_rows=64)
    llm = engine.llm
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert llm.kwargs["model"] == str(tmp_path) and llm.kwargs["max_num_seqs"] == 64 and llm.kwargs["dtype"] == "float32"
    assert len(llm.loaded) == 1 and set(llm.loaded[0]) == {"weight", "bias"} and llm.resets == 1   # synced when built

    generator = torch.Generator().manual_seed(0)
    out = engine.generate([[5, 6], [7]], 3, SamplingParams(max_new_tokens=9, temperature=1.0, top_p=0.9), generator,
                          response_prefix=[4])
    assert out.prompt_index == [0, 0, 0, 1, 1, 1]
    assert out.tokens == [[4, 0, EOS], [4, 1, 1], [4, 2, 2, 2, EOS], [4, 10, EOS], [4, 11, 11], [4, 12, 12, 12, EOS]]
    assert out.truncated == [False, True, False, False, True, False]
    requests, settings = llm.calls[0]
    assert [r["prompt_token_ids"] for r in requests] == [[5, 6, 4], [7, 4]]
    assert all(s.n == 3 and s.max_tokens == 9 and s.min_tokens == 0 and s.top_p == 0.9 and s.stop_token_ids == [EOS] for s in settings)
    seeds = [s.seed for s in settings]
    assert len(set(seeds)) == 2 and seeds == [s.seed for s in _regenerate(engine, 0)]       # seeded by the generator

    policy.model.weight.data.fill_(3.0)
    engine.sync_weights()
    assert torch.equal(llm.loaded[-1]["weight"], torch.full((2, 2), 3.0)) and llm.resets == 2

    with pytest.raises(NotImplementedError, match="ban_first"):
        engine.generate([[5]], 2, SamplingParams(max_new_tokens=4), generator, ban_first=[3])


def _regenerate(engine, seed):
    from taut.rollout import SamplingParams

    engine.generate([[5, 6], [7]], 3, SamplingParams(max_new_tokens=9, top_p=0.9), torch.Generator().manual_seed(seed))
    return engine.llm.calls[-1][1]


def test_logprobs_come_back_per_token_after_temperature(fake_vllm, tmp_path):
    from taut.rollout import SamplingParams, build_engine

    engine = build_engine("vllm", _policy(tmp_path), logprobs=True)
    assert engine.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    out = engine.generate([[5]], 2, SamplingParams(max_new_tokens=9, logprobs=True), torch.Generator().manual_seed(0),
                          response_prefix=[4])
    assert engine.llm.calls[-1][1][0].logprobs == 0
    assert out.tokens == [[4, 0, EOS], [4, 1, 1]]
    for row in out.logprobs:                  # no log-prob for the forced prefix token
        assert math.isnan(row[0]) and row[1:] == pytest.approx([-0.1, -0.2])
    plain = build_engine("vllm", _policy(tmp_path))
    assert "logprobs_mode" not in plain.llm.kwargs
    assert plain.generate([[5]], 2, SamplingParams(max_new_tokens=9, logprobs=True)).logprobs is None


def test_vllm_engine_refuses_a_cpu_policy(fake_vllm, tmp_path):
    from taut.rollout.vllm import VLLMEngine

    policy = _policy(tmp_path)
    policy.model = torch.nn.Linear(2, 2)
    policy.model.device = torch.device("cpu")
    with pytest.raises(ValueError, match="use rl.engine: hf"):
        VLLMEngine(policy)
