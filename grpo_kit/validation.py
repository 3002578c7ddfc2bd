"""How settings are checked: each config field's type (coerced where unambiguous: YAML reads `3e-4` as a string)
and the rule written beside it in `config.py` (`ruled(default, at_least(1))`: a range, or a choice from
`options.py`). Each config dataclass validates itself on construction, and the live controls are checked against
the rules of their fields; every error names the setting, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting's value is not allowed; the message names the setting, its value and what is allowed."""


Rule = tuple[Callable[[Any], bool], str]


def at_least(bound: float) -> Rule:
    return (lambda v: v >= bound, f"≥ {bound}")


def above(bound: float) -> Rule:
    return (lambda v: v > bound, f"> {bound}")


def within(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Rule:
    def check(v: float) -> bool:
        return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

    return (check, f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")


def one_of(allowed: tuple[str, ...]) -> Rule:
    return (lambda v: v in allowed, f"one of {', '.join(allowed)}")


def subset_of(allowed: tuple[str, ...]) -> Rule:
    return (lambda v: set(v) <= set(allowed), f"a list of any of {', '.join(allowed)}")


def ruled(default: Any, rule: Rule) -> Any:
    """A config dataclass field with default `default` whose value must pass `rule` (`validate` checks it; a None
    value, where the field allows one, skips it): the rule is written beside the field it governs."""
    return dataclasses.field(default=default, metadata={"rule": rule})


def field_rule(config_class: type, name: str) -> Rule | None:
    """The rule written beside field `name` of `config_class` (None: only its type is checked)."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    return fields[name].metadata.get("rule") if name in fields else None


def _coerce(value: Any, hint: Any, setting: str) -> Any:
    """`value` as type `hint`, converting only where the meaning is unambiguous; ConfigError otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        try:
            return _coerce(value, inner, setting)
        except ConfigError as error:  # the setting itself may also be null (not one of its items)
            if not str(error).startswith(f"{setting}="):
                raise
            raise ConfigError(f"{error}, or null (None)") from None
    if hint is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{setting}={value!r}: expected a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{setting}={value!r}: expected a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{setting}={value!r}: expected a whole number")
        return value
    if hint is str and isinstance(value, os.PathLike):  # a directory given as a Path
        return os.fspath(value)
    if hint is bool or hint is str:
        if not isinstance(value, hint):
            raise ConfigError(f"{setting}={value!r}: expected {'true or false' if hint is bool else 'a string'}")
        return value
    if origin is tuple:
        item = args[0] if args else str
        if not isinstance(value, (list, tuple)):
            raise ConfigError(
                f"{setting}={value!r}: expected a list of {'whole numbers' if item is int else 'strings'}")
        return tuple(_coerce(v, item, f"{setting}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{setting}={value!r}: expected a mapping of names to numbers")
        return {str(k): _coerce(v, float, f"{setting}[{k!r}]") for k, v in value.items()}
    return value


def validate(cfg: Any) -> None:
    """Coerce and check every field of config dataclass `cfg` in place (types, then each field's `ruled` rule)."""
    owner = type(cfg).__name__
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        setting = f"{owner}.{f.name}"
        value = _coerce(getattr(cfg, f.name), hints[f.name], setting)
        object.__setattr__(cfg, f.name, value)  # a frozen dataclass (ScoreSettings) is coerced too, once, here
        check(setting, value, f.metadata.get("rule"))


def check(setting: str, value: Any, rule: Rule | None) -> None:
    """Raise ConfigError unless `value` passes `rule` (None values and absent rules pass)."""
    if rule is not None and value is not None and not rule[0](value):
        raise ConfigError(f"{setting}={value!r}: must be {rule[1]}")


def validate_control(name: str, value: Any, *, rule: Rule | None = None, flag: bool = False) -> Any:
    """A live control's value (`controls.LIVE_SETTINGS`), coerced to a number and checked against `rule` (the rule
    of the `GRPOConfig` field of the same name); a button's `flag` is a bool; the reward weights a name → weight
    mapping."""
    if name == "reward_weights":
        return _coerce(value, dict[str, float], "Controls.reward_weights")
    if flag:
        return _coerce(value, bool, f"Controls.{name}")
    value = _coerce(value, float, f"Controls.{name}")
    check(f"Controls.{name}", value, rule)
    return value


def check_writable(directory: str | None, setting: str) -> None:
    """Create `directory` and write a probe file there, so a path that cannot hold the run's output is reported
    before any training rather than at the first save."""
    if directory is None:
        return
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".grpo_kit_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{setting}={directory!r}: cannot write there ({e.strerror or e})") from None


class DataError(ValueError):
    """A dataset cannot be trained on; the message names the row or column and what is expected."""


def reward_columns(func: Callable[..., Any]) -> list[str]:
    """The dataset columns a reward function names as parameters: the trainer passes each column under its name, so
    these must exist. Not columns: what the trainer itself passes (TRAINER_ARGUMENTS), and, for a function without a
    `completions` parameter, its first two (prompts and completions, by position: `rewards.call_reward`)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if "completions" not in {p.name for p in named}:
        named = named[2:]
    return [p.name for p in named if p.name not in TRAINER_ARGUMENTS + OPTIONAL_COLUMNS]


TRAINER_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
"""What the trainer passes every reward, as TRL's GRPOTrainer does (`rewards` module docstring)."""
OPTIONAL_COLUMNS = ("answer_type",)
"""Reward parameters that need no dataset column: `answer_type`, which only tasks from a user's data have (the reward
reads None without it)."""


def prompt_problem(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return "is empty" if not prompt.strip() else None
    if (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
    ):
        return None
    return (f"must be a string or a non-empty list of chat messages {{'role': ..., 'content': ...}}, "
            f"got {type(prompt).__name__} {str(prompt)[:60]!r}")


def check_prompt_dataset(rows: Any, rewards: dict[str, Callable[..., Any]], *,
                         prompt_tokens: Callable[[Any], int] | None = None,
                         max_prompt_tokens: int | None = None) -> None:
    """Before the first GRPO step: the dataset (a `datasets.Dataset` or a list of dicts) has rows, a `prompt`
    column, every column a reward reads (`reward_columns`) with a value in every row, well-formed prompts, and
    none longer than `max_prompt_tokens` (counted by `prompt_tokens`). DataError names the row or column."""
    if len(rows) == 0:
        raise DataError("the prompt dataset is empty: GRPO needs rows with a 'prompt' column")
    if hasattr(rows, "column_names"):
        columns = list(rows.column_names)
    else:
        if not all(isinstance(r, dict) for r in rows):
            raise DataError("the prompt dataset must be a datasets.Dataset or a list of dicts (one per row)")
        columns = sorted(set().union(*(r.keys() for r in rows)))
    if "prompt" not in columns:
        raise DataError(f"the prompt dataset has no 'prompt' column (its columns: {', '.join(columns) or 'none'}); "
                        "rename the one holding the prompts to 'prompt'")
    needed: dict[str, str] = {}  # column → the first reward that reads it
    for name, func in rewards.items():
        for col in reward_columns(func):
            needed.setdefault(col, name)
    for col, name in needed.items():
        if col not in columns:
            raise DataError(f"reward {name!r} reads the column {col!r}, which the prompt dataset lacks "
                            f"(its columns: {', '.join(columns)})")
    for i, row in enumerate(rows):
        problem = prompt_problem(row.get("prompt"))
        if problem:
            raise DataError(f"row {i}: 'prompt' {problem}")
        for col, name in needed.items():
            if row.get(col) is None:
                raise DataError(f"row {i}: {col!r} is empty (reward {name!r} reads it)")
        if max_prompt_tokens is not None and prompt_tokens is not None:
            length = prompt_tokens(row["prompt"])
            if length > max_prompt_tokens:
                raise DataError(f"row {i}: the prompt has {length} tokens, more than GRPOConfig.max_prompt_tokens="
                                f"{max_prompt_tokens} (raise it, or shorten the prompt)")


class TrainingDiverged(RuntimeError):
    """Too many steps in a row had a non-finite loss or gradient."""


def check_skipped_in_a_row(count: int, limit: int, *, row: dict, setting: str) -> None:
    """Raise TrainingDiverged once `count` consecutive steps were skipped (`limit` is the config's setting)."""
    if limit and count >= limit:
        raise TrainingDiverged(
            f"{count} steps in a row had a non-finite loss or gradient (last: "
            f"loss {row.get('loss', row.get('policy_loss'))}, grad norm {row.get('grad_norm')}); the run is diverging: "
            f"lower the learning rate (now {row.get('learning_rate')}), check the data and rewards, or raise {setting}"
        )
