# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test lint sim fuzz bench bench-spark bench-peers bench-peers-deps browser clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# The Spark tests need the `spark` extra (PySpark, pyarrow) and Java 17; without Java
# they skip and say so.
$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $@

$(VENV)/.bench: $(VENV)/.base
	$(PY) -m pip install -q -e '.[bench]'
	touch $@

$(VENV)/.spark: $(VENV)/.base
	$(PY) -m pip install -q -e '.[spark]'
	touch $@

run: $(VENV)/.base
	$(VENV)/bin/raftmq dev --data .raftmq-dev --showcase

# Spark's Python workers run the venv's interpreter, where raftmq and pyarrow are.
# The live tests mostly wait (elections, timeouts, fsyncs), so TEST_WORKERS pytest workers
# share even two cores well; a worker takes a whole file at a time, so a module's shared
# cluster starts once. `make test TEST_WORKERS=0` runs everything in one process.
TEST_WORKERS ?= 4
test: $(VENV)/.test
	$(PY) -m ruff check .
	$(PY) -m mypy
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# Coverage-guided fuzzing (atheris) of the frame/request decoders, the batch parser,
# SQL92 filters, snapshot restore and CommitLog recovery over damaged files; grows tests/fuzz/corpus,
# which the default suite replays. FUZZ_RUNS inputs per target.
FUZZ_RUNS ?= 250000
$(VENV)/.fuzz: $(VENV)/.test
	$(PY) -m pip install -q -e '.[fuzz]'
	touch $@

fuzz: $(VENV)/.fuzz
	$(PY) -m tests.fuzz --all --runs $(FUZZ_RUNS)

# The web console in a real headless Chromium: the distribution's package (as root or
# through sudo) and Playwright driving that executable (the `browser` extra; Playwright's
# own browser download is never used). `make test` runs these tests when both are there
# and skips them, saying why, when not. Screenshots of each page go to SCREENSHOTS.
SCREENSHOTS ?= test-output/screenshots
$(VENV)/.browser: $(VENV)/.test
	$(PY) -m pip install -q -e '.[browser]'
	touch $@

browser: $(VENV)/.browser
	@if command -v chromium >/dev/null 2>&1; then echo "browser: chromium already installed"; \
	else if [ "$$(id -u)" -eq 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	else echo "browser: run as root or install sudo to install chromium" >&2; exit 1; fi; \
	set -x; $$SUDO apt-get update && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; fi
	RAFTMQ_SCREENSHOTS=$(abspath $(SCREENSHOTS)) $(PY) -m pytest -p no:randomly tests/web/console/test_browser.py
	@echo "screenshots: $(SCREENSHOTS)"

sim: $(VENV)/.base
	$(PY) -m raftlog.sim --seeds 200 --steps 3000 --json

# The quick versions of every benchmark, one JSON object each (each cluster benchmark
# starts and stops its own 3-node cluster); see `raftmq bench BENCHMARK --help` for sizes.
# A benchmark whose run saw failed sends exits 1 after printing its JSON; the rest still run.
# Produce and e2e run with both producer APIs: `send_async` per message (the default) and
# `--api batch`, whole `send_batch` calls of `--batch` messages.
bench: $(VENV)/.bench
	$(PY) -m bench.storage --json
	$(PY) -m bench.snapshot --messages 1000000 --json
	$(PY) -m bench.produce --json
	-$(PY) -m bench.produce --api batch --batch 256 --json
	-$(PY) -m bench.produce --api batch --batch 256 --size 1024 --json
	-$(PY) -m bench.e2e --consumer none --json
	-$(PY) -m bench.e2e --consumer none --api batch --batch 256 --json
	-$(PY) -m bench.e2e --json
	-$(PY) -m bench.consume --json
	-$(PY) -m bench.consume --catch-up --json
	-$(PY) -m bench.topics --json
	-$(PY) -m bench.topics --topics 1,1000 --api batch --batch 64 --messages 256000 --json
	-$(PY) -m bench.failover --json

# Reading from PySpark (needs Java 17): batch count/groupBy and streaming rows/s over
# BENCH_SPARK_ARGS, e.g. BENCH_SPARK_ARGS="--messages 10000000".
BENCH_SPARK_ARGS ?= --messages 1000000
bench-spark: $(VENV)/.spark
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m bench.spark --json $(BENCH_SPARK_ARGS)

# The peer systems' servers, from Debian packages; as root or through sudo; skipped when
# all are installed already. Their Python clients come with the `bench` extra.
PEER_PACKAGES := nats-server rabbitmq-server etcd-server

bench-peers-deps:
	@if dpkg-query -W -f='$${Status}\n' $(PEER_PACKAGES) 2>/dev/null \
		| grep -c '^install ok installed$$' | grep -qx $(words $(PEER_PACKAGES)); then \
		echo "bench-peers-deps: $(PEER_PACKAGES) already installed"; exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	else echo "bench-peers-deps: run as root or install sudo to install $(PEER_PACKAGES)" >&2; \
		exit 1; fi; \
	set -x; $$SUDO apt-get update && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y $(PEER_PACKAGES)

# Our produce benchmark and the peers' under the same load; BENCH_PEERS_ARGS adds options,
# e.g. BENCH_PEERS_ARGS="--only nats,etcd --in-flight 1024".
BENCH_PEERS_ARGS ?=
bench-peers: $(VENV)/.bench bench-peers-deps
	$(PY) -m bench.peers --json $(BENCH_PEERS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
