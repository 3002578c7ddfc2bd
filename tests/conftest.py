"""Shared fixtures. Tests use the embedded tiny Gemma (no hub access) on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import pytest  # noqa: E402
import torch  # noqa: E402

from grpo_kit.config import ModelConfig  # noqa: E402
from grpo_kit.models import load_model  # noqa: E402
from grpo_kit.tasks import ArithmeticTask  # noqa: E402


@pytest.fixture(scope="session")
def cpu() -> torch.device:
    return torch.device("cpu")


@pytest.fixture()
def tiny(cpu):
    """A freshly initialised tiny Gemma and its tokenizer (seed 0)."""
    return load_model(ModelConfig(), cpu)


@pytest.fixture(scope="session")
def task() -> ArithmeticTask:
    return ArithmeticTask(num_demonstrations=64, num_test=32)
