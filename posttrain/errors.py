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
