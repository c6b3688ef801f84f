# Two commands on a fresh machine: `make run` serves the demo, `make test` runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= config.yaml
# Workers need TensorFlow: the CPU-only wheel unless this host has an NVIDIA driver, then
# TensorFlow with its CUDA libraries (tensorflow[and-cuda]: the driver alone is not enough).
# linux aarch64 has no tensorflow-cpu wheels: `make TF_EXTRA=tensorflow` there.
TF_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo tensorflow-cuda || echo tensorflow-cpu)
STAMP := $(VENV)/.installed-$(TF_EXTRA)

.PHONY: run test lint unit bench bench-peers bench-text install clean proto

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(TF_EXTRA),http,dev]"
	touch $@

install: $(STAMP)

models/demo/saved_model.pb: | $(STAMP)
	$(VENV)/bin/tfsupervisor demo-model models/demo

run: $(STAMP) models/demo/saved_model.pb
	@echo "Serving model 'demo' from $(CONFIG). In another terminal:"
	@echo "  $(VENV)/bin/tfsupervisor infer -c $(CONFIG) demo --random --batch 4"
	@echo "  $(VENV)/bin/tfsupervisor status -c $(CONFIG)"
	@echo "Ctrl-C drains the workers and stops."
	$(VENV)/bin/tfsupervisor run -c $(CONFIG)

lint: $(STAMP)
	$(VENV)/bin/ruff check supervisor worker tests bench
	$(VENV)/bin/mypy

# Three pytest workers on any number of cores: a quarter of the suite's time is spent waiting
# on subprocesses, sockets and deadlines (with two, 2 cores were 1.5 busy). Each is given
# whole test modules (their shared workers started once), the modules that start TensorFlow
# handed out first (tests/conftest.py orders them). Then the tests marked `alone`, with
# nothing beside them: what they measure is how soon a thread gets a CPU.
test: $(STAMP) lint
	$(PY) -m pytest -q -ra -n 3 --dist loadfile --no-loadscope-reorder -m "not alone"
	$(PY) -m pytest -q -ra -m alone

# The fast half: no TensorFlow process is started.
unit: $(STAMP)
	$(PY) -m pytest -q -m "not tf"

# Benchmarks (minutes; not part of the tests): results in bench/results/, quoted by
# docs/performance.md. `make bench BENCH_ARGS=--quick` for a fast pass.
bench: $(STAMP)
	$(PY) -m bench.roundtrip $(BENCH_ARGS)
	$(PY) -m bench.timeline $(BENCH_ARGS)
	$(PY) -m bench.throughput $(BENCH_ARGS)
	$(PY) -m bench.mlp $(BENCH_ARGS)
	$(PY) -m bench.leak_bound $(BENCH_ARGS)
	$(PY) -m bench.footprint $(BENCH_ARGS)
	$(PY) -m bench.probe_cost $(BENCH_ARGS)
	$(PY) -m bench.leak_probes $(BENCH_ARGS)
	$(PY) -m bench.hops $(BENCH_ARGS)
	$(PY) -m bench.text_costs

# tfsupervisor side by side with mosec, LitServe and Ray Serve on the same model (installs
# the `peers` extra into $(VENV): it leaves TensorFlow's pins alone). Results in
# bench/results/peers.*; `make bench-peers BENCH_ARGS="--quick --rounds 1"` for a fast pass.
$(VENV)/.installed-peers: pyproject.toml | $(STAMP)
	$(PY) -m pip install -q -e ".[$(TF_EXTRA),peers]"
	touch $@

bench-peers: $(STAMP) $(VENV)/.installed-peers
	$(PY) -m bench.peers --also mosec@1 $(BENCH_ARGS)

# The seeds' workload: the demo text encoder on variable-length token ids, the same peers plus
# the seeds' per-request service and the compute ceiling, closed and open loop. Results in
# bench/results/text_peers.*; `make bench-text BENCH_ARGS="--rounds 1 --seconds 5"` is quick.
bench-text: $(STAMP) $(VENV)/.installed-peers
	$(PY) -m bench.text_peers $(BENCH_ARGS)

# The gRPC front's modules, generated from its .proto files (grpcio-tools: a dev dependency).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \
		supervisor/front/proto/inference.proto supervisor/front/proto/health.proto

clean:
	rm -rf run .pytest_cache .mypy_cache .ruff_cache
