"""`Controls`: the settings a running trainer reads at every step boundary, written by the dashboard (or any thread).

A run in processes of its own (`grpo-kit train`, under torchrun or not) is steered through a file instead: the
dashboard's side writes every value to `<output_dir>/.grpo_kit/controls.json` (`FileControls`), and the run's main
process reads it at each step boundary (`Controls.follow_file`), from where the values reach the other processes as
any control does (broadcast at each step). The file names the run it is for (a token the launcher passes in
`GRPO_KIT_CONTROLS_TOKEN`), so a file left by an earlier run is never applied to the next.

Each live setting is declared once, in `LIVE_SETTINGS`: its name is the `GRPOConfig` field it starts from (whose
rule checks every new value), the key the trainer logs it under in each metrics row, and the dashboard's slider for
it (label, range, step). Adding a `LiveSetting` there adds the control, its check, its slider and its column; the
trainer still has to read it (`snapshot()[name]`) for it to change anything.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..validation import field_rule, validate_control
from .config import GRPOConfig
from .rundir import MARK

CONTROLS_FILE = "controls.json"
"""In an output directory's `.grpo_kit/` (the kit's own folder, so the file never counts as a foreign one there)."""
TOKEN_VARIABLE = "GRPO_KIT_CONTROLS_TOKEN"
"""The environment variable through which a launcher tells the run which controls file is its own."""


def controls_path(output_dir: str | Path) -> Path:
    """Where a run in `output_dir` reads the controls written from another process."""
    return Path(output_dir) / MARK / CONTROLS_FILE


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
    saves: int = 0
    """Save requests so far (a file carries this count, so each request is applied once)."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._file_seen: tuple[int, int] | None = None
        self._file_saves = 0

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
                self.saves += key == "save_requested" and bool(value)
            self.version += 1
            self._changed.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of all values: each live setting under its name, the reward weights, the flags and
        the version."""
        with self._lock:
            return {**self.settings, "reward_weights": dict(self.reward_weights),
                    **{flag: getattr(self, flag) for flag in FLAGS}, "version": self.version}

    def file_values(self, token: str) -> dict[str, Any]:
        """What `FileControls` writes for the run `token` names: every value and the count of save requests."""
        with self._lock:
            return {"token": token, "settings": dict(self.settings), "reward_weights": dict(self.reward_weights),
                    "paused": self.paused, "stop_requested": self.stop_requested, "saves": self.saves}

    def follow_file(self, path: str | Path, token: str | None = None) -> bool:
        """Apply the controls file at `path` if it changed since the last call and names this run (`token`, default
        `$GRPO_KIT_CONTROLS_TOKEN`; without one nothing is followed): each value that differs from this object's, and
        a save when its count of save requests grew. A file that cannot be applied (unreadable, another run's, a
        value out of range) changes nothing and warns in one line. Returns whether anything changed."""
        token = token or os.environ.get(TOKEN_VARIABLE)
        path = Path(path)
        try:
            stat = path.stat()
        except OSError:
            return False
        if not token or (stat.st_mtime_ns, stat.st_size) == self._file_seen:
            return False
        self._file_seen = (stat.st_mtime_ns, stat.st_size)
        try:
            data = json.loads(path.read_text())
            if data.get("token") != token:
                return False
            changes = self._changes(data)
            if changes:
                self.update(**changes)
        except (OSError, ValueError, TypeError, AttributeError) as e:
            warnings.warn(f"{path}: not applied ({e}); the run goes on with its controls as they were", stacklevel=2)
            return False
        return bool(changes)

    def _changes(self, data: dict[str, Any]) -> dict[str, Any]:
        now = self.snapshot()
        changes: dict[str, Any] = {k: v for k, v in data.get("settings", {}).items() if now.get(k) != v}
        weights = {k: v for k, v in data.get("reward_weights", {}).items() if now["reward_weights"].get(k) != v}
        if weights:
            changes["reward_weights"] = weights
        changes.update({flag: data[flag] for flag in ("paused", "stop_requested")
                        if flag in data and now[flag] != data[flag]})
        if int(data.get("saves", 0)) > self._file_saves:
            self._file_saves = int(data["saves"])
            changes["save_requested"] = True
        return changes

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


class FileControls(Controls):
    """Controls that write themselves to a run's controls file at every update, for a run in other processes that
    follows it (`Controls.follow_file`): what a `Dashboard` steers a launched run through (`LaunchedRun`)."""

    def bind(self, path: str | Path, token: str) -> FileControls:
        """Write to `path` for the run `token` names, now and at every update."""
        self._path, self._token = Path(path), token
        self._write()
        return self

    def update(self, **values: Any) -> None:
        super().update(**values)
        self._write()

    def _write(self) -> None:
        path = getattr(self, "_path", None)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staged.write_text(json.dumps(self.file_values(self._token)))
        os.replace(staged, path)  # whole or not at all: the run never reads half a file
