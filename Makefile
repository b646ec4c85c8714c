# Quick start: `make run` (installs what is missing, runs the default campaign) and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
CORES   ?= 2
# The campaign and its Hydra overrides, e.g. make run CAMPAIGN=ci OVERRIDES="tasks=ci evolve=ci"
CAMPAIGN  ?= default
OVERRIDES ?=
# One way to run a campaign: run, dry-run and rerun all call `assay run`, which builds the
# Snakemake command (printed first); `snakemake` alone, with the same overrides, runs the same.
ASSAY_RUN = PATH=$(abspath $(BIN)):$$PATH $(BIN)/assay run --cores $(CORES) \
  campaign=$(CAMPAIGN) $(OVERRIDES)

.PHONY: install run test test-gpu dry-run rerun lint clean chromium

install: $(STAMP)

# torch first and pinned: the CPU build on this machine's disk; nothing after it may pull CUDA.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip==26.0.1
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[pipeline,dev]'
	rm -f $(VENV)/.installed-* && touch $@

run: install
	$(ASSAY_RUN)
	$(BIN)/assay compare $(CAMPAIGN)
	@echo "report: results/$(CAMPAIGN)/report.html  archive: results/$(CAMPAIGN)/archive/"
	@echo "tools: . $(VENV)/bin/activate  (puts assay, snakemake and mlflow on the PATH)"

dry-run: install
	$(ASSAY_RUN) --dry-run

# Every stage of one task again, verdicts included: make rerun TASK=L1_1_ReLU [CAMPAIGN=...]
rerun: install
	@test -n "$(TASK)" || { echo "usage: make rerun TASK=L1_1_ReLU [CAMPAIGN=...] [OVERRIDES=...]" >&2; exit 2; }
	$(ASSAY_RUN) $(foreach t,$(TASK),--rerun $(t))
	$(BIN)/assay compare $(CAMPAIGN)

lint: install
	PATH=$(abspath $(BIN)):$$PATH snakemake --lint

# Tests marked `alone` time cpu kernels or load the whole machine (the zoo's memory scan): they
# run after the others, with the cores to themselves (beside another test worker, a 0.1 ms
# kernel measured 1.02x, then 0.014x; the scan ran past 900 s). --dist loadgroup:
# tests of one xdist_group share a worker (test_pipeline.py's two DAG tests share one campaign).
# --durations: the slowest tests in CI's log, where the suite's time goes.
test: install
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -n $(CORES) --dist loadgroup --timeout 1200 -q -m "not alone" --durations=25
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest --timeout 1200 -q -m alone

# Headless Chromium for tests/test_report_browser.py: Debian's package, needs root and apt
# (.ci/run does it; elsewhere install it yourself or point ASSAY_CHROMIUM at a chromium).
chromium:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

# On a GPU machine: the gpu-marked tests (skipped without CUDA).
test-gpu:
	python3 -m pytest -m gpu -q

clean:
	rm -rf results .snakemake
