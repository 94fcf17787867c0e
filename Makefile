# The workbook's two commands: `make workbook` executes every notebook, `make test` runs the tests.
# Both create ./.venv and install the project on first use, on a machine with only Python 3.10+.

# The interpreter the venv is made from: the first of `python` and `python3` on PATH that imports torch (a PyTorch
# image's own, e.g. /root/miniconda3/bin/python or /opt/conda/bin/python), else python3. `make PYTHON=...` picks one.
PYTHON ?= $(or $(firstword $(foreach p,python python3,$(shell command -v $(p) >/dev/null 2>&1 && $(p) -c \
	"import torch" >/dev/null 2>&1 && command -v $(p)))),python3)
VENV ?= .venv
# Installed only when no torch is importable in the venv (which also sees the system's packages,
# so the PyTorch image's own torch, or the CPU build CI installs, is reused as is).
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The versions CI tested, for every install below: requirements/lock.txt, a constraints file (pip install -c) that uv
# resolves for Python 3.10+ on every platform, with torch left out (the torch you have is reused, never replaced).
# pyproject.toml keeps floors only, for a `pip install` into your own environment. `make lock` refreshes the lock: the
# newest releases, installed and tested first (`make drift`). LOCK= (empty) installs the newest releases the floors
# allow, as before the lock.
LOCK ?= requirements/lock.txt
LOCK_ARGS := $(if $(strip $(LOCK)),-c $(LOCK))
# `make drift` and `make lock`: the resolver (pinned, so a refresh is repeatable) and where they install and test.
UV_SPEC ?= uv==0.13.9
DRIFT_VENV ?= .venv-drift
UV_INDEX_ARGS := $(if $(strip $(PIP_INDEX_URL)),--default-index "$(PIP_INDEX_URL)")

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
# The learner's copy of the notebooks (scripts/working_copy.py): JupyterLab saves into the notebooks it opens, so it
# opens this copy (git ignores it) and notebooks/ stays as the workbook ships it; new versions never overwrite your work.
LAB_DIR ?= my-notebooks
LAB_EDITION_DIR := $(LAB_DIR)$(if $(filter zh,$(EDITION)),/zh)
# One JupyterLab workspace (open tabs, layout) per edition: the zh lab does not reopen the English lab's tabs.
LAB_WORKSPACES_DIR ?= $(abspath $(VENV))/lab-workspaces-$(EDITION)
# JupyterLab's settings defaults for this venv's labs (overrides.json): no news pop-up, no update check.
LAB_OVERRIDES_DIR := $(abspath $(VENV))/share/jupyter/lab/settings

# A PyPI mirror: pip reads PIP_INDEX_URL (and PIP_EXTRA_INDEX_URL) from the environment and make hands its environment
# to every recipe; no recipe here names an index. `make` says which index pip is given (any user:password@ masked).
ifneq ($(strip $(PIP_INDEX_URL)),)
$(info pip index (PIP_INDEX_URL): $(shell printf '%s' '$(PIP_INDEX_URL)' | sed -E 's#//[^/@]*@#//***@#')$(if \
	$(strip $(PIP_EXTRA_INDEX_URL)), and PIP_EXTRA_INDEX_URL: $(shell printf '%s' '$(PIP_EXTRA_INDEX_URL)' | sed -E 's#//[^/@ ]*@#//***@#g')))
endif

.PHONY: help install workbook test lab kernel env bench compat compat-venv compat-torch slurm slurm-down clean-outputs drift lock

install: $(STAMP)

help:  ## list the targets
	@sed -n 's/^\([a-z-]*\):.*## \(.*\)/  make \1\t\2/p' $(MAKEFILE_LIST) | expand -t 22

# The stamp names the lock the venv was installed from (tests/unit/test_packaging.py compares the versions with it).
$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) -c "import sys; assert sys.version_info >= (3, 10)" 2>/dev/null || { echo "PYTHON=$(PYTHON) is not a \
	Python 3.10+ (the interpreter the venv is made from): make PYTHON=/path/to/python3" >&2; exit 2; }
	@$(PYTHON) scripts/check_index.py
	@echo "making $(VENV) from $(PYTHON): $$($(PYTHON) -c 'import sys; v = sys.version.split()[0]; \
	exec("try:\n import torch; t = torch.__version__\nexcept ImportError: t = None"); \
	print(f"Python {v}, " + (f"its torch {t} is reused" if t else "no torch: $(TORCH_SPEC) will be installed"))')"
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install $(LOCK_ARGS) -e ".[test]"
	echo "$(LOCK)" > $(STAMP)

workbook: $(STAMP)  ## execute every notebook into outputs/ (CPU default: 2 ranks on gloo); EDITION=zh: notebooks/zh/ into outputs/zh/
	$(BIN)/python scripts/run_workbook.py --notebooks-dir $(EDITION_DIR) --output-dir $(EDITION_OUT) $(WORKBOOK_ARGS)

test: $(STAMP)  ## unit tests, real 2-rank launches, papermill and nbval over notebooks/ (and notebooks/zh/)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

$(COMPAT_STAMP): pyproject.toml $(LOCK)
	@$(COMPAT_PYTHON) -c "import sys; assert sys.version_info >= (3, 10)" 2>/dev/null || { echo "make compat needs \
	Python 3.10+ as COMPAT_PYTHON (got '$(COMPAT_PYTHON)'): make compat COMPAT_PYTHON=/path/to/python3.10" >&2; exit 2; }
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet "$(COMPAT_TORCH_SPEC)"
	$(COMPAT_VENV)/bin/python -m pip install --quiet $(LOCK_ARGS) -e .
	echo "$(LOCK)" > $(COMPAT_STAMP)

# The compat venv alone (.ci/run builds it before it runs the two legs side by side).
compat-venv: $(COMPAT_STAMP)

# Its torch alone (.ci/run installs it beside the test venv, then makes the compat venv: the two editable installs,
# which both write the checkout's egg-info, one after the other).
compat-torch:
	test -x $(COMPAT_VENV)/bin/python || $(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet "$(COMPAT_TORCH_SPEC)"

compat: $(COMPAT_STAMP)  ## the whole workbook on torch 2.8 + Python 3.10 (COMPAT_TORCH_SPEC, COMPAT_PYTHON) into outputs/compat/
	$(COMPAT_VENV)/bin/python -m pip install --quiet "$(COMPAT_TORCH_SPEC)"
	$(COMPAT_VENV)/bin/python scripts/run_workbook.py --output-dir outputs/compat $(WORKBOOK_ARGS)

lab: $(STAMP)  ## open JupyterLab on your copy of the notebooks (my-notebooks/, made on first use); EDITION=zh: my-notebooks/zh/, JupyterLab in Chinese
	$(BIN)/python -c "import $(LAB_IMPORTS)" 2>/dev/null || $(BIN)/python -m pip install $(LOCK_ARGS) -e ".[$(LAB_EXTRA)]"
	@# An image whose base environment serves its own JupyterLab (AutoDL's) at the locked version satisfies the venv's
	@# requirement from outside it: no jupyterlab data files in the venv, and a lab that finds no application assets.
	@test -d "$(VENV)/share/jupyter/lab/static" || { echo "JupyterLab comes from outside $(VENV): installing its own copy"; \
		$(BIN)/python -m pip install --quiet $(LOCK_ARGS) --ignore-installed --no-deps jupyterlab; }
	$(BIN)/python scripts/working_copy.py --edition $(EDITION) --to $(LAB_DIR)
	@mkdir -p "$(LAB_OVERRIDES_DIR)" && test -f "$(LAB_OVERRIDES_DIR)/overrides.json" || echo \
		'{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
		> "$(LAB_OVERRIDES_DIR)/overrides.json"
ifeq ($(EDITION),zh)
	@test -f "$(LAB_LOCALE_FILE)" || { mkdir -p "$(dir $(LAB_LOCALE_FILE))" && echo '{"locale": "zh_CN"}' > "$(LAB_LOCALE_FILE)"; }
endif
	cd $(LAB_EDITION_DIR) && $(if $(filter zh,$(EDITION)),JUPYTERLAB_SETTINGS_DIR="$(LAB_SETTINGS_DIR)",LC_CTYPE=C.UTF-8) \
		JUPYTERLAB_WORKSPACES_DIR="$(LAB_WORKSPACES_DIR)" \
		$(abspath $(BIN))/python -m jupyterlab --ServerApp.ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# The platform's own JupyterLab (AutoDL-style images serve one from their base environment): this venv as a kernel
# there, and the working copy to open with it.
kernel: $(STAMP)  ## register this venv as the Jupyter kernel "distributed-workbook" (for a platform's own JupyterLab) and make your copy of the notebooks
	$(BIN)/python -m ipykernel install --user --name distributed-workbook --display-name "distributed-workbook ($$($(BIN)/python -c 'import torch; print("torch", torch.__version__)'))"
	$(BIN)/python scripts/working_copy.py --edition $(EDITION) --to $(LAB_DIR)
	@echo "In your JupyterLab: open $(LAB_EDITION_DIR)/ and pick the kernel \"distributed-workbook\" (Kernel > Change Kernel)"

bench: $(STAMP)  ## benchmarks as ratios (launcher, warm starts, metrics, memory, workbook; GPU when present)
	$(BIN)/python -c "import accelerate" 2>/dev/null || $(BIN)/python -m pip install --quiet $(LOCK_ARGS) -e ".[bench]"
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

# Drift found early, outside CI's budget: what today's newest releases do to the workbook, before they reach a user.
drift:  ## resolve the newest releases (uv), install exactly them in .venv-drift, run the fast tests and notebook 13 (en, zh); print what differs from the lock
	rm -rf $(DRIFT_VENV)
	$(PYTHON) -m venv --system-site-packages $(DRIFT_VENV)
	$(DRIFT_VENV)/bin/python -m pip install --quiet "$(UV_SPEC)"
	$(DRIFT_VENV)/bin/uv pip compile pyproject.toml --all-extras --universal --python-version 3.10 --upgrade \
		--override requirements/torch-from-your-environment.txt --no-emit-package torch --annotation-style line \
		--custom-compile-command "make lock" $(UV_INDEX_ARGS) --quiet --output-file $(DRIFT_VENV)/lock.txt
	$(MAKE) --no-print-directory install VENV=$(DRIFT_VENV) LOCK=$(DRIFT_VENV)/lock.txt
	@sed -e 's/ *#.*//' -e '/^$$/d' $(LOCK) > $(DRIFT_VENV)/lock.before
	@sed -e 's/ *#.*//' -e '/^$$/d' $(DRIFT_VENV)/lock.txt > $(DRIFT_VENV)/lock.after
	@echo "== the newest releases against $(LOCK) (-: locked, +: newest) =="
	@diff -U0 $(DRIFT_VENV)/lock.before $(DRIFT_VENV)/lock.after | grep '^[-+][^-+]' || echo "(none: the lock holds the newest releases)"
	$(DRIFT_VENV)/bin/python -m pytest $(PYTEST_ARGS) tests/unit tests/integration/test_transformers_versions.py \
		notebooks/13_your_model_on_your_gpus.ipynb notebooks/zh/13_your_model_on_your_gpus.ipynb

lock: drift  ## refresh requirements/lock.txt: `make drift`, then, when it passed, its resolution becomes the lock (commit it: CI runs the rest)
	cp $(DRIFT_VENV)/lock.txt requirements/lock.txt
	@echo "requirements/lock.txt refreshed (the differences are above): commit it, and CI runs the whole workbook on it"

clean-outputs:
	rm -rf outputs notebooks/runs
