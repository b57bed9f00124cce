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

# nbgrader's instructor tools (formgrader, create assignment, course list) are off for learners, on
# for instructors: jupyter-config/lab_mode.py. EXT_LEVEL=user writes your own Jupyter config instead
# of the environment's (Jupyter in a venv reads it first only with JUPYTER_PREFER_ENV_PATH=0).
EXT_LEVEL ?= sys_prefix
# JupyterLab settings that live in the environment, never in your home folder
JUPYTER_CONFIG := $(wildcard jupyter-config/*)

.PHONY: help setup lab lint test test-fast test-notebooks run check bench data synthetic-data release grade scores learner-mode instructor-mode clean

help:
	@echo "make lab             JupyterLab on the course (LAB_ARGS='--ip 0.0.0.0 --no-browser' on a remote node)"
	@echo "make test            make lint, then the whole test suite, notebooks included (CPU only)"
	@echo "make test-fast       the tests that start no process (pytest -m 'not launch'): under a minute"
	@echo "make lint            mypy on autograde/ and on the tests' own modules"
	@echo "make test-notebooks  only the notebooks, top to bottom with nbval (quick mode)"
	@echo "make run             the finished solution on every GPU, or 2 CPU processes (ARGS='--epochs 3')"
	@echo "make check STEP=4    check a step of fashion_mnist.py (STEP=all: every step; SCRIPT=path for another file)"
	@echo "make bench           each item's cold check, one learner's grading, ratios, notebooks: against the targets (BENCH_ARGS='--only items')"
	@echo "make gpu-check       on a GPU node: prove the GPU path, write docs/gpu-report.md"
	@echo "make slurm-up        a real SLURM of 2 emulated nodes on this machine (root; SLURM_FOLDER=dir); make slurm-down stops it"
	@echo "make hub             instructors, as root: JupyterHub for a class (CLASS=deploy/jupyterhub/class.toml; docs/instructors.md)"
	@echo "make class-faults    as root: the hub restarted, a server killed mid-check, a SLURM node lost, under a real hub"
	@echo "make class-load      as root: LEARNERS=24 learners check at once on the hub (SPAWNER=slurm; CHECKS_AT_ONCE=2): docs/class-load/"
	@echo "make data            download Fashion-MNIST into $(DATA_DIR)/"
	@echo "make synthetic-data  write the synthetic stand-in into $(SYNTHETIC_DIR)/ (offline)"
	@echo "make release         instructors: build the nbgrader assignment from notebooks/ (grading/release/)"
	@echo "make grade           instructors: autograde grading/submitted/ (JOBS learners at once; default one per core), feedback, grades.csv, scores"
	@echo "make scores          instructors: feedback and grades.csv again after grading answers by hand (no autograding)"
	@echo "make release-exchange / collect / return-feedback   instructors: through nbgrader's exchange (EXCHANGE=dir)"
	@echo "make release-solutions PART=X   instructors: hand part X's solutions to every learner through the exchange"
	@echo "make withhold        instructors, as root: solutions/, tests/, .git readable by the class's instructors only (CLASS=...)"
	@echo "make learner-mode    nbgrader's instructor extensions off, the default (make instructor-mode: on)"

$(VENV)/.installed: requirements.txt requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-test.txt
	@# the course's support package (autograde) importable from any folder, notebooks included
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "ddp_lab.pth").write_text("$(CURDIR)\n")'
	touch $@

# The environment's Jupyter settings (jupyter-config/): kernels and terminals with its python first on
# PATH, no news pop-up, Validate's time limit, and the learner's view (or the instructor's, once
# chosen with `make instructor-mode`).
$(VENV)/.jupyter-config: $(VENV)/.installed $(JUPYTER_CONFIG)
	mkdir -p $(VENV)/etc/jupyter $(VENV)/share/jupyter/lab/settings/overrides.d
	cp jupyter-config/jupyter_server_config.py jupyter-config/nbgrader_config.py \
		jupyter-config/ddp-lab-terminal.bashrc $(VENV)/etc/jupyter/
	cp jupyter-config/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.d/ddp-lab.json
	$(PY) jupyter-config/lab_mode.py setup
	touch $@

setup: $(VENV)/.installed $(VENV)/.jupyter-config

# The server's root is this folder (the script, solutions/, exercises/ in its file browser; terminals
# start here), and the welcome notebook opens first.
lab: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter lab $(ALLOW_ROOT) --ServerApp.root_dir="$(CURDIR)" \
		$(LAB_ARGS) notebooks/00_welcome.ipynb

# ruff on the package and every test (ruff.toml: imports sorted and used, names defined), then mypy
# on the package and on the tests' own modules (the test files themselves are not typed throughout yet).
TYPED_TESTS := tests/conftest.py tests/record_runs.py tests/mistakes.py tests/exercise_styles.py tests/class_load.py
lint: setup
	$(PY) -m ruff check autograde tests
	$(PY) -m mypy --ignore-missing-imports autograde $(TYPED_TESTS)

# Two lanes (pytest-xdist): while a test waits on a hub, a SLURM time limit or a timeout, the other lane
# uses the core; tests/conftest.py keeps the tests that change what the whole machine shares in one lane.
# LANES=0 runs the suite in one.
LANES ?= 2
test: lint
	$(PY) -m pytest $(if $(filter-out 0,$(LANES)),-n $(LANES))

# The tests that start no process: a test that starts one is marked `launch`, and tests/conftest.py
# fails any test that starts one without the mark.
test-fast: setup
	$(PY) -m pytest -m "not launch"

test-notebooks: setup
	$(PY) -m pytest tests/notebooks/test_notebooks.py

run: setup
	$(PY) -m autograde.tools.run --data-dir $(DATA_DIR) --synthetic-dir $(SYNTHETIC_DIR) -- $(ARGS)

# STEP: a step of the lab, `all` (the lab's steps) or an exercise's id (pi); SCRIPT: the file to
# check (default: the one the item reads, fashion_mnist.py or exercises/<file>.py).
STEP ?= all
SCRIPT ?=
check: setup
	$(PY) -m autograde check $(if $(filter all,$(STEP)),--all,--step $(STEP)) $(if $(SCRIPT),--script $(SCRIPT))

bench: setup
	$(PY) -m autograde.tools.bench $(BENCH_ARGS)

# On a GPU node: prove the GPU path (training on every GPU and on one, the checker, notebooks with
# quick mode off) and write docs/gpu-report.md. Says so in one line where there is no GPU.
# `make gpu-check PY=python3` uses an interpreter that already has torch, without creating .venv.
.PHONY: gpu-check
gpu-check: $(if $(findstring $(VENV)/,$(PY)),setup)
	$(PY) -m autograde.tools.gpu_check $(GPU_CHECK_ARGS)

# A real SLURM (Debian's packages, installed where missing) with emulated nodes: autograde/cluster/slurm.py
SLURM_FOLDER ?= /tmp/ddp-lab-slurm
.PHONY: slurm-up slurm-down
slurm-up: setup
	$(PY) -m autograde.cluster.slurm up --folder $(SLURM_FOLDER)

slurm-down: setup
	$(PY) -m autograde.cluster.slurm down --folder $(SLURM_FOLDER)

# A class on JupyterHub (deploy/jupyterhub/, docs/instructors.md), run as root. JupyterHub's proxy,
# configurable-http-proxy, comes from the npm registry into the environment (Node.js: apt-get install
# nodejs npm). CLASS: the class's settings (who teaches, who learns, the spawner, the limits).
CLASS ?= deploy/jupyterhub/class.toml
PROXY_VERSION := 5.3.0
.PHONY: hub hub-setup
$(VENV)/bin/configurable-http-proxy:
	@command -v npm >/dev/null || { echo "npm not found: apt-get install nodejs npm (JupyterHub's proxy runs on Node.js)" >&2; exit 1; }
	npm install --silent --no-fund --no-audit --prefix $(VENV)/node configurable-http-proxy@$(PROXY_VERSION)
	ln -sf ../node/node_modules/.bin/configurable-http-proxy $@

hub-setup: setup $(VENV)/bin/configurable-http-proxy

hub: hub-setup
	DDP_LAB_CLASS="$(abspath $(CLASS))" $(VENV)/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

# Faults during a class, as root (tests/course/test_class_faults.py, also in `make test`): the hub
# restarted, a server killed mid-check, a SLURM node lost; here SLURM finds the lost node on its own.
.PHONY: class-faults
class-faults: hub-setup
	DDP_LAB_CLASS_FAULTS=full $(PY) -m pytest tests/course/test_class_faults.py

# A class of LEARNERS on the hub, as root, every learner checking a lab step in the same minute
# (tests/class_load.py): verdicts, their time against one learner alone, the hub's API latency, memory,
# and what is left behind, written to CLASS_LOAD_OUT. Minutes: 24 learners take about 10 on 2 cores.
LEARNERS ?= 24
CHECKS_AT_ONCE ?= 2
SPAWNER ?= local
CLASS_LOAD_OUT ?= docs/class-load
.PHONY: class-load
class-load: hub-setup
	$(PY) tests/class_load.py --learners $(LEARNERS) --checks-at-once $(CHECKS_AT_ONCE) --spawner $(SPAWNER) \
		--out $(CLASS_LOAD_OUT) $(CLASS_LOAD_ARGS)

data: setup
	$(PY) -m autograde.data download --root $(DATA_DIR)

synthetic-data: setup
	$(PY) -m autograde.data synthetic --root $(SYNTHETIC_DIR)

# The nbgrader course (docs/instructors.md). FROM: the commit to release (default HEAD; FROM=files: the
# files as they are). EXCHANGE: nbgrader's exchange folder, Exchange.root (default in autograde/course/assignment.py:
# /usr/local/share/nbgrader/exchange). NBGRADER_ARGS: more options for nbgrader's exchange commands.
# PART: the part of the course, an assignment of its own (default ddp_lab; processes_talk, launching).
FROM ?=
EXCHANGE ?=
NBGRADER_ARGS ?=
PART ?=
COURSE := $(PY) -m autograde.course
PART_OPT = $(if $(PART),--part "$(PART)")
EXCHANGE_OPT = $(PART_OPT) $(if $(EXCHANGE),--exchange "$(EXCHANGE)") -- $(NBGRADER_ARGS)

release: setup
	$(COURSE) release $(PART_OPT) $(if $(FROM),--from "$(FROM)")

grade: setup
	$(COURSE) grade $(PART_OPT) $(if $(JOBS),--jobs $(JOBS))

# after grading answer cells by hand in the formgrader: feedback and grades.csv again, no autograding
scores: setup
	$(COURSE) scores $(PART_OPT)

.PHONY: release-exchange collect return-feedback
release-exchange: setup
	$(COURSE) release-exchange $(EXCHANGE_OPT)

collect: setup
	$(COURSE) collect $(EXCHANGE_OPT)

return-feedback: setup
	$(COURSE) return-feedback $(EXCHANGE_OPT)

# What a learner may not read (docs/instructors.md): a part's solutions, handed out when the
# instructor chooses; the checkout's solutions/, tests/, .git, grading/ closed to all but the
# class's instructors (the hub does it when it starts; this, after a `git pull`, or without a hub).
.PHONY: release-solutions withhold
release-solutions: setup
	$(COURSE) release-solutions $(if $(FROM),--from "$(FROM)") $(EXCHANGE_OPT)

withhold: setup
	$(COURSE) withhold $(if $(CLASS),--class "$(abspath $(CLASS))")

learner-mode: setup
	$(PY) jupyter-config/lab_mode.py learner --level $(EXT_LEVEL)

instructor-mode: setup
	$(PY) jupyter-config/lab_mode.py instructor --level $(EXT_LEVEL)

clean:
	rm -rf .pytest_cache $(SYNTHETIC_DIR)
