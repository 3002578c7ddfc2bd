"""`Controls`: the settings a running trainer reads at every step boundary, written by the dashboard (or any thread).

Each live setting is declared once, in `LIVE_SETTINGS`: its name is the `GRPOConfig` field it starts from (whose
rule checks every new value), the key the trainer logs it under in each metrics row, and the dashboard's slider for
it (label, range, step). Adding a `LiveSetting` there adds the control, its check, its slider and its column; the
trainer still has to read it (`snapshot()[name]`) for it to change anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..validation import field_rule, validate_control
from .config import GRPOConfig


@dataclass(frozen=True)
class LiveSetting:
    """A setting the dashboard may change while training runs: the `GRPOConfig` field `name` (its start value and
    its rule), the metrics column `name`, and a slider."""

    name: str
    label: str
    """The slider's description."""
    low: float
    high: float
    step: float
    """The slider's ends and step (with `log_scale`, ends as values and the step in powers of ten)."""
    log_scale: bool = False
    readout: str = ".2f"
    """How the slider prints its value."""
    scheduled: bool = False
    """The trainer's schedule moves the logged value too (warm-up): the dashboard marks a change only when the
    control itself changed."""
    inert: Callable[[GRPOConfig], str | None] = lambda cfg: None
    """Why the setting cannot act under `cfg` (then the dashboard shows this reason instead of a slider), or None."""


def _epsilon_inert(cfg: GRPOConfig) -> str | None:
    if cfg.num_iterations == 1:
        return ("with one pass over each batch (num_iterations = 1) the policy has not moved since sampling, the ratio "
                "is 1 and the clip never acts. It shows with num_iterations ≥ 2.")
    return None


LIVE_SETTINGS: dict[str, LiveSetting] = {setting.name: setting for setting in (
    LiveSetting("learning_rate", "learning rate", 1e-6, 1e-2, 0.1, log_scale=True, readout=".1e", scheduled=True),
    LiveSetting("beta", "β (KL weight)", 0.0, 1.0, 0.01),
    LiveSetting("temperature", "temperature", 0.1, 1.5, 0.05),
    LiveSetting("top_p", "top-p", 0.1, 1.0, 0.05),
    LiveSetting("epsilon", "ε (clip)", 0.02, 0.5, 0.01, inert=_epsilon_inert),
)}
"""Every live setting, in the dashboard's order."""

FLAGS = ("paused", "stop_requested", "save_requested")
"""The buttons' switches."""


@dataclass
class Controls:
    """Values that may change while training runs (the dashboard writes them, the trainer reads them).

    The trainer calls `snapshot()` once per step boundary, so a change applies at the next step and is
    recorded with that step. Thread-safe: writers use `update()`.
    """

    settings: dict[str, float] = field(default_factory=dict)
    """The value of each of `LIVE_SETTINGS`."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    paused: bool = False
    stop_requested: bool = False
    save_requested: bool = False
    version: int = 0
    """Incremented on every update: the trainer records which version each step used."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    @classmethod
    def from_config(cls, cfg: GRPOConfig) -> Controls:
        return cls(settings={name: getattr(cfg, name) for name in LIVE_SETTINGS},
                   reward_weights=dict(cfg.reward_weights or {}))

    def update(self, **values: Any) -> None:
        """Set control values, checked like the config settings they override (an unknown name or a bad value
        raises and changes nothing). Wakes a paused trainer."""
        allowed = [*LIVE_SETTINGS, "reward_weights", *FLAGS]
        for key in values:
            if key not in allowed:
                raise ValueError(f"Controls has no setting {key!r}; known: {sorted(allowed)}")
        checked = {key: validate_control(key, value, rule=field_rule(GRPOConfig, key), flag=key in FLAGS)
                   for key, value in values.items()}
        with self._changed:
            for key, value in checked.items():
                if key in LIVE_SETTINGS:
                    self.settings[key] = value
                elif key == "reward_weights":
                    self.reward_weights = {**self.reward_weights, **value}
                else:
                    setattr(self, key, value)
            self.version += 1
            self._changed.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of all values: each live setting under its name, the reward weights, the flags and
        the version."""
        with self._lock:
            return {**self.settings, "reward_weights": dict(self.reward_weights),
                    **{flag: getattr(self, flag) for flag in FLAGS}, "version": self.version}

    def consume_save_request(self) -> bool:
        with self._lock:
            asked, self.save_requested = self.save_requested, False
            return asked

    def wait_while_paused(self, poll_s: float = 0.2, idle: Callable[[], None] | None = None) -> None:
        """Block while paused (returns at once when not paused or when stop is requested).

        `idle` is called every `poll_s` seconds while waiting, without the lock held: a foreground loop
        processes the browser's widget messages there, which is how a resume click arrives at all."""
        if idle is None:
            with self._changed:
                while self.paused and not self.stop_requested:
                    self._changed.wait(poll_s)
            return
        while True:
            with self._lock:
                if not self.paused or self.stop_requested:
                    return
            idle()
            time.sleep(poll_s)
