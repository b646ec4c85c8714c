# Quick start: `make run` (installs what is missing, runs the default campaign) and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
CORES   ?= 2
# The campaign and its Hydra overrides, e.g. make run CAMPAIGN=ci OVERRIDES="tasks=ci evolve=ci"
CAMPAIGN  ?= default
OVERRIDES ?=
ALL_OVERRIDES := campaign=$(CAMPAIGN) $(OVERRIDES)
comma := ,
empty :=
space := $(empty) $(empty)

.PHONY: install run test test-gpu dry-run lint clean chromium

install: $(STAMP)

# torch first and pinned: the CPU build on this machine's disk; nothing after it may pull CUDA.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip==26.0.1
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[pipeline,dev]'
	rm -f $(VENV)/.installed-* && touch $@

run: install
	PATH=$(abspath $(BIN)):$$PATH snakemake --cores $(CORES) \
	  --config 'overrides=[$(subst $(space),$(comma),$(strip $(ALL_OVERRIDES)))]'
	PATH=$(abspath $(BIN)):$$PATH assay compare $(CAMPAIGN)
	@echo "report: results/$(CAMPAIGN)/report.html  archive: results/$(CAMPAIGN)/archive/"

dry-run: install
	PATH=$(abspath $(BIN)):$$PATH snakemake -n --cores $(CORES)

lint: install
	PATH=$(abspath $(BIN)):$$PATH snakemake --lint

test: install
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -n $(CORES) --timeout 1200 -q

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
