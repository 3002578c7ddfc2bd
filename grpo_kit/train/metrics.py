"""Metrics: device values gathered into one transfer per step, rows appended to a JSONL history.

The dashboard and plots read rows from here; nothing here knows about models or trainers.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .checkpoint import write_whole

HIST_EDGES = torch.linspace(-3.0, 3.0, 25)
"""Fixed advantage-histogram bins (24 bins on [−3, 3], outliers clamped into the end bins), so histograms
from different steps line up as one image."""


def to_host(values: dict[str, torch.Tensor | float | int]) -> dict[str, float]:
    """Move many scalar device tensors to Python floats with a single device→host transfer."""
    keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    out: dict[str, float] = {k: float(v) for k, v in values.items() if not isinstance(v, torch.Tensor)}
    if keys:
        stacked = torch.stack([values[k].detach().float().reshape(()) for k in keys]).cpu().tolist()
        out.update(zip(keys, stacked, strict=True))
    return out


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric across metrics rows, skipping rows that lack it."""
    pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def histogram(values: torch.Tensor, edges: torch.Tensor = HIST_EDGES) -> list[int]:
    """Counts of `values` in the bins between `edges` (values beyond the ends fall in the end bins)."""
    v = values.detach().float().cpu().clamp(edges[0].item(), edges[-1].item() - 1e-6)
    return torch.histc(v, bins=len(edges) - 1, min=edges[0].item(), max=edges[-1].item()).long().tolist()


class MetricsLogger:
    """Keeps every row in memory and appends it to `path` (JSONL); a dashboard reads `rows`. `forward(row)`, when
    given, gets each new row too (the experiment trackers)."""

    def __init__(self, path: str | Path | None = None, resume: bool = False, *,
                 forward: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = Path(path) if path else None
        self.forward = forward
        self.rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume and self.path.exists():
                self.rows = read_jsonl(self.path)
            else:
                self.path.write_text("")

    def log(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows.append(row)
            if self.path:
                with self.path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        if self.forward is not None:
            self.forward(row)

    def truncate(self, step: int) -> None:
        """Drop rows after `step` (used when resuming from an earlier checkpoint)."""
        with self._lock:
            self.rows = [r for r in self.rows if r.get("step", 0) <= step]
            if self.path:  # rewritten beside and swapped in: a kill leaves the old file or the new one
                write_whole(self.path, "".join(json.dumps(r) + "\n" for r in self.rows))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file. A torn last line (the run was killed mid-append) is dropped with a warning; a bad
    line anywhere else is an error naming it."""
    lines = [(n, line) for n, line in enumerate(Path(path).read_text().splitlines(), 1) if line.strip()]
    rows = []
    for i, (number, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {number} is not JSON ({e.msg})") from None
            warnings.warn(
                f"{path}: dropped the torn last line {number} (the run stopped while writing it)", stacklevel=2
            )
    return rows
