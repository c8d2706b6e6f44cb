# The two commands of the README:
#   make tutorial   set up (if needed) and run the tutorial
#   make test       set up (if needed) and run the layer contract and the test suite
# Set-up is a virtual environment in .venv with the project installed in editable mode; it is
# rebuilt when pyproject.toml changes.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.marin-installed

.PHONY: setup tutorial test clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

tutorial: $(STAMP)
	$(BIN)/python experiments/tutorials/train_tiny_model.py

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
