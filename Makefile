# Two commands on a fresh clone: `make demo` and `make test`.
# torch is pinned so a CPU machine takes its local CPU build; with a GPU, install your torch first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet "$(TORCH)" -e ".[math,data,lora,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/taut demo

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q; rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -q; rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache
