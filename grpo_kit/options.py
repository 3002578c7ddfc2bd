"""The allowed values of every choice setting, written once: `GRPOConfig` validates against them and the
loss, KL and advantage functions dispatch on them (their docstrings give each option's formula)."""

from __future__ import annotations

from collections.abc import Iterable

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo", "cispo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k3")
ADVANTAGE_ESTIMATORS = ("zscore", "centered", "mad", "batch")
ADVANTAGE_CLIPS = ("none", "symmetric", "asymmetric", "tanh")
REWARD_ON_ERROR = ("raise", "zero")
TASK_KINDS = ("arithmetic", "word_problems", "gsm8k", "file", "hub")
ANSWER_TYPES = ("auto", "number", "choice", "string", "regex", "math", "function")
MODEL_DTYPES = ("auto", "float32", "bfloat16")
TRACKERS = ("trackio", "wandb", "tensorboard")


def check_choice(setting: str, value: object, allowed: Iterable[str]) -> None:
    """Raise a one-line ValueError naming `setting`, its value and the allowed ones unless `value` is allowed."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{setting}={value!r}: must be one of {', '.join(allowed)}")
