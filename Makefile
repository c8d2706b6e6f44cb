# The two commands of the README:
#   make tutorial   set up (if needed) and run the tutorial
#   make test       set up (if needed) and run the layer contract and the test suite
# Set-up is a virtual environment in .venv with the project installed in editable mode; it is
# redone when pyproject.toml changes. The tutorial needs only the runtime dependencies; the tests
# add the reference implementations they compare against (PyTorch, transformers, lm-eval, Ray),
# which more than double the download, so they are installed only by `make test`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.marin-installed
# Most of the suite waits on subprocesses, servers and clusters, so it runs on more workers than
# cores; each test file stays on one worker (see conftest.py).
TEST_WORKERS ?= 4
# The slowest tests are listed at the end of each run: where the suite's time goes, run by run.
TEST_DURATIONS ?= 30
# Before the tests, the project's sources are compiled to bytecode once. The suite starts hundreds of
# Python processes (commands, Ray workers, Slurm jobs, training replicas), each importing the
# project; where PYTHONDONTWRITEBYTECODE is set (as in many containers) none of them would keep its
# bytecode, and each would compile the same 58,000 lines again (0.15 to 0.25 CPU-s a process). Python
# still reads bytecode that exists with that variable set, and recompiles a file edited since.
COMPILE_BYTECODE := $(BIN)/python -m compileall -q -j 0 lib experiments tests bench
TEST_STAMP := $(VENV)/.marin-test-installed

# The TPU lane: tests that need the chip (marked tpu, in files named test_tpu_*.py so that nothing
# else is collected: the chip's machine has only what they import), in one process (a TPU admits one
# program at a time), at the default matmul precision and again under "highest". TPU_PYTHON is the
# chip machine's own interpreter where there is no .venv.
TPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
TPU_TESTS := $(wildcard lib/*/tests/test_tpu_*.py)
TPU_PYTEST := JAX_PLATFORMS=tpu,cpu XLA_FLAGS= $(TPU_PYTHON) -m pytest -p no:xdist -p no:cacheprovider -m tpu $(TPU_TESTS) $(PYTEST_ARGS)

.PHONY: setup setup-test tutorial test test-tpu clean-venv

setup: $(STAMP)

setup-test: $(TEST_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(TEST_STAMP)

tutorial: $(STAMP)
	$(BIN)/python experiments/tutorials/train_tiny_model.py

test: $(TEST_STAMP)
	bash scripts/install_browser.sh
	bash scripts/install_slurm.sh
	bash scripts/install_jemalloc.sh
	$(BIN)/lint-imports
	$(COMPILE_BYTECODE) >/dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=$(TEST_DURATIONS) $(PYTEST_ARGS)

test-tpu:
	$(TPU_PYTEST)
	JAX_DEFAULT_MATMUL_PRECISION=highest $(TPU_PYTEST)

clean-venv:
	rm -rf $(VENV)
