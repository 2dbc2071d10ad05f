# Two commands a newcomer needs: `make demo` and `make test`. Both build .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The demo exports spans when an OTLP endpoint is set, and prints its trace id: it needs the SDK.
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[otel]'
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(BIN)/proctor demo

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check proctor tests bench examples

typecheck: $(VENV)/.dev-installed
	$(BIN)/mypy

pytest: $(VENV)/.dev-installed
	$(BIN)/pytest -q

test: lint typecheck pytest

bench: $(VENV)/.dev-installed
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
