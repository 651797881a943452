"""Recipes parse; overrides apply; typos are errors that name the key, the line and the valid keys."""

from pathlib import Path

import pytest

from taut.config import ConfigError, RunConfig, load_config

RECIPES = sorted(p for p in Path(__file__).parent.parent.joinpath("recipes").rglob("*.yaml") if not p.name.startswith("bench"))


def test_there_are_recipes():
    assert len(RECIPES) >= 3


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(p.parent.parent)))
def test_every_recipe_parses(recipe):
    config = load_config(recipe)
    assert isinstance(config, RunConfig)


def test_bench_recipe_parses_full_and_quick():
    from taut.lab.bench.matrix import load_bench

    path = Path(__file__).parent.parent / "recipes" / "bench.yaml"
    full, quick = load_bench(path), load_bench(path, quick=True)
    names = {m.name for m in full.methods}
    assert {"control", "dapo-lite", "dapo-heavy", "hard-truncation", "mastery-curriculum", "siri-cosine"} <= names
    assert len(names - {"control", "dapo-lite", "dapo-heavy", "hard-truncation", "mastery-curriculum", "siri-cosine"}) >= 2
    assert all(len(m.seeds) >= 2 for m in full.methods if m.name in ("control", "mastery-curriculum", "siri-cosine"))
    assert quick.steps < full.steps


def test_overrides_reach_nested_keys_and_parse_values():
    config = load_config(None, ["rl.steps=3", "rl.clip_high=0.3", "strategy.name=mastery-gated", "strategy.tau=0.75",
                                "eval.budgets=[8, 16]", "model=/some/dir"])
    assert config.rl.steps == 3 and config.rl.clip_high == 0.3
    assert config.strategy.name == "mastery-gated" and config.strategy.tau == 0.75
    assert config.eval.budgets == [8, 16]
    assert config.model.path == "/some/dir" and config.model.preset is None


def test_overrides_index_lists_the_recipe_has(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("phases:\n  - {name: accuracy, steps: 12}\n  - {name: compression, steps: 12, "
                      "strategy: {name: mastery-gated, alpha: 1.0}}\n")
    config = load_config(recipe, ["phases.1.steps=2", "phases.1.strategy.alpha=0.5", "phases.0.steps=1"])
    assert [p.steps for p in config.phases] == [1, 2]
    assert config.phases[1].strategy.alpha == 0.5 and config.phases[1].strategy.name == "mastery-gated"
    for bad in ("phases.2.steps=1", "phases.x.steps=1"):
        with pytest.raises(ConfigError, match=r"phases is a list of 2; expected an index 0–1"):
            load_config(recipe, [bad])


def test_model_shorthand_refined_by_a_nested_override():
    config = load_config(None, ["model=/some/dir", "model.dtype=float32"])
    assert config.model.path == "/some/dir" and config.model.dtype == "float32"


def test_model_override_without_a_model_section_refines_the_default_model(tmp_path):
    config = load_config(None, ["model.threads=1"])
    assert config.model.path == "builtin:testbed-sft" and config.model.threads == 1
    recipe = tmp_path / "r.yaml"
    recipe.write_text("seed: 1\n")
    assert load_config(recipe, ["model.dtype=float32"]).model.path == "builtin:testbed-sft"
    assert load_config(None, ["model.preset=tiny"]).model.preset == "tiny"        # a source set is kept


def test_misspelled_key_names_key_line_and_valid_keys(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("seed: 1\nrl:\n  steps: 5\n  clip_hihg: 0.3\n")
    with pytest.raises(ConfigError) as err:
        load_config(recipe)
    message = str(err.value)
    assert f"{recipe}:4" in message
    assert "rl.clip_hihg" in message and "did you mean 'rl.clip_high'" in message
    assert "clip_low" in message and "prompts_per_step" in message


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="valid strategies: none, siri, mastery-gated"):
        load_config(None, ["strategy.name=fast-thinking"])


def test_strategy_parameter_typo_lists_that_strategys_keys():
    with pytest.raises(ConfigError, match="valid keys here: name, tau, slack"):
        load_config(None, ["strategy.name=mastery-gated", "strategy.tua=0.5"])


def test_values_are_validated():
    with pytest.raises(ConfigError, match="rl.group_size"):
        load_config(None, ["rl.group_size=1"])
    with pytest.raises(ConfigError, match="max_penalty"):
        load_config(None, ["strategy.name=mastery-gated", "strategy.max_penalty=1.0"])
    with pytest.raises(ConfigError, match="exactly one of model.path and model.preset"):
        load_config(None, ["model.preset=tiny", "model.path=/x"])


def test_malformed_override():
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_config(None, ["rl.steps"])


def test_a_mastery_support_no_group_can_reach_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["strategy.name=mastery-gated", "strategy.support=9"])
    message = str(err.value)
    assert "support=9 exceeds the 8 rollouts" in message and "use support: half or at most 8" in message
    assert "{" not in message                      # not the whole section dumped after it
    phases = ["phases=[{name: a, steps: 2, strategy: {name: mastery-gated, support: 3, visits: 2}}]", "rl.group_size=2"]
    assert load_config(None, phases).phases[0].strategy.support == 3          # 2 rollouts × 2 visits pool 4
    with pytest.raises(ConfigError, match="support=5 exceeds the 4 rollouts"):
        load_config(None, phases[:1] + ["rl.group_size=2", "phases.0.strategy.support=5"])
    assert load_config(None, ["strategy.name=mastery-gated"]).strategy.support == "half"


def test_a_config_saved_with_the_removed_rl_log_every_still_loads(tmp_path):
    # every run's config.yaml written before rl.log_every was removed holds it (resume, eval and the
    # study's committed cells read those files); it was never read, so it is dropped
    from taut.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text("rl:\n  steps: 3\n  log_every: 1\n")
    config = load_config(path)
    assert config.rl.steps == 3 and "log_every" not in config.rl.model_dump()
