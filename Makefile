# Two commands a newcomer needs: `make demo` and `make test`. Both build .venv when missing.
# `make test` first installs the system packages the tests need (scripts/system-deps), or stops before
# building anything with the one command to run; `make check` is the fast inner loop (no servers,
# browsers or sandboxes started).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The full suite runs on every core (pytest-xdist; each worker starts its own servers in temporary
# directories); PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= auto
# pytest caches the test modules it rewrites for assertions as bytecode: with PYTHONDONTWRITEBYTECODE set
# every worker would rewrite all of them again on every run (about half of collection's time).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

.PHONY: demo test check system-deps lint typecheck pytest pytest-fast bench bench-agentdojo clean

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
	$(PYTEST) -q -n $(PYTEST_WORKERS) --dist loadfile

# The tests that start no server, browser, sandbox or other process (markers in tests/conftest.py), with a
# tenth of each property test's examples (tests/tiers.py). `make test` runs all of them, with every example.
FAST_TIER := not server and not browser and not sandbox and not process
pytest-fast: $(VENV)/.dev-installed
	$(PYTEST) -q -n $(PYTEST_WORKERS) --dist loadfile -m "$(FAST_TIER)" --hypothesis-profile=check

system-deps:
	PYTHON=$(PYTHON) scripts/system-deps

# In this order, and nothing built before the system packages are there.
test: system-deps
	$(MAKE) --no-print-directory lint typecheck pytest

check: lint typecheck pytest-fast

bench: $(VENV)/.dev-installed
	for b in bench/*.py; do [ $$b = bench/agentdojo.py ] || $(BIN)/python $$b || exit 1; done

# AgentDojo (bench/agentdojo.py) needs agentdojo, which stays out of the dev extra: its own venv.
.venv-agentdojo/.installed: bench/requirements-agentdojo.txt pyproject.toml
	$(PYTHON) -m venv .venv-agentdojo
	.venv-agentdojo/bin/pip install -q --upgrade pip
	.venv-agentdojo/bin/pip install -q -r bench/requirements-agentdojo.txt -e .
	touch $@

bench-agentdojo: .venv-agentdojo/.installed
	.venv-agentdojo/bin/python bench/agentdojo.py

clean:
	rm -rf $(VENV) .venv-agentdojo .venv-mcp1 .pytest_cache .mypy_cache .ruff_cache

# proctor.integrations.mcp and `proctor mcp serve` support the mcp SDK 1.x and 2.x: the dev venv takes
# the newest (2.x), this one the newest 1.x, and the MCP tests run in both (`make test` runs this too).
# smolagents' own MCPClient is built on mcpadapt, which imports only under mcp 1.x: its tests run here.
.venv-mcp1/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv .venv-mcp1
	.venv-mcp1/bin/pip install -q --upgrade pip
	.venv-mcp1/bin/pip install -q -e '.[mcp,smolagents,redis]' 'mcp>=1.30,<2' 'mcpadapt>=0.1.13' 'pytest>=8' 'pytest-timeout>=2.3' 'hypothesis>=6.100'
	touch $@

test-mcp1: .venv-mcp1/.installed
	.venv-mcp1/bin/pytest -q -p no:cacheprovider tests/integrations/test_mcp_toolset.py \
		tests/integrations/test_mcp_untrusted.py tests/integrations/test_smolagents_mcp_client.py \
		tests/codemode/test_codemode_stdio.py \
		tests/codemode/test_codemode_http.py -k 'not current_fastmcp'  # fastmcp 4 needs mcp 2

test: test-mcp1
.PHONY: test-mcp1
