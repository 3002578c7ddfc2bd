"""The allowed values of the choice settings that are not the algorithm's, written once, and `check_choice`. The
algorithm's choices (losses, KL estimators, advantage estimators and clip modes) are the names of their registries
in `grpo_kit.algo` (`losses.LOSSES`, `losses.KL_ESTIMATORS`, `advantages.ESTIMATORS`, `advantages.CLIP_MODES`)."""

from __future__ import annotations

from collections.abc import Iterable

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
