"""Experiment trackers: every metrics row's numbers, also sent to Trackio, Weights & Biases or TensorBoard.

A trainer's `report_to` (GRPOConfig, SFTConfig, RFTConfig; `RunConfig.report_to` for every phase of the arc) names
the trackers, none by default, as TRL's `report_to` does. Each gets what the metrics file gets, at the same step:
every number of the row (the nested values, such as the advantage histogram and the logged completions, stay in
metrics.jsonl alone). Each tracker is its own library, installed on demand (`pip install 'grpo-kit[tracking]'`):

    tensorboard  event files in <output_dir>/tensorboard/ (torch's SummaryWriter)
    trackio      a local Trackio project `grpo_kit`, one run per output directory (`trackio show` to view)
    wandb        a W&B project `grpo_kit`, its files in <output_dir>/wandb/ (WANDB_MODE=offline keeps it on this
                 machine; else it asks for a key)
"""

from __future__ import annotations

import atexit
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..options import TRACKERS

__all__ = ["FOLDERS", "TRACKERS", "Reporter", "scalars"]

PROJECT = "grpo_kit"
"""The project a run is filed under in Trackio and W&B."""


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's finite numbers by name (booleans, strings, lists, dicts and the step itself left out)."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(float(v))}


FOLDERS = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""The entry each tracker writes in the output directory (the caller records it as the kit's before it is written)."""


class Reporter:
    """Sends metrics rows to the trackers named in `report_to` (see the module docstring). `run_name` names the run
    there, `output_dir` holds the trackers' FOLDERS (None: trackers that need one are refused), `config` is the run's
    settings."""

    def __init__(self, report_to: Sequence[str], *, run_name: str, output_dir: Path | None,
                 config: dict[str, Any] | None = None) -> None:
        self.writers: list[Any] = []
        for name in report_to:
            self.writers.append(_open(name, run_name=run_name, output_dir=output_dir, config=config or {}))

    def log(self, row: dict[str, Any]) -> None:
        values = scalars(row)
        step = int(row.get("step", 0))
        for writer in self.writers:
            writer.log(values, step)


def _open(name: str, *, run_name: str, output_dir: Path | None, config: dict[str, Any]) -> Any:
    if name in FOLDERS and output_dir is None:
        raise ValueError(f"report_to={name!r} needs an output_dir to write its files in")
    try:
        return {"tensorboard": _TensorBoard, "trackio": _Trackio, "wandb": _Wandb}[name](
            run_name=run_name, output_dir=output_dir, config=config)
    except ImportError as e:  # each tracker's package has the tracker's name
        raise ValueError(f"report_to={name!r} needs the {name} package ({e}): pip install 'grpo-kit[tracking]' "
                         f"or pip install {name}") from None


class _TensorBoard:
    def __init__(self, *, run_name: str, output_dir: Path, config: dict[str, Any]) -> None:
        import tensorboard  # noqa: F401 - SummaryWriter needs it; say so before torch does, in its own words
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(output_dir / FOLDERS["tensorboard"]))
        atexit.register(self.writer.close)

    def log(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()


class _Trackio:
    def __init__(self, *, run_name: str, output_dir: Path | None, config: dict[str, Any]) -> None:
        import trackio

        # the metrics rows only (no background CPU/GPU sampling); trackio finishes the run when the process ends
        self.run = trackio.init(project=PROJECT, name=run_name, config=config, resume="allow", embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)


class _Wandb:
    def __init__(self, *, run_name: str, output_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        (output_dir / FOLDERS["wandb"]).mkdir(exist_ok=True)  # wandb writes its own wandb/ folder in `dir`
        self.run = wandb.init(project=PROJECT, name=run_name, config=config, dir=str(output_dir),
                              reinit="create_new")
        atexit.register(self.run.finish)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step, commit=True)  # each row whole at once, as it is written
