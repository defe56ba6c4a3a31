"""How `load_model` chooses packed GGUF weights or float ones (`is_packed`).

    .venv/bin/python -m pytest -q tests/serving/test_weight_formats.py
"""

from __future__ import annotations

import pytest

from kernels.gguf_weight import has_native
from serving.errors import ServingError
from serving.model_loader import WEIGHT_FORMATS, is_packed


def test_auto_packs_a_gguf_file_only_where_the_native_module_builds():
    assert is_packed("auto", is_gguf=True) == has_native()
    assert not is_packed("auto", is_gguf=False)


def test_explicit_formats_win():
    assert is_packed("packed", is_gguf=True) and not is_packed("float", is_gguf=True) and not is_packed("float", is_gguf=False)


def test_packed_safetensors_and_unknown_formats_are_refused():
    with pytest.raises(ServingError, match="GGUF"):
        is_packed("packed", is_gguf=False)
    with pytest.raises(ServingError, match="auto, packed, float"):
        is_packed("int4", is_gguf=True)
    assert WEIGHT_FORMATS == ("auto", "packed", "float")

