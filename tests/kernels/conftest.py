"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest
import torch

import kernels


@pytest.fixture
def clean_dispatch():
    """No winners, recorder or registered variants before and after the test; its thread count restored."""
    threads = torch.get_num_threads()
    kernels.reset()
    yield
    kernels.reset()
    torch.set_num_threads(threads)
