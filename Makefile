# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint sim bench clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.bench: $(VENV)/.base
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

run: $(VENV)/.base
	$(VENV)/bin/raftmq dev --data .raftmq-dev --showcase

test: $(VENV)/.test
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest

sim: $(VENV)/.base
	$(PY) -m raftlog.sim --seeds 200 --steps 3000 --json

bench: $(VENV)/.bench
	$(PY) -m bench.storage --json
	$(PY) -m bench.produce --json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
