"""A GRPO run in processes of its own — several GPUs under torchrun, or one process beside the notebook's kernel —
shown and steered by the same `Dashboard` as a trainer in the kernel:

    run = gk.LaunchedRun(cfg, processes=2, init_from="runs/sft/checkpoint")   # Kaggle's GPU T4 × 2
    dash = gk.Dashboard(run)
    dash.run()        # launches `grpo-kit train`, plots its metrics as rank 0 writes them, its controls steer it

The run is `grpo-kit train` for `cfg` (written to `<output_dir>/.grpo_kit/launched.yaml`), under `torchrun
--nproc-per-node N` when N > 1. The dashboard reads the metrics file the main process writes (the whole batch's
numbers, gathered over the processes), and its controls reach the run through the controls file
(`controls.FileControls`), which the main process reads at each step boundary and broadcasts to the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from ..train.config import RunConfig
from ..train.controls import TOKEN_VARIABLE, FileControls, controls_path
from ..train.rundir import MARK

POLL_SECONDS = 0.5
"""How often the dashboard's loop looks for new metrics rows while the run trains."""


class LaunchedRun:
    """`grpo-kit train` for `cfg` in `processes` processes of its own, with the attributes a `Dashboard` reads of a
    trainer: `config` (the GRPO settings the sliders start from), `reward_names`, `controls`, `logger.rows`, `step`,
    `train(...)`. `init_from`: the checkpoint GRPO starts from (`--init-from`); `device`: cpu, cuda, xla or None
    (auto); `extra_args`: more `grpo-kit train` flags."""

    def __init__(self, cfg: RunConfig, *, processes: int = 1, init_from: str | None = None,
                 device: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        from ..data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS, reward_name

        if processes < 1:
            raise ValueError(f"processes={processes}: must be ≥ 1")
        if cfg.grpo.prompts_per_step % processes:
            raise ValueError(f"grpo.prompts_per_step = {cfg.grpo.prompts_per_step} cannot be split over {processes} "
                             f"processes: make it a multiple of {processes}")
        self.run_config, self.processes = cfg, processes
        self.output_dir = Path(cfg.output_dir)
        self.config = dataclasses.replace(cfg.grpo, output_dir=cfg.output_dir,
                                          reward_weights=cfg.grpo.reward_weights or DEFAULT_WEIGHTS)
        self.reward_names = [reward_name(f) for f in DEFAULT_REWARDS]
        self.init_from, self.device, self.extra_args = init_from, device, tuple(extra_args)
        self.token = secrets.token_hex(8)
        self.controls = FileControls.from_config(self.config).bind(controls_path(self.output_dir), self.token)
        self.logger = SimpleNamespace(rows=[])
        rows, self._offset = self._metrics_rows(0)
        self.logger.rows.extend(rows)
        self.process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # ---- what a Dashboard reads --------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.logger.rows[-1]["step"] if self.logger.rows else 0

    @property
    def is_training(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held while one dashboard loop follows the run; a second is refused."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this launched run is already followed by a running dashboard loop: stop that first")
        try:
            yield
        finally:
            self._lock.release()

    # ---- the run ---------------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The command that runs it: torchrun around `grpo-kit train` for more than one process."""
        launcher = [sys.executable]
        if self.processes > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.processes}"]
        train = ["-m", "grpo_kit.cli", "train", "--config", str(self._config_file()), "--output-dir",
                 str(self.output_dir), "--quiet"]
        if self.init_from:
            train += ["--init-from", str(self.init_from)]
        if self.device:
            train += ["--device", self.device]
        return [*launcher, *train, *self.extra_args]

    def _config_file(self) -> Path:
        return self.output_dir / MARK / "launched.yaml"

    def _log_file(self) -> Path:
        return self.output_dir / MARK / "launched.log"

    def start(self) -> LaunchedRun:
        """Launch the run (once; a finished run is launched again, which resumes from its checkpoint)."""
        if self.is_training:
            return self
        path = self._config_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(json.loads(json.dumps(dataclasses.asdict(self.run_config)))))
        env = {**os.environ, TOKEN_VARIABLE: self.token}
        with open(self._log_file(), "ab") as log:
            self.process = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def train(self, steps: int | None = None, progress: bool = False,
              callback: Callable[[LaunchedRun, dict[str, Any]], None] | None = None,
              poll: Callable[[], None] | None = None) -> list[dict[str, Any]]:
        """Launch the run if it is not running and follow it to its end: `callback(self, row)` for each metrics row
        the main process writes, `poll()` between looks (the dashboard's widget events). `steps` must be None or the
        config's `grpo.steps` (the run trains to its config). Raises if the run fails, with its log's last line."""
        if steps is not None and steps != self.config.steps:
            raise ValueError(f"steps={steps}: a launched run trains to its config's grpo.steps ({self.config.steps}); "
                             "set cfg.grpo.steps before launching")
        self.start()
        while True:
            running = self.is_training
            rows, self._offset = self._metrics_rows(self._offset)
            for row in rows:
                while self.logger.rows and self.logger.rows[-1]["step"] >= row["step"]:  # a resume logs them again
                    self.logger.rows.pop()
                self.logger.rows.append(row)
                if callback is not None:
                    callback(self, row)
            if not running:
                break
            if poll is not None:
                poll()
            time.sleep(POLL_SECONDS)
        code = self.process.returncode
        if code != 0:
            raise RuntimeError(f"the launched run failed (exit {code}): {self._last_log_line()} "
                               f"(the whole log: {self._log_file()})")
        return self.logger.rows

    def _metrics_rows(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The complete rows of the run's metrics file from byte `offset` on, and where they end. A file shorter
        than `offset` was rewritten (a resume drops the rows after its checkpoint): it is read again from the
        start."""
        path = self.output_dir / "metrics.jsonl"
        if not path.exists():
            return [], offset
        with path.open("rb") as f:  # only what was written since the last look
            if f.seek(0, os.SEEK_END) < offset:
                offset = 0
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        rows = [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]
        return rows, offset + end

    def _last_log_line(self) -> str:
        try:
            lines = [line for line in self._log_file().read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:300] if lines else "(no output)"
