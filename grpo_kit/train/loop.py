"""What every trainer's loop shares, whatever it learns from: `TrainingLoop`, the base of `SFTTrainer` (and
`RFTTrainer`) and `GRPOTrainer`.

It holds the optimizer (AdamW over the trainable weights), the claimed output directory and its metrics file, the
step counter, the clip-and-guard optimizer step, the skip guard (stop after `max_skipped_steps` non-finite steps in
a row), when a checkpoint is due, the resume check (settings that must match the checkpoint), saving and loading
the shared part of a checkpoint, and the loop itself: progress bar, time limit (`max_seconds`), and one loop per
model at a time. A trainer adds its algorithm: `train_step()` and what its checkpoints carry beyond these.

Under torchrun (`engine.distributed`) the loop is one of several processes: only the main one claims the output
directory and writes metrics and checkpoints, the gradients are summed over the processes before each optimizer
step, and whether to take another step is the main process's decision (its controls, its clock), broadcast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..engine.device import guarded_optimizer_step
from ..engine.distributed import broadcast, gather, sum_gradients, world
from ..engine.sharding import is_sharded
from ..validation import ConfigError, check_skipped_in_a_row, check_writable
from .checkpoint import checkpoint_state, load_checkpoint, save_checkpoint
from .metrics import MetricsLogger
from .rundir import MARK, claim, record_entry

# The models a training loop holds right now, with the (trainer, thread) holding each: a second loop — another
# dashboard, a background thread, a re-run cell's new trainer on the same model — would interleave optimizer steps.
_MODELS_IN_TRAINING: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
_MODELS_LOCK = threading.Lock()


class TrainingLoop:
    """The algorithm-free part of a trainer. A subclass sets the class attributes below, calls `_start_loop` from
    its `__init__` and defines `train_step() -> row`; its config has `learning_rate`, `weight_decay`,
    `max_grad_norm`, `max_skipped_steps`, `save_every`, `save_every_seconds`, `max_seconds`, `seed` and
    `output_dir`."""

    kind: str = ""
    """The run kind: its output directory's claim, its checkpoints' `kind`, its progress bar's label."""
    metrics_file: str = ""
    """The metrics file's name in the output directory."""
    resume_settings: tuple[str, ...] = ()
    """Settings a resumed run must share with its checkpoint (else it would see other data than the run it
    continues)."""

    model: torch.nn.Module
    config: Any

    def _start_loop(self, model: torch.nn.Module, config: Any, *, resume_metrics: bool) -> None:
        """Set up what every loop holds: device, trainable weights, optimizer, seeded generator, the claimed output
        directory and its metrics logger, step 0."""
        self.model, self.config = model, config
        self.device = next(model.parameters()).device
        self.world = world(self.device)
        """This run's processes (`engine.distributed`): one, torchrun's or a pod slice's hosts; only the main one
        writes."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.generator = torch.Generator().manual_seed(config.seed)
        """The run's own random stream (prompt order, sampling noise): the same on every process."""
        writes = bool(config.output_dir) and self.world.is_main
        if writes:
            check_writable(config.output_dir, f"{type(config).__name__}.output_dir")
        self.run_dir = claim(config.output_dir, self.kind) if writes else None
        """The output directory, claimed: what the trainer writes there is recorded, a second process is refused."""
        if config.output_dir and self.world.size > 1:
            self._check_shared(Path(config.output_dir))
        self.logger = MetricsLogger(
            self.run_dir.add(self.metrics_file) if self.run_dir else None, resume=resume_metrics,
            forward=self._reporter(config) if self.world.is_main else None,
        )
        self.step = 0
        self.step_seconds: list[float] = []
        """Wall seconds of each step this process ran (a time budget sizes the run from them)."""
        self.trained_seconds = 0.0
        """Wall seconds of every step the run has taken, those before a resume included (saved with each
        checkpoint): what a phase that must last as long as another one measures."""
        self.trained_seconds_limit: float | None = None
        """Stop once `trained_seconds` reaches this (None: no limit): a deadline in training time, so that a pause
        (the dashboard's) or a disconnect does not count against it (`course.arc.Arc` sets it for GRPO's share)."""
        self._last_save = time.monotonic()
        self._skipped_in_a_row = 0
        self.checkpoint_notes: dict[str, Any] = {}
        """What this trainer's checkpoints say about their weights beyond the config (the arc notes `adapter_over`:
        an adapter trained over another model than the preset's)."""

    def _check_shared(self, output_dir: Path) -> None:
        """Every process must see the output directory the main process claimed (a resume reads its checkpoint in
        every process): on several machines, one directory they all mount."""
        broadcast(None, self.world)  # the main process has claimed it by now
        seen = gather((output_dir / MARK / "run.json").exists(), self.world)
        blind = [rank for rank, ok in enumerate(seen) if not ok]
        if blind:
            raise RuntimeError(f"output_dir {output_dir}: process {blind[0]} of {self.world.size} does not see what "
                               "process 0 wrote there; on several machines (a pod slice's hosts) make it one "
                               "directory every machine mounts (a shared file system)")

    def _reporter(self, config: Any) -> Callable[[dict[str, Any]], None] | None:
        """Where each metrics row goes besides the metrics file: the trackers `config.report_to` names."""
        if not config.report_to:
            return None
        from .trackers import FOLDERS, Reporter

        for tracker in config.report_to:
            if tracker in FOLDERS and self.run_dir:
                self.run_dir.add(FOLDERS[tracker])  # its folder in the output directory, recorded as the kit's
        return Reporter(config.report_to, run_name=str(config.output_dir or self.kind),
                        output_dir=self.run_dir.path if self.run_dir else None, config=dataclasses.asdict(config)).log

    def train_step(self) -> dict[str, Any]:
        raise NotImplementedError

    # ---- one step's shared parts --------------------------------------------------------------------
    def _optimizer_step(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sum the gradients over the processes, clip them to `max_grad_norm` and step the optimizer unless the loss or
        norm is not finite (`device.guarded_optimizer_step`); returns (grad_norm, skipped: 1 if the step was skipped).
        `loss` is this process's part; a non-finite gradient anywhere makes the summed norm non-finite everywhere."""
        if not is_sharded(self.model):  # sharded weights: their backward has summed each gradient shard already
            sum_gradients(self.params, self.world.batch_world)  # each process has summed its block of the batch
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # sharded: the norm over every process's shards (a DTensor)
            grad_norm = grad_norm.full_tensor()
        return grad_norm, guarded_optimizer_step(self.optimizer, self.params, grad_norm=grad_norm, loss=loss)

    def _count_step_seconds(self, seconds: float) -> None:
        """A step took `seconds`: this process's list and the run's total (`trained_seconds`)."""
        self.step_seconds.append(seconds)
        self.trained_seconds += seconds

    def _count_skipped(self, row: dict[str, Any]) -> None:
        """The skip guard: a row whose update was skipped extends the run of skipped steps; `max_skipped_steps` in a
        row stops the run with an error naming the setting."""
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if row.get("skipped_updates") else 0
        check_skipped_in_a_row(self._skipped_in_a_row, self.config.max_skipped_steps, row=row,
                               setting=f"{type(self.config).__name__}.max_skipped_steps")

    def _save_due(self, *, requested: bool = False) -> bool:
        """A checkpoint is due: every `save_every` steps, or `save_every_seconds` after the last save, or `requested`.
        The main process decides (its clock) and every process follows: with sharded weights each takes part."""
        cfg = self.config
        due = requested or bool(cfg.save_every and self.step % cfg.save_every == 0) or (
            cfg.save_every_seconds is not None and time.monotonic() - self._last_save >= cfg.save_every_seconds)
        return broadcast(due, self.world)

    @property
    def checkpoint_path(self) -> Path | None:
        """Where the loop saves as it goes (`output_dir/checkpoint`; None without an output directory)."""
        return Path(self.config.output_dir) / "checkpoint" if self.config.output_dir else None

    # ---- checkpoints --------------------------------------------------------------------------------
    def _save(
        self, path: str | Path, extra: dict[str, Any], *, modules: dict[str, torch.nn.Module] | None = None
    ) -> Path:
        """Weights (or adapter), optimizer, RNG states, step, `kind`, the seconds trained, and the trainer's `extra`.
        Written by the main process (the others hold the same state, or with sharded weights their shards, which
        every process gathers to it first), or with full fine-tuning over a pod slice's hosts by every host, each
        its chips' shards (`checkpoint.spans_hosts`); returns the path on every process."""
        if self.world.is_main:
            record_entry(self.run_dir, path)
        path = save_checkpoint(path, self.model, self.optimizer, self.step,
                               extra={"kind": self.kind, "trained_seconds": self.trained_seconds,
                                      **self.checkpoint_notes, **extra},
                               generator=self.generator, modules=modules, world=self.world)
        self._last_save = time.monotonic()
        return path

    def _restore(self, path: str | Path, *, modules: dict[str, torch.nn.Module] | None = None) -> dict[str, Any]:
        """Load a checkpoint of this kind: weights, optimizer, RNG and step; metrics rows after that step are
        dropped. Refuses one whose `resume_settings` differ (the resumed run would see other data). Returns the
        checkpoint's state for the trainer's own parts."""
        saved = checkpoint_state(path, verify=False)[1].get("config", {})
        for name in self.resume_settings:
            if name in saved and saved[name] != getattr(self.config, name):
                raise ConfigError(
                    f"{type(self.config).__name__}.{name}={getattr(self.config, name)!r}: the checkpoint {path} "
                    f"was trained with {saved[name]!r}; resume with the same value, or start over (--no-resume)"
                )
        state = load_checkpoint(path, self.model, self.optimizer, self.generator, kind=self.kind, modules=modules)
        self.step = state["step"]
        self.logger.truncate(self.step)
        # a checkpoint from before trained_seconds was saved: its logged steps' seconds (every step where logged)
        self.trained_seconds = state.get("trained_seconds",
                                         sum(row.get("step_seconds", 0.0) for row in self.logger.rows))
        return state

    # ---- the loop -----------------------------------------------------------------------------------
    @property
    def is_training(self) -> bool:
        """True while a training loop or a step runs on this trainer (in any thread)."""
        with _MODELS_LOCK:
            owner = _MODELS_IN_TRAINING.get(self.model)
        return owner is not None and owner[0] is self

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the model for one training loop; refuse (RuntimeError) while another loop holds it — this
        trainer's from another thread, or another trainer's on the same model. The holding thread may re-enter."""
        me = threading.get_ident()
        with _MODELS_LOCK:
            owner = _MODELS_IN_TRAINING.get(self.model)
            reentry = owner is not None and owner[0] is self and owner[1] == me
            if owner is not None and not reentry:
                if owner[0] is self:
                    raise RuntimeError(f"this {type(self).__name__} is already training in another loop (a running "
                                       "Dashboard or thread); stop that run first (the dashboard's stop button, or "
                                       "dash.stop() then dash.wait())")
                raise RuntimeError(
                    f"this model is already being trained by another {type(owner[0]).__name__}'s loop (a "
                    "cell run again while its dashboard trains in the background?): stop that run first"
                )
            _MODELS_IN_TRAINING[self.model] = (self, me)
        if reentry:
            yield
            return
        try:
            yield
        finally:
            with _MODELS_LOCK:
                _MODELS_IN_TRAINING.pop(self.model, None)

    def _run(self, target: int, *, progress: bool, before_step: Callable[[], bool] | None = None,
             after_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Step until `target` steps are done, `before_step()` returns False, `max_seconds` has passed since
        the call, or `trained_seconds` has reached `trained_seconds_limit`; `after_step(row)` runs after each
        step. Holds the model (`exclusive`) and shows a progress bar."""
        t0 = time.perf_counter()
        with self.exclusive():
            bar = tqdm(total=target, initial=self.step, desc=self.kind.upper(),
                       disable=not progress or not self.world.is_main)
            try:
                while self._another_step(target, t0, before_step):
                    row = self.train_step()
                    bar.update(1)
                    postfix = self._progress_postfix(row)
                    if postfix:
                        bar.set_postfix(postfix)
                    if after_step is not None:
                        after_step(row)
            finally:
                bar.close()
        return self.logger.rows

    def _another_step(self, target: int, t0: float, before_step: Callable[[], bool] | None) -> bool:
        """Whether `_run` takes another step: fewer than `target` done, `trained_seconds_limit` and `max_seconds`
        (since `t0`) not reached, and `before_step()` (controls: pause, stop) agrees. The main process decides
        (its clock, its controls) and every process follows."""
        limit, max_seconds = self.trained_seconds_limit, self.config.max_seconds
        go = (self.step < target and (limit is None or self.trained_seconds < limit)
              and (max_seconds is None or time.perf_counter() - t0 <= max_seconds)
              and (before_step is None or before_step()))
        return broadcast(go, self.world)

    def _progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        """What the progress bar shows after a step."""
        return {}
