# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := xla,notebooks,dev,gemma-offline

.PHONY: demo test setup lint clean

$(STAMP): pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements/lock.txt -e ".[$(EXTRAS)]"
	touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/grpo-kit demo

# Notebooks run through nbmake in quick mode (GRPO_KIT_QUICK=1: fewer steps, same code).
test: $(STAMP)
	$(BIN)/python -m ruff check grpo_kit tests scripts benchmarks
	GRPO_KIT_QUICK=1 $(BIN)/python -m pytest tests --nbmake notebooks --nbmake-timeout=600

lint: $(STAMP)
	$(BIN)/python -m ruff check grpo_kit tests scripts benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
