"""Bad input to the serving layer gets an error of the right type that names the problem.

Model files (missing, truncated, corrupt, an unsupported tensor type or architecture), prompts (too long,
empty, out of the vocabulary), sampling parameters and chat messages. Every error is a `ServingError`, so
the gateway can answer it with a 4xx; after them the shared SmolLM2 still generates what it did before.

Run: LINK_HOME=.link python -m pytest tests/serving/test_errors.py
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

import serving
from serving import (
    ContextLengthError,
    InvalidSamplingParamsError,
    ModelFileError,
    SamplingParams,
    ServingError,
    UnknownModelError,
    UnsupportedArchitectureError,
    UnsupportedTensorTypeError,
)
from serving.loader.gguf_loader import open_gguf
from serving.registry import ModelRegistry, ModelSpec

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

GREEDY = SamplingParams(temperature=0, max_tokens=8)
Q2_K_BLOCK_BYTES = 84  # one Q2_K block: 256 weights in 84 bytes (ggml's block_q2_K)


def _write_gguf(path, architecture: str, tensor_type: GGMLQuantizationType = GGMLQuantizationType.F32) -> None:
    """A one-layer GGUF holding the metadata `config_from_gguf` reads and one [2, 256] tensor."""
    w = GGUFWriter(str(path), architecture)
    w.add_block_count(1)
    w.add_embedding_length(256)
    w.add_feed_forward_length(256)
    w.add_head_count(4)
    w.add_token_list(["<unk>", "a", "b"])
    if tensor_type == GGMLQuantizationType.F32:
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 256), np.float32))
    else:  # raw bytes: [2 rows, one Q2_K block each]
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, Q2_K_BLOCK_BYTES), np.uint8), raw_dtype=tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _registry_with(name: str, source: str) -> ModelRegistry:
    return ModelRegistry([ModelSpec(name=name, source=source, architecture="llama", chat_format="template",
                                    context_length=2048)])


# --------------------------------------------------------------------------- model files


def test_unknown_model_lists_the_available_ones():
    with pytest.raises(UnknownModelError) as ei:
        serving.LLM("nope")
    msg = str(ei.value)
    assert "'nope'" in msg and "smollm2-135m-instruct" in msg and "gemma-3-270m" in msg


def test_missing_gguf_file(tmp_path):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ModelFileError) as ei:
        serving.LLM("mine", registry=_registry_with("mine", str(missing)))
    assert "not found" in str(ei.value) and str(missing) in str(ei.value)
    with pytest.raises(ModelFileError) as ei:
        open_gguf(missing)
    assert "not found" in str(ei.value)


def _copy_head(src, dst, num_bytes: int) -> None:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(num_bytes))


def test_truncated_gguf(tmp_path, smollm2_gguf_path):
    size = smollm2_gguf_path.stat().st_size
    cut = tmp_path / "cut.gguf"
    _copy_head(smollm2_gguf_path, cut, int(size * 0.6))  # header intact, tensor data cut short
    with pytest.raises(ModelFileError) as ei:
        open_gguf(cut)
    assert "truncated" in str(ei.value) and str(int(size * 0.6)) in str(ei.value)
    _copy_head(smollm2_gguf_path, cut, 4096)  # cut inside the metadata (the 49k-token vocabulary)
    with pytest.raises(ModelFileError, match="truncated"):
        open_gguf(cut)


def test_random_bytes_are_not_a_gguf_file(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(np.random.default_rng(0).bytes(100))
    with pytest.raises(ModelFileError) as ei:
        open_gguf(junk)
    assert "not a readable GGUF file" in str(ei.value)


def test_unsupported_tensor_type(tmp_path):
    path = tmp_path / "q2k.gguf"
    _write_gguf(path, "llama", GGMLQuantizationType.Q2_K)
    ckpt = open_gguf(path)  # the header is fine; the error comes when the tensor is dequantized
    assert (ckpt.config.num_layers, ckpt.config.hidden_size, ckpt.config.vocab_size) == (1, 256, 3)
    with pytest.raises(UnsupportedTensorTypeError) as ei:
        ckpt.state_dict()
    assert "blk.0.ffn_up.weight" in str(ei.value) and "Q2_K" in str(ei.value)


def test_a_valid_tiny_gguf_loads(tmp_path):
    # The control for the two tests around it: the same file with an F32 tensor and arch llama opens.
    path = tmp_path / "f32.gguf"
    _write_gguf(path, "llama")
    state = open_gguf(path).state_dict()
    assert list(state) == ["model.layers.0.mlp.up_proj.weight"]
    assert state["model.layers.0.mlp.up_proj.weight"].shape == (2, 256)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "falcon.gguf"
    _write_gguf(path, "falcon")
    with pytest.raises(UnsupportedArchitectureError) as ei:
        open_gguf(path)
    assert "'falcon'" in str(ei.value) and "llama" in str(ei.value)
    with pytest.raises(UnsupportedArchitectureError, match="falcon"):
        serving.LLM("mine", registry=_registry_with("mine", str(path)))


# --------------------------------------------------------------------------- requests


def test_prompt_longer_than_the_context(smollm2):
    assert smollm2.loaded.context_length == 8192
    with pytest.raises(ContextLengthError) as ei:
        smollm2.generate({"prompt_token_ids": [1] * 9000}, GREEDY)
    assert "9000" in str(ei.value) and "8192" in str(ei.value)
    with pytest.raises(ContextLengthError, match="8192"):  # exactly the context: no room for one token
        smollm2.generate({"prompt_token_ids": [1] * 8192}, GREEDY)


def test_empty_prompt(smollm2):
    for prompt in ("", {"prompt_token_ids": []}):
        with pytest.raises(ServingError, match="empty"):
            smollm2.generate(prompt, GREEDY)


def test_token_ids_outside_the_vocabulary(smollm2):
    vocab = smollm2.loaded.config.vocab_size
    for bad in (vocab, -1):
        with pytest.raises(ServingError) as ei:
            smollm2.generate({"prompt_token_ids": [1, bad]}, GREEDY)
        assert "vocabulary" in str(ei.value) and str(bad) in str(ei.value)


def test_max_tokens_zero():
    with pytest.raises(InvalidSamplingParamsError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)


def test_bad_chat_messages(smollm2):
    with pytest.raises(ServingError) as ei:
        smollm2.chat([{"role": "wizard", "content": "Hi"}], GREEDY)
    assert "'wizard'" in str(ei.value) and "role" in str(ei.value)
    for empty in ([], [[]]):
        with pytest.raises(ServingError, match="at least one message"):
            smollm2.chat(empty, GREEDY)


def test_wrong_number_of_sampling_params(smollm2):
    with pytest.raises(ServingError) as ei:
        smollm2.generate(["a", "b"], [GREEDY] * 3)
    assert "3 SamplingParams for 2 prompts" in str(ei.value)
    with pytest.raises(ServingError, match="2 SamplingParams for 1 prompts"):
        smollm2.chat([{"role": "user", "content": "Hi"}], [GREEDY, GREEDY])


def test_generation_works_after_errors(smollm2):
    prompt = "The capital of France is"
    ids = smollm2.tokenizer.encode(prompt)
    before = smollm2.generate(prompt, GREEDY)[0].outputs[0]
    for bad_call in (
        lambda: smollm2.generate({"prompt_token_ids": [1] * 9000}, GREEDY),
        lambda: smollm2.generate("", GREEDY),
        lambda: smollm2.generate({"prompt_token_ids": [10**6]}, GREEDY),
        lambda: smollm2.chat([{"role": "wizard", "content": "Hi"}], GREEDY),
        lambda: smollm2.generate(["a", "b"], [GREEDY] * 3),
    ):
        with pytest.raises(ServingError):
            bad_call()
    after = smollm2.generate(prompt, GREEDY)[0].outputs[0]
    assert (after.token_ids, after.text) == (before.token_ids, before.text)
    assert len(after.token_ids) == 8 and after.finish_reason == "length"
    assert after.token_ids[0] == int(smollm2.loaded.model.prefill_logits(ids)[-1].argmax())


def test_concurrent_tokenizer_conversions_do_not_collide(smollm2_gguf_path, tmp_path, monkeypatch):
    """Two processes converting one GGUF vocabulary at once (a server starting beside a test) both succeed."""
    import subprocess
    import sys

    monkeypatch.setenv("LINK_HOME", str(tmp_path))
    # No GGUF metadata: it only adds the chat template and EOS id after the conversion, and reading it would load
    # torch and parse the header in each process first.
    code = "import sys; from serving.text.tokenizer import Tokenizer; print(Tokenizer.from_gguf(sys.argv[1], {}).encode('Paris'))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(smollm2_gguf_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in results]
    assert len({out for out, _ in results}) == 1
    entries = list((tmp_path / "cache" / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
