"""Errors of the post-training package. Every message says what to fix.

`PosttrainError` is the base; each stage adds its own subclass below (append, do not rewrite).
"""

from __future__ import annotations


class PosttrainError(Exception):
    """Base of every post-training error."""


class TrainingError(PosttrainError, ValueError):
    """Training cannot start or continue: an empty or too long dataset, a base model folder that is missing or
    not a Hugging Face checkpoint, a checkpoint that does not belong to this run."""


class ExportError(PosttrainError, ValueError):
    """An adapter cannot be merged, written or registered: a missing adapter, an existing output folder."""


class PosttrainDataError(PosttrainError, ValueError):
    """Traces cannot become training data: a malformed line (the message names file and line), a trace without
    tools or without an assistant turn, a call to a function that is not offered, an empty dataset, a chat
    template whose prompt is not a token prefix of the conversation."""


class ModelNotLocalError(PosttrainError, ValueError):
    """A model to train or score is not a local model: not a local registry name, not a safetensors checkpoint
    folder and not a .gguf file (a provider model such as openai/gpt-4o cannot be fine-tuned or run here)."""
