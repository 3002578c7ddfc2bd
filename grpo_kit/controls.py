"""`Controls`: the settings a running trainer reads at every step boundary, written by the dashboard (or any thread)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import GRPOConfig
from .validation import validate_control


@dataclass
class Controls:
    """Values that may change while training runs (the dashboard writes them, the trainer reads them).

    The trainer calls `snapshot()` once per step boundary, so a change applies at the next step and is
    recorded with that step. Thread-safe: writers use `update()`.
    """

    learning_rate: float = 1e-3
    beta: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0
    epsilon: float = 0.2
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
        return cls(
            learning_rate=cfg.learning_rate,
            beta=cfg.beta,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            epsilon=cfg.epsilon,
            reward_weights=dict(cfg.reward_weights or {}),
        )

    def update(self, **values: Any) -> None:
        """Set control values, checked like the config settings they override (an unknown name or a bad value
        raises and changes nothing). Wakes a paused trainer."""
        allowed = {f.name for f in dataclasses.fields(self)} - {"version"}
        for key in values:
            if key not in allowed:
                raise ValueError(f"Controls has no setting {key!r}; known: {sorted(allowed)}")
        checked = {key: validate_control(key, value) for key, value in values.items()}
        with self._changed:
            for key, value in checked.items():
                if key == "reward_weights":
                    value = {**self.reward_weights, **value}
                setattr(self, key, value)
            self.version += 1
            self._changed.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of all values."""
        with self._lock:
            out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            out["reward_weights"] = dict(self.reward_weights)
            return out

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
