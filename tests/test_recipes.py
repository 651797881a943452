"""Every shipped recipe parses and trains: a 3-step micro run per recipe changes the parameters and
logs its strategy's metrics.

The RL recipes start from `builtin:testbed-sft`. Setting TAUT_TEST_MODEL to a model directory
replaces that starting point (for a checkout where the shipped checkpoint is not built yet).
"""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from taut.config import load_config

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.yaml"))


def recipe_kind(raw: dict) -> str:
    """bench: a benchmark matrix (`taut bench`); sft: the SFT cold start; rl: a training run."""
    if "methods" in raw:
        return "bench"
    return "sft" if "sft" in raw and not {"rl", "strategy", "phases"} & set(raw) else "rl"


RUN_RECIPES = [p for p in RECIPES if recipe_kind(yaml.safe_load(p.read_text())) != "bench"]

MICRO = ["rl.steps=3", "model.threads=1", "data.pool_per_level=4", "rl.prompts_per_step=4", "rl.group_size=4",
         "rl.max_new_tokens=48", "rl.checkpoint_every=100", "validation.n_per_level=1", "validation.samples=1",
         "sft.steps=3", "sft.batch_size=8"]

# Keep the cap-setting strategies inside the micro run's short rollouts and make the cap move
# within 3 steps, so the logged cap can be checked step by step (recipes without phases).
STRATEGY_OVERRIDES = {
    "siri": ["strategy.l_max=48", "strategy.l_min=24", "strategy.period=4"],
    "thinkprune": ["strategy.caps=[48, 40, 32]", "strategy.steps_per_stage=1"],
    "hard-truncation": ["strategy.cap=40"],
}

# The cap logged at steps 1..3 under the overrides above (cosine/stair-cosine with T = 4: Lmax, the
# midpoint, Lmin; stair: Lmin for the first half of the cycle).
EXPECTED_CAPS = {
    ("siri", "cosine"): [48, 36, 24],
    ("siri", "stair"): [24, 24, 48],
    ("siri", "stair-cosine"): [48, 36, 24],
    ("thinkprune", None): [48, 40, 32],
    ("hard-truncation", None): [40, 40, 40],
}

PENALTY = ["penalised_frac", "penalty_mean"]
STRATEGY_METRICS = {
    "none": [],
    "siri": PENALTY,
    "mastery-gated": ["gate_open", *PENALTY, "safe_len_mean"],
    "mastery-gated-nogate": ["gate_open", *PENALTY, "safe_len_mean"],
    "dapo-overlong": PENALTY,
    "dapo-lite": PENALTY,
    "dapo-heavy": PENALTY,
    "hard-truncation": PENALTY,
    "thinkprune": PENALTY,
    "kimi": PENALTY,
    "l1-exact": [*PENALTY, "budget_mean", "budget_abs_error"],
    "l1-max": [*PENALTY, "budget_mean", "budget_abs_error"],
    "grpo-lambda": ["gate_open", *PENALTY],
    "sigmoid": PENALTY,
    "on-policy-sft": ["kept_frac"],
    "dler": PENALTY,
    "alp": PENALTY,
    "shorter-better": [*PENALTY, "sol_mean"],
    "laser": ["bonus_frac", "target_len_mean"],
    "laser-d": ["bonus_frac", "target_len_mean", "target_len_low", "target_len_medium", "target_len_high"],
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The micro runs use one torch thread (model.threads=1); restore the session's setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def micro_config(path: Path):
    raw = yaml.safe_load(path.read_text())
    overrides = list(MICRO)
    if "phases" not in raw:
        overrides += STRATEGY_OVERRIDES.get(raw.get("strategy", {}).get("name", "none"), [])
    if os.environ.get("TAUT_TEST_MODEL") and str(raw.get("model", "")).startswith("builtin:"):
        overrides.append(f"model={os.environ['TAUT_TEST_MODEL']}")
    return load_config(path, overrides)


def changed_tensors(before: dict, after: dict) -> list[str]:
    """Names of the saved tensors that differ (tied weights are saved once, so `after` may hold fewer)."""
    assert after and set(after) <= set(before), sorted(set(after) - set(before))
    return [k for k in after if not torch.equal(before[k], after[k])]


def test_every_strategy_has_a_shipped_recipe():
    from taut.length import REGISTRY

    shipped = {phase.strategy.name for p in RUN_RECIPES for phase in load_config(p).plan()}
    assert shipped >= set(REGISTRY), sorted(set(REGISTRY) - shipped)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_micro_run(path, tmp_path):
    kind = recipe_kind(yaml.safe_load(path.read_text()))
    if kind == "bench":                               # a matrix of runs, or a study of cells: it parses, full and quick
        from taut.lab.bench.study import is_study, load_study
        from taut.lab.bench.suite import load_any_bench

        load = load_study if is_study(path) else load_any_bench
        assert load(path).methods and load(path, quick=True).methods
        return
    config = micro_config(path)
    if kind == "sft":
        from taut.models.loading import load_policy
        from taut.sft import train_sft

        start = {k: v.detach().clone() for k, v in load_policy(config.model, seed=config.seed).model.state_dict().items()}
        final = train_sft(config, tmp_path, quiet=True)
        assert changed_tensors(start, load_file(final / "model.safetensors"))
        return

    from taut.rl.trainer import train_rl

    train_rl(config, tmp_path, quiet=True)
    start = load_file(tmp_path / "checkpoints" / "step-000000" / "model.safetensors")
    end = load_file(tmp_path / "checkpoints" / "step-000003" / "model.safetensors")
    assert changed_tensors(start, end), "no parameter moved in 3 steps"

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]                 # step records, not phase events
    assert [r["step"] for r in steps] == [1, 2, 3]
    per_step = [phase.strategy for phase in config.plan() for _ in range(phase.steps)]
    for record, strategy in zip(steps, per_step):
        assert record["strategy"] == strategy.name
        for key in STRATEGY_METRICS[strategy.name]:
            assert key in record, (key, sorted(record))
            if key != "safe_len_mean":               # null on a step where no gate opened
                assert isinstance(record[key], float), (key, record[key])
        for key in ("gate_open", "penalised_frac", "kept_frac"):
            if key in record:
                assert 0.0 <= record[key] <= 1.0, (key, record[key])
    if config.phases is None:
        strategy = config.strategy
        expected = EXPECTED_CAPS.get((strategy.name, strategy.schedule if strategy.name == "siri" else None), [48, 48, 48])
        assert [r["cap"] for r in steps] == expected


def test_every_recipe_and_builtin_name_the_docs_give_exists():
    """The README and docs name recipes as builtin:<name>, which work wherever taut is installed,
    and every such name resolves (a renamed recipe leaves no stale command behind)."""
    import re

    from taut.builtin_recipes import resolve_recipe
    from taut.models.testbed import ASSETS
    from taut.tasks.files import SHIPPED_DATA

    root = Path(__file__).resolve().parent.parent
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    names = set()
    for doc in docs:
        text = doc.read_text()
        assert not re.search(r"--config recipes/", text), f"{doc.name}: a recipes/ path a wheel does not carry"
        for name in re.findall(r"builtin:([\w/.{},-]+)", text):
            names |= {(doc.name, n) for n in _expand(name.rstrip(".,"))}
    assert len(names) > 10
    for doc, name in names:
        if name.endswith(".jsonl"):
            assert (SHIPPED_DATA / name).is_file(), (doc, name)
        elif (ASSETS / name).is_dir():
            continue                                          # a shipped model: builtin:testbed-sft
        else:
            resolve_recipe(f"builtin:{name}")


def _expand(name: str) -> list[str]:
    """`real/smollm2-arith-{control,siri}` → both names."""
    import re

    match = re.search(r"\{([^}]*)\}", name)
    if not match:
        return [name]
    return [n for part in match.group(1).split(",") for n in _expand(name[:match.start()] + part + name[match.end():])]


def _doc_commands() -> list[tuple[str, str]]:
    """(doc, command) for each `taut train|sft|demo|eval` line in the README's and docs' code
    blocks that names no placeholder and no run of its own (continuation lines joined)."""
    import re

    root = Path(__file__).resolve().parent.parent
    found = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        block, pending = False, ""
        for line in doc.read_text().splitlines():
            if line.startswith("```"):
                block, pending = not block, ""
                continue
            if not block:
                continue
            line = pending + line.split("  #")[0].strip()
            pending = line[:-1] + " " if line.endswith("\\") else ""
            if pending or not re.match(r"taut (train|sft|demo|eval)( |$)", line):
                continue
            if re.search(r"[<$\[]|\.\.|RUN|--resume", line):
                continue                                      # a placeholder, a shell variable, an option list
            if line.startswith("taut eval ") and not line.split()[2].startswith(("pypi:", "builtin:")):
                continue                                      # evaluates a run the doc trained first
            found.append((doc.name, line))
    return found


@pytest.mark.parametrize("doc,command", _doc_commands())
def test_every_command_the_docs_give_validates_as_written(doc, command, tmp_path, monkeypatch):
    import shlex

    from typer.testing import CliRunner

    import taut.preflight
    from taut.cli import app

    monkeypatch.chdir(tmp_path)
    meminfo = tmp_path / "meminfo"      # the machine the docs are written for (24 GiB), however busy this one is
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   23000000 kB\n")
    monkeypatch.setattr(taut.preflight, "MEMINFO", meminfo)
    monkeypatch.setattr(taut.preflight, "_cgroup_limit", lambda: None)
    args = shlex.split(command)[1:]
    result = CliRunner().invoke(app, args if "--dry-run" in args else [*args, "--dry-run"])
    assert result.exit_code == 0, f"{doc}: {command}\n{result.output}"
