# DDP Lab. Quick start: `make lab` (JupyterLab on the course) and `make test` (the whole suite).
# Both create .venv with pip the first time and install the pinned requirements into it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA_DIR ?= data
SYNTHETIC_DIR ?= $(DATA_DIR)/synthetic
ARGS ?=
LAB_ARGS ?=
# JupyterLab refuses to start as root unless told that it is on purpose.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: help setup lab test run check bench data synthetic-data clean

help:
	@echo "make lab             JupyterLab on the course (LAB_ARGS='--ip 0.0.0.0 --no-browser' on a remote node)"
	@echo "make test            the whole test suite (CPU only)"
	@echo "make run             the finished solution on every GPU, or 2 CPU processes (ARGS='--epochs 3')"
	@echo "make check STEP=4    check a step of fashion_mnist.py (STEP=all: every step; SCRIPT=path for another file)"
	@echo "make bench           how long the checks take, against the course's targets"
	@echo "make data            download Fashion-MNIST into $(DATA_DIR)/"
	@echo "make synthetic-data  write the synthetic stand-in into $(SYNTHETIC_DIR)/ (offline)"

$(VENV)/.installed: requirements.txt requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-test.txt
	touch $@

setup: $(VENV)/.installed

lab: setup
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(LAB_ARGS)

test: setup
	$(PY) -m pytest

run: setup
	$(PY) -m autograde.run --data-dir $(DATA_DIR) --synthetic-dir $(SYNTHETIC_DIR) -- $(ARGS)

STEP ?= all
SCRIPT ?= fashion_mnist.py
check: setup
	$(PY) -m autograde check $(if $(filter all,$(STEP)),--all,--step $(STEP)) --script $(SCRIPT)

bench: setup
	$(PY) -m autograde.bench

data: setup
	$(PY) -m autograde.data download --root $(DATA_DIR)

synthetic-data: setup
	$(PY) -m autograde.data synthetic --root $(SYNTHETIC_DIR)

clean:
	rm -rf .pytest_cache $(SYNTHETIC_DIR)
