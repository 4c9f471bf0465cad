# The two commands of the README quickstart. Each creates .venv with only
# Python 3.11 + pip and installs dpgate with the demo extra (plot, progress bar:
# `make demo`, the CLI demo tests, the benchmarks), the test extra (real PostgreSQL
# clients for `dpgate serve`, selenium for the console's browser tests), the console
# extra (`dpgate console`) and the postgres/spark backend extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench docs clean

$(BIN)/activate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[demo,test,console,postgres,spark]'
	touch $(BIN)/activate

demo: $(BIN)/activate
	$(BIN)/dpgate demo

# Lint, types, the layer contracts (import-linter, pyproject.toml), then the tests (doctests included: tests/test_docs.py). Make stops at
# the first command that fails, and pytest's exit code 5 (no tests collected) fails too.
# The tests run in two worker processes (pytest-xdist), a test file per worker at a time
# (its module fixtures built once): 6 min on a 2-core VM, against 10 min in one process.
test: $(BIN)/activate
	$(BIN)/ruff check dpgate tests benchmarks examples
	$(BIN)/mypy dpgate
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

# The reference manual (HTML from the docstrings) in docs/manual/: open docs/manual/index.html.
docs: $(BIN)/activate
	$(BIN)/python docs/build_manual.py docs/manual

bench: $(BIN)/activate
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
