# The workbook's two commands: `make workbook` executes every notebook, `make test` runs the tests.
# Both create ./.venv and install the project on first use, on a machine with only Python 3.10+.

PYTHON ?= python3
VENV ?= .venv
# Installed only when no torch is importable in the venv (which also sees the system's packages,
# so the PyTorch image's own torch, or the CPU build CI installs, is reused as is).
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The compat leg: the workbook on the seeds' torch 2.8 with Python 3.10 (the image's pair), in its own venv
# (the PyPI wheel is the CUDA build: ~7 GB of CUDA libraries, used on CPU here); reused once it exists.
COMPAT_TORCH_SPEC ?= torch==2.8.0
COMPAT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10*/bin/python3.10) python3.10)
COMPAT_VENV ?= .venv-torch2.8
COMPAT_STAMP := $(COMPAT_VENV)/.installed

# The edition `make lab` and `make workbook` use: en (notebooks/) or zh (the Chinese twins in notebooks/zh/, the same
# code cells with Chinese prose; scripts/twins.py keeps them in step).
EDITION ?= en
EDITION_DIR := $(if $(filter zh,$(EDITION)),notebooks/zh,$(if $(filter en,$(EDITION)),notebooks,$(error EDITION='$(EDITION)' \
	is not an edition: use EDITION=en (notebooks/, the default) or EDITION=zh (notebooks/zh/, 中文版))))
EDITION_OUT := $(if $(filter zh,$(EDITION)),outputs/zh,outputs)
# `make lab EDITION=zh` opens JupyterLab's own interface in Chinese: the zh_CN language pack (installed on first use),
# and a settings folder of its own (JUPYTERLAB_SETTINGS_DIR) whose translation setting is zh_CN, written once (a language
# picked later in Settings > Language stays). `make lab` (English) keeps the user's settings. JupyterLab's default
# language is the server's locale (LC_CTYPE; the server translates the menus itself), so with the pack installed (the
# test extra has it) a server with LANG=zh_CN.UTF-8 would open the English edition in Chinese: its server, and so its
# kernels, run with LC_CTYPE=C.UTF-8 (UTF-8 as before; LC_TIME, LC_NUMERIC and the rest stay as they are).
LAB_SETTINGS_DIR ?= $(abspath $(VENV))/lab-settings-zh
comma := ,
LAB_IMPORTS := jupyterlab$(if $(filter zh,$(EDITION)),$(comma) jupyterlab_language_pack_zh_CN)
LAB_EXTRA := $(if $(filter zh,$(EDITION)),lab-zh,lab)
LAB_LOCALE_FILE := $(LAB_SETTINGS_DIR)/@jupyterlab/translation-extension/plugin.jupyterlab-settings

# A PyPI mirror: pip reads PIP_INDEX_URL (and PIP_EXTRA_INDEX_URL) from the environment and make hands its environment
# to every recipe; no recipe here names an index. `make` says which index pip is given (any user:password@ masked).
ifneq ($(strip $(PIP_INDEX_URL)),)
$(info pip index (PIP_INDEX_URL): $(shell printf '%s' '$(PIP_INDEX_URL)' | sed -E 's#//[^/@]*@#//***@#')$(if \
	$(strip $(PIP_EXTRA_INDEX_URL)), and PIP_EXTRA_INDEX_URL: $(shell printf '%s' '$(PIP_EXTRA_INDEX_URL)' | sed -E 's#//[^/@ ]*@#//***@#g')))
endif

.PHONY: help install workbook test lab env bench compat slurm slurm-down clean-outputs

install: $(STAMP)

help:  ## list the targets
	@sed -n 's/^\([a-z-]*\):.*## \(.*\)/  make \1\t\2/p' $(MAKEFILE_LIST) | expand -t 22

$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[test]"
	touch $(STAMP)

workbook: $(STAMP)  ## execute every notebook into outputs/ (CPU default: 2 ranks on gloo); EDITION=zh: notebooks/zh/ into outputs/zh/
	$(BIN)/python scripts/run_workbook.py --notebooks-dir $(EDITION_DIR) --output-dir $(EDITION_OUT) $(WORKBOOK_ARGS)

test: $(STAMP)  ## unit tests, real 2-rank launches, papermill and nbval over notebooks/ (and notebooks/zh/)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

$(COMPAT_STAMP): pyproject.toml
	@$(COMPAT_PYTHON) -c "import sys; assert sys.version_info >= (3, 10)" 2>/dev/null || { echo "make compat needs \
	Python 3.10+ as COMPAT_PYTHON (got '$(COMPAT_PYTHON)'): make compat COMPAT_PYTHON=/path/to/python3.10" >&2; exit 2; }
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet "$(COMPAT_TORCH_SPEC)"
	$(COMPAT_VENV)/bin/python -m pip install --quiet -e .
	touch $(COMPAT_STAMP)

compat: $(COMPAT_STAMP)  ## the whole workbook on torch 2.8 + Python 3.10 (COMPAT_TORCH_SPEC, COMPAT_PYTHON) into outputs/compat/
	$(COMPAT_VENV)/bin/python -m pip install --quiet "$(COMPAT_TORCH_SPEC)"
	$(COMPAT_VENV)/bin/python scripts/run_workbook.py --output-dir outputs/compat $(WORKBOOK_ARGS)

lab: $(STAMP)  ## open JupyterLab on notebooks/ with the project's environment; EDITION=zh: notebooks/zh/, JupyterLab in Chinese
	$(BIN)/python -c "import $(LAB_IMPORTS)" 2>/dev/null || $(BIN)/python -m pip install -e ".[$(LAB_EXTRA)]"
ifeq ($(EDITION),zh)
	@test -f "$(LAB_LOCALE_FILE)" || { mkdir -p "$(dir $(LAB_LOCALE_FILE))" && echo '{"locale": "zh_CN"}' > "$(LAB_LOCALE_FILE)"; }
endif
	cd $(EDITION_DIR) && $(if $(filter zh,$(EDITION)),JUPYTERLAB_SETTINGS_DIR="$(LAB_SETTINGS_DIR)",LC_CTYPE=C.UTF-8) \
		$(abspath $(BIN))/jupyter lab --ServerApp.ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

bench: $(STAMP)  ## benchmarks as ratios (launcher, warm starts, metrics, memory, workbook; GPU when present)
	$(BIN)/python -c "import accelerate" 2>/dev/null || $(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

env: $(STAMP)  ## print the environment report
	$(BIN)/python -m tutorial_lib env

# A two-node SLURM cluster on this machine (root and Debian's slurm-wlm: apt-get install -y --no-install-recommends
# slurm-wlm), its state in one folder: $$TUTORIAL_LIB_SLURM_DIR, else /tmp/tutorial_lib-slurm-<uid>, or
# SLURM_ARGS="--state-dir DIR". `python -m tutorial_lib slurm status` shows it.
slurm: $(STAMP)  ## start the local SLURM cluster (2 nodes on 127.0.0.1) and print its SLURM_CONF export line
	$(BIN)/python -m tutorial_lib slurm up $(SLURM_ARGS)

slurm-down: $(STAMP)  ## stop the local SLURM cluster: cancel its jobs, stop its daemons by PID
	$(BIN)/python -m tutorial_lib slurm down $(SLURM_ARGS)

clean-outputs:
	rm -rf outputs notebooks/runs
