# The workbook's two commands: `make workbook` executes every notebook, `make test` runs the tests.
# Both create ./.venv and install the project on first use, on a machine with only Python 3.10+.

PYTHON ?= python3
VENV ?= .venv
# Installed only when no torch is importable in the venv (which also sees the system's packages,
# so the PyTorch image's own torch, or the CPU build CI installs, is reused as is).
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install workbook test lab env bench clean-outputs

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[test]"
	touch $(STAMP)

workbook: $(STAMP)  ## execute every notebook into outputs/ (CPU default: 2 ranks on gloo)
	$(BIN)/python scripts/run_workbook.py --output-dir outputs $(WORKBOOK_ARGS)

test: $(STAMP)  ## unit tests, real 2-rank launches, papermill and nbval over notebooks/
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lab: $(STAMP)  ## open JupyterLab on the notebooks with the project's environment
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install -e ".[lab]"
	cd notebooks && ../$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

bench: $(STAMP)  ## benchmarks as ratios (launcher, metrics, memory, workbook; GPU when present)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

env: $(STAMP)  ## print the environment report
	$(BIN)/python -m tutorial_lib env

clean-outputs:
	rm -rf outputs notebooks/runs
