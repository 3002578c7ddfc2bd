"""The whole arc, phase by phase: the base model → SFT warm-up → GRPO with verifier rewards → greedy evaluation after
each, and optionally two controls, each trained from the SFT model for as long as GRPO trained: SFT continued on the
same demonstrations, and rejection-sampling fine-tuning on the model's own right answers (RFT).

`grpo-kit demo` runs it in one go; notebook 08 calls the phases one cell at a time (GRPO under the live dashboard).
Each finished phase is recorded in `output_dir/progress.json` and each training phase saves checkpoints as it goes,
so running again after a disconnect continues where it stopped. With `time_budget_minutes` the SFT and GRPO phases
are sized from step and evaluation times measured along the way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..algo.difficulty import DifficultyTargeting
from ..data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS, RewardFunc
from ..data.tasks import make_task
from ..engine.device import get_device, use_cpu_threads
from ..engine.distributed import broadcast, world
from ..engine.models import is_lora, load_model, merge_and_restart_lora
from ..engine.sharding import gathered
from ..eval.evaluation import Batching, evaluate, sampled_scores
from ..train.checkpoint import load_checkpoint, save_checkpoint, write_whole
from ..train.config import RunConfig
from ..train.grpo import GRPOTrainer
from ..train.metrics import read_jsonl
from ..train.rft import RFTTrainer, rft_config
from ..train.rundir import MARK, claim, record_entry
from ..train.sft import SFTTrainer
from ..validation import DataError
from .plots import plot_accuracy, plot_advantage_histograms, plot_kl, plot_rewards, plot_sharpening
from .stages import Stage

ARC_ENTRIES = ("progress.json", "summary.json", Stage.SFT, Stage.GRPO, "reward_curve.png", "kl.png",
               "advantage_histograms.png", "accuracy.png", "sharpening.png")
"""What the arc writes in its output directory (and `control/`, `rft/` with the controls, `export-<stage>/` on
export)."""
PROBE_STEPS = 2
"""Steps run before a phase is sized to its time: the first may compile (XLA) or warm caches; the last one's time
is the estimate."""
SFT_PROBE_STEPS = 6
"""SFT's and the control's probe: an SFT step's time varies with its batch's lengths, so one step misjudges the phase by
up to a fifth. The median of the probe's steps after the first sizes the phase; they run at the start of the schedule,
where the run's length barely changes the rate. SFT and the control are sized again a third of the way in
(`Arc._resize`)."""


class Arc:
    """One run of the arc in `cfg.output_dir`. Phases: `evaluate("base")`, `sft()`, `evaluate("sft")`, `grpo()`,
    `evaluate("grpo")`, `control()`, `evaluate("control")`, `rft()`, `evaluate("rft")`, then `summary()`; `run()`
    does them all (the controls where the config asks for them). A phase
    already recorded in progress.json returns its record; `resume=False` starts the directory over.

    Under torchrun every process runs every phase (its trainers split each batch, `engine.distributed`); the main
    process alone claims the directory, writes, and evaluates, and its records (each phase's results and the time
    budget's plan, sized by its clock) are every process's at each save, so all train the same steps."""

    def __init__(self, cfg: RunConfig, device: str | torch.device | None = None, *, progress: bool = True,
                 resume: bool = True, rewards: Sequence[RewardFunc] | None = None) -> None:
        if cfg.rft_control and cfg.rft_learning_rate is None:  # recorded as the number RFT trains at
            cfg = dataclasses.replace(cfg, rft_learning_rate=cfg.grpo.learning_rate)
        if cfg.report_to is not None:  # every phase to the arc's trackers
            cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, report_to=cfg.report_to),
                                      grpo=dataclasses.replace(cfg.grpo, report_to=cfg.report_to))
        self.cfg, self.progress = cfg, progress
        self.rewards = list(rewards) if rewards is not None else list(DEFAULT_REWARDS)
        """GRPO's reward functions (default: the verifier rewards, weighted by grpo.reward_weights or
        DEFAULT_WEIGHTS)."""
        self.out = Path(cfg.output_dir)
        self.clock = time.perf_counter()
        self.record_path = self.out / "progress.json"
        self.task = make_task(cfg.task)
        self.test = self.task.test_set()
        try:
            self.task.demonstrations()
            self.has_solutions = True
        except DataError:  # your data without worked solutions: GRPO starts from the base model
            self.has_solutions = False
        """Whether the task has worked solutions: without them SFT and the SFT control are skipped."""
        use_cpu_threads()
        self.device = get_device(device)
        self.world = world(self.device)
        """The run's processes (one, or torchrun's): the main one writes and evaluates."""
        self.records = self._open(resume)
        t0 = time.perf_counter()
        self.model, self.tokenizer = load_model(cfg.model, self.device)
        self.records.setdefault("load", {"seconds": time.perf_counter() - t0})
        self.holds = Stage.BASE  # which stage's weights the model holds now
        self._fresh_adapter: dict[str, torch.Tensor] | None = None
        self.trainer: GRPOTrainer | None = None
        self._save()

    @classmethod
    def from_dir(
        cls, output_dir: str | Path, device: str | torch.device | None = None, *, progress: bool = False
    ) -> Arc:
        """The arc recorded in `output_dir` (its progress.json's settings), to evaluate, score or export a stage of it
        (`hold`); nothing trains unless a phase is called."""
        from ..train.config import apply_overrides

        path = Path(output_dir) / "progress.json"
        if not path.exists():
            raise FileNotFoundError(f"{output_dir} holds no arc (no progress.json): give the output directory of "
                                    "grpo-kit demo or notebook 08/09")
        settings = json.loads(path.read_text())["settings"]
        cfg = apply_overrides(RunConfig(), settings, str(path))
        return cls(dataclasses.replace(cfg, output_dir=str(output_dir)), device, progress=progress)

    # -- progress.json ---------------------------------------------------------------------------------------
    def _open(self, resume: bool) -> dict[str, Any]:
        settings = json.loads(json.dumps(dataclasses.asdict(self.cfg), default=str))
        settings["model"].pop("hf_token", None)
        self.run_dir = claim(self.out, "arc", overwrite=not resume) if self.world.is_main else None
        """The output directory, claimed (by the main process): a directory holding files the arc did not write is
        refused (unless resume=False, which writes beside them), and starting over removes only the arc's own
        files."""
        for name in ARC_ENTRIES + self._controls() if self.run_dir else ():  # a clash is found before any work
            self.run_dir.add(name)
        broadcast(None, self.world)  # the others read progress.json once the main process has claimed the directory
        if self.record_path.exists():
            records = json.loads(self.record_path.read_text())
            # a setting the recorded run lacks counts as unset: a field added since, at its default None, is no change
            if changed := _first_difference(records.get("settings", {}), settings):
                raise ValueError(
                    f"{self.out} holds an arc run with other settings ({changed}): use another output_dir, "
                    "or start over with resume=False (CLI: --overwrite)"
                )
            records["settings"] = settings
            return records
        return {"settings": settings, "phases": {}, "plan": {}}

    def _save(self) -> None:
        """Every process takes the main process's records (in place: a phase holds on to its plan), which the main
        process writes to progress.json."""
        _take(self.records, broadcast(self.records, self.world))
        if self.world.is_main:
            # the temporary file inside the kit's folder: a crash leaves nothing of its own beside the user's files
            write_whole(self.record_path, json.dumps(self.records, indent=2),
                        tmp=self.out / MARK / "progress.json.tmp")

    def done(self, phase: str) -> dict[str, Any] | None:
        """The record of a finished phase (`base_eval`, `sft`, `sft_eval`, `grpo`, …), or None."""
        return self.records["phases"].get(phase)

    def finish(self, phase: str, record: dict[str, Any]) -> dict[str, Any]:
        """Record `phase` as finished with `record` (its results; `seconds` counts against the time budget)."""
        self.records["phases"][phase] = record
        self._save()
        return self.records["phases"][phase]

    # -- weights -----------------------------------------------------------------------------------------------
    def hold(self, stage: str) -> None:
        """Put the weights after `stage` in the model: the SFT checkpoint, then (GRPO, a control) that phase's on
        top."""
        if stage == self.holds:
            return
        if stage == Stage.BASE or (stage == Stage.SFT and self.holds != Stage.BASE):
            raise RuntimeError(f"the arc cannot go back from the {self.holds} model to the {stage} model")
        if stage == Stage.SFT:
            load_checkpoint(self.out / Stage.SFT / "final", self.model)
        else:
            self._start_from_sft()
            load_checkpoint(self.out / stage / "final", self.model)
        self.holds = stage

    def _start_from_sft(self) -> None:
        """The SFT model as a starting point for GRPO or the control: with LoRA its adapter merged into the weights
        and a fresh adapter on top (so GRPO's reference, the adapter switched off, is the SFT model)."""
        lora = is_lora(self.model)
        if self.holds == Stage.BASE or (not lora and self.holds != Stage.SFT):
            load_checkpoint(self.out / Stage.SFT / "final", self.model)
        if lora and self._fresh_adapter is None:
            self.model = merge_and_restart_lora(self.model, self.cfg.model)
            self._fresh_adapter = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        elif lora:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    if name in self._fresh_adapter:
                        p.copy_(self._fresh_adapter[name])
        self.holds = Stage.SFT

    def _controls(self) -> tuple[str, ...]:
        """The control phases this config runs."""
        wanted = (self.cfg.control and self.has_solutions, self.cfg.rft_control)
        return tuple(c for c, on in zip(Stage.controls(), wanted, strict=True) if on)

    # -- time budget -------------------------------------------------------------------------------------------
    def _spent(self) -> float:
        return sum(r.get("seconds", 0.0) for r in [self.records["load"], *self.records["phases"].values()])

    def _evals_left(self) -> int:
        stages = [Stage.SFT, Stage.GRPO, *self._controls()]
        return sum(1 for s in stages if not self.done(f"{s}_eval"))

    def _eval_seconds(self) -> float:
        """The latest evaluation's time, with pass@k's k samples per problem where it will run (counted as k greedy
        evaluations when not yet measured)."""
        last = [r for name, r in self.records["phases"].items() if name.endswith("_eval")][-1]
        k = self.cfg.eval_pass_k
        return last["seconds"] if f"pass@{k}" in last else last["greedy_seconds"] * (1 + k)

    def _training_seconds(self) -> float:
        """Budget left for training: the budget less what is spent and the evaluations still to come."""
        left = 60 * self.cfg.time_budget_minutes - self._spent() - self._evals_left() * self._eval_seconds()
        return max(left, 0.0)

    # -- phases ------------------------------------------------------------------------------------------------
    def evaluate(self, stage: str) -> dict[str, Any]:
        """Greedy accuracy and format rate on the held-out set (and pass@k when `eval_pass_k`) of the model after
        `stage` (base, sft, grpo, control, rft), with GRPO's max_new_tokens."""
        stage = Stage.named(stage)
        if record := self.done(f"{stage}_eval"):
            return record
        skipped, base = (self.done(Stage.SFT) or {}).get("skipped"), self.done("base_eval")
        if stage == Stage.SFT and skipped and base and not self.cfg.eval_pass_k:  # the same weights, already measured
            return self.finish("sft_eval", {**base, "seconds": 0.0, "greedy_seconds": 0.0, "same_as": Stage.BASE})
        self.hold(stage)
        with gathered(self.model):  # weights sharded over processes: whole on each while the main one evaluates
            record = self._measure(stage) if self.world.is_main else {}  # the others take its record at finish
        return self.finish(f"{stage}_eval", record)

    def _measure(self, stage: str) -> dict[str, Any]:
        """`evaluate`'s numbers for the model as it is now."""
        t0 = time.perf_counter()
        g = self.cfg.grpo
        batching = Batching(size=self.cfg.eval_batch_size, prompt_bucket=g.prompt_bucket)
        result = evaluate(self.model, self.tokenizer, self.test, max_new_tokens=g.max_new_tokens,
                          batching=batching)
        record = {"accuracy": result["accuracy"], "format_rate": result["format_rate"], "n": result["n"],
                  "correct": result["correct"], "samples": result["samples"][:4],
                  "greedy_seconds": time.perf_counter() - t0}
        if self.cfg.eval_pass_k and stage != Stage.BASE:
            record.update(sampled_scores(self.model, self.tokenizer, self.test, k=self.cfg.eval_pass_k,
                                         max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                                         batching=batching, seed=g.seed))
        record["seconds"] = time.perf_counter() - t0
        return record

    def sft(self) -> dict[str, Any]:
        """SFT on the task's demonstrations from the base model: `sft.steps` steps, or with a time budget and an
        `sft_fraction` as many as fit that share of it, sized after its first steps and again a third of the way in."""
        if record := self.done(Stage.SFT):
            return record
        if self.cfg.grpo.difficulty_targeting:  # rows without a level would stop GRPO's first step: refused before SFT
            DifficultyTargeting(self.cfg.grpo.difficulty_key).level(next(self.task.prompt_stream()))
        self.hold(Stage.BASE)
        if not self.has_solutions:  # nothing to imitate: the base model's weights stand in for the SFT model's
            if self.world.is_main:
                run = claim(self.out / Stage.SFT, "sft")
                record_entry(run, self.out / Stage.SFT / "final")
            # every process: sharded weights are gathered to the main one, which writes
            save_checkpoint(self.out / "sft" / "final", self.model, None, 0, extra={"kind": "sft"}, world=self.world)
            self.holds = Stage.SFT
            return self.finish(Stage.SFT, {"steps": 0, "seconds": 0.0, "skipped": "the task has no worked solutions"})
        plan = self.records["plan"]
        sized = bool(self.cfg.time_budget_minutes and self.cfg.sft_fraction)  # sft_fraction None: sft.steps as set
        if sized and "sft_seconds" not in plan:
            self.evaluate(Stage.BASE)  # its time sizes what is left (and is counted in base_eval, not here)
            plan["sft_seconds"] = self.cfg.sft_fraction * self._training_seconds()
        t0 = time.perf_counter()
        trainer = self._sft_trainer(Stage.SFT, steps=plan.get("sft_resized_steps", plan.get("sft_steps")))
        t0 -= trainer.trained_seconds  # after a disconnect the steps taken before it count too
        if sized and "sft_steps" not in plan:  # (resumed: the probe starts where it stopped)
            plan["sft_probe_step_seconds"] = self._probe_sft_steps(trainer)
            plan["sft_steps"] = max(trainer.step, math.floor(plan["sft_seconds"] / plan["sft_probe_step_seconds"]))
            self._save()
            trainer.set_steps(plan["sft_steps"])
        if sized and "sft_resized_steps" not in plan:
            self._resize(Stage.SFT, trainer, seconds=plan["sft_seconds"])
        trainer.train(progress=self.progress)
        trainer.save(self.out / Stage.SFT / "final")
        self.holds = Stage.SFT
        if trainer.step_seconds:  # the control's schedule until its own probe has run
            plan["sft_step_seconds"] = statistics.median(trainer.step_seconds)
        return self.finish(Stage.SFT, {"steps": trainer.step, "seconds": time.perf_counter() - t0})

    def _probe_sft_steps(self, trainer: SFTTrainer) -> float:
        """SFT's or the control's probe: `SFT_PROBE_STEPS` more steps (a resumed phase starts where it stopped), and
        the median time of those after the first this process ran."""
        trainer.train(progress=self.progress, steps=trainer.step + SFT_PROBE_STEPS)
        return statistics.median(trainer.step_seconds[1:] or trainer.step_seconds)

    def _resize(self, phase: str, trainer: SFTTrainer, *, seconds: float) -> None:
        """A third of the way through its planned steps, SFT (or a control) is sized again: as many steps in all
        as fit what is left of its `seconds` at the median of the later half of the steps timed so far
        (`plan["<phase>_resized_steps"]`, saved, so that a resumed run takes the same): its first steps can run
        slower or faster than the rest, and a count sized from them alone would miss the seconds."""
        plan = self.records["plan"]
        trainer.train(progress=self.progress, steps=max(trainer.step + 1, plan[f"{phase}_steps"] // 3))
        recent = trainer.step_seconds[len(trainer.step_seconds) // 2 :] or [plan[f"{phase}_probe_step_seconds"]]
        left = seconds - trainer.trained_seconds
        plan[f"{phase}_resized_steps"] = trainer.step + max(0, math.floor(left / statistics.median(recent)))
        self._save()
        trainer.set_steps(plan[f"{phase}_resized_steps"])

    def grpo_trainer(self) -> GRPOTrainer:
        """The GRPO trainer, starting from the SFT model (or from its own checkpoint after a disconnect): for a
        dashboard to wrap before `grpo(run=dashboard.run)`."""
        if self.trainer is None:
            self._start_from_sft()
            g = self.cfg.grpo
            weights = g.reward_weights or (DEFAULT_WEIGHTS if self.rewards == list(DEFAULT_REWARDS) else None)
            config = dataclasses.replace(g, output_dir=str(self.out / Stage.GRPO), reward_weights=weights)
            checkpoint = self.out / Stage.GRPO / "checkpoint"
            self.trainer = GRPOTrainer(self.model, self.tokenizer, self.rewards, self.task.prompt_stream(), config,
                                       resume_metrics=checkpoint.exists())
            self._note_sft_base(self.trainer, Stage.GRPO)
            if checkpoint.exists():
                self.trainer.load(checkpoint)
        return self.trainer

    def grpo(self, run: Callable[[int], Any] | None = None) -> dict[str, Any]:
        """GRPO from the SFT model: `grpo.steps` steps, or with a time budget as many as fit its share (sized after the
        first steps, stopped once its share is spent, and given more steps once if they ran faster than the probe's: a
        step's time varies by a fifth or more from one batch to the next). `run(total_steps)` trains (default: the
        trainer's `train`; notebook 08 passes the dashboard's `run`)."""
        if record := self.done(Stage.GRPO):
            return record
        trainer = self.grpo_trainer()
        run = run or (lambda steps: trainer.train(steps=steps, progress=self.progress))
        # after a disconnect the steps already taken count too, in the phase's seconds as in its trained_seconds
        t0 = time.perf_counter() - trainer.trained_seconds
        plan = self.records["plan"]
        if self.cfg.time_budget_minutes and "grpo_steps" not in plan:
            share = 1 + len(self._controls())
            plan["grpo_seconds"] = self._training_seconds() / share
            run(min(PROBE_STEPS, self.cfg.grpo.steps))
            plan["grpo_step_seconds"] = trainer.logger.rows[-1]["step_seconds"]
            self._size_after_probe(Stage.GRPO, seconds=plan["grpo_seconds"], step_seconds=plan["grpo_step_seconds"],
                                   started=t0, step=trainer.step)
        if self.cfg.time_budget_minutes:  # and a deadline: steps slower than the probe's stop at GRPO's share
            trainer.trained_seconds_limit = plan["grpo_seconds"]  # in training time: a pause does not count
        if not self._stopped(trainer):  # a stop pressed during the first steps ends the phase
            run(plan.get("grpo_steps", self.cfg.grpo.steps))
            if self.cfg.time_budget_minutes:
                self._fill_grpo_share(trainer, run)
        trainer.save(self.out / Stage.GRPO / "final")
        self.holds = Stage.GRPO
        # trained_seconds (the sum of its steps' times) sizes the controls: a dashboard pause is not training time
        return self.finish(Stage.GRPO, {"steps": trainer.step, "seconds": time.perf_counter() - t0,
                                     "trained_seconds": trainer.trained_seconds,
                                     "step_seconds": [r["step_seconds"] for r in trainer.logger.rows]})

    def _fill_grpo_share(self, trainer: GRPOTrainer, run: Callable[[int], Any]) -> None:
        """Steps faster than the probe's end GRPO's planned steps before its share is spent: once, as many more as
        fit what is left of the share at the median step so far (`plan["grpo_more_steps"]`, saved, so that a
        resumed run takes the same number; the deadline still holds). Not after a stop or the deadline."""
        plan = self.records["plan"]
        if "grpo_more_steps" not in plan:
            if trainer.step < plan["grpo_steps"] or self._stopped(trainer):
                return
            median = statistics.median(row["step_seconds"] for row in trainer.logger.rows)  # GRPO logs every step
            plan["grpo_more_steps"] = max(0, math.floor((plan["grpo_seconds"] - trainer.trained_seconds) / median))
            self._save()
        if plan["grpo_more_steps"]:
            run(plan["grpo_steps"] + plan["grpo_more_steps"])

    def _stopped(self, trainer: GRPOTrainer) -> bool:
        """Whether the main process's controls ask for a stop."""
        return broadcast(trainer.controls.snapshot()["stop_requested"], self.world)

    def control(self) -> dict[str, Any]:
        """The control: SFT continued from the SFT model on the same demonstrations (a new warm-up and cosine
        schedule) for as many steps as fit the seconds GRPO trained, sized after its first steps (`SFT_PROBE_STEPS`)
        from their median time and again a third of the way in (`_resize`), with the cosine schedule over that many
        (`control_steps` fixes the count)."""
        if record := self.done(Stage.CONTROL):
            return record
        grpo = self._grpo_for("SFT")
        self._start_from_sft()
        t0 = time.perf_counter()
        plan = self.records["plan"]
        if self.cfg.control_steps:
            plan.setdefault("control_steps", self.cfg.control_steps)
        # until the probe has run, a schedule over the steps that fit at the SFT phase's pace
        estimate = max(SFT_PROBE_STEPS, round(grpo["trained_seconds"] / plan.get("sft_step_seconds", math.inf)))
        trainer = self._sft_trainer(Stage.CONTROL, steps=plan.get("control_resized_steps",
                                                             plan.get("control_steps", estimate)))
        t0 -= trainer.trained_seconds  # after a disconnect the steps taken before it count too
        if "control_steps" not in plan:  # probed on its own: its steps need not take SFT's time
            plan["control_probe_step_seconds"] = self._probe_sft_steps(trainer)
            trainer.set_steps(self._size_after_probe(Stage.CONTROL, seconds=grpo["trained_seconds"], started=t0,
                                                     step_seconds=plan["control_probe_step_seconds"],
                                                     step=trainer.step))
        if not self.cfg.control_steps and "control_resized_steps" not in plan:
            self._resize(Stage.CONTROL, trainer, seconds=grpo["trained_seconds"])
        trainer.train(progress=self.progress)
        trainer.save(self.out / Stage.CONTROL / "final")
        self.holds = Stage.CONTROL
        return self.finish(Stage.CONTROL, {"steps": trainer.step, "seconds": time.perf_counter() - t0})

    def rft(self) -> dict[str, Any]:
        """The RFT control (`rft.RFTTrainer`): from the SFT model, GRPO's learning rate (`RunConfig.rft_learning_rate`),
        SFT's warm-up, GRPO's prompts, group size, temperature and length; as many steps as fit the seconds GRPO
        trained, sized after the first steps and again a third of the way in (`_resize`: its steps grow slower as
        more samples are right and each batch holds more of them), with the cosine schedule over that many
        (`rft_steps` fixes the count)."""
        if record := self.done(Stage.RFT):
            return record
        grpo = None if self.cfg.rft_steps else self._grpo_for("RFT")  # fixed steps need no GRPO to size them
        self._start_from_sft()
        t0 = time.perf_counter()
        plan = self.records["plan"]
        if self.cfg.rft_steps:
            plan.setdefault("rft_steps", self.cfg.rft_steps)
        config = rft_config(
            self.cfg, output_dir=str(self.out / Stage.RFT),
            steps=plan.get("rft_resized_steps") or plan.get("rft_steps") or max(PROBE_STEPS, grpo["steps"]))
        checkpoint = self.out / Stage.RFT / "checkpoint"
        trainer = RFTTrainer(
            self.model, self.tokenizer, self.task.prompt_stream(), config, resume_metrics=checkpoint.exists()
        )
        self._note_sft_base(trainer, Stage.RFT)
        if checkpoint.exists():
            trainer.load(checkpoint)
        t0 -= trainer.trained_seconds  # after a disconnect the steps taken before it count too
        if "rft_steps" not in plan:
            trainer.train(progress=self.progress, steps=max(PROBE_STEPS, trainer.step + 1))  # resumed: one step timed
            plan["rft_probe_step_seconds"] = trainer.step_seconds[-1]
            trainer.set_steps(self._size_after_probe(Stage.RFT, seconds=grpo["trained_seconds"], started=t0,
                                                     step_seconds=plan["rft_probe_step_seconds"], step=trainer.step))
        if not self.cfg.rft_steps and "rft_resized_steps" not in plan:
            self._resize(Stage.RFT, trainer, seconds=grpo["trained_seconds"])
        trainer.train(progress=self.progress)
        trainer.save(self.out / Stage.RFT / "final")
        self.holds = Stage.RFT
        rows = trainer.logger.rows
        return self.finish(Stage.RFT, {"steps": trainer.step, "seconds": time.perf_counter() - t0,
                                    "accepted": sum(r.get("accepted", 0) for r in rows),
                                    "sampled_accuracy": [r.get("sampled_accuracy") for r in rows]})

    def _grpo_for(self, control: str) -> dict[str, Any]:
        """GRPO's record, which sizes `control`: it trains for as long as GRPO trained (`trained_seconds`; a record
        written before the kit kept it has only the phase's wall-clock `seconds`)."""
        grpo = self.done(Stage.GRPO)
        if grpo is None:
            raise RuntimeError(f"the {control} control runs for as long as GRPO did: run grpo() first")
        return {"trained_seconds": grpo["seconds"], **grpo}

    def _size_after_probe(self, phase: str, *, seconds: float, step_seconds: float, started: float, step: int) -> int:
        """After a phase's first steps (its probe): as many steps in all as fit `seconds` from `started` at
        `step_seconds` each; recorded in the plan (`<phase>_probe_seconds`, `<phase>_steps`) and saved."""
        plan = self.records["plan"]
        plan[f"{phase}_probe_seconds"] = time.perf_counter() - started
        plan[f"{phase}_steps"] = step + max(0, math.floor((seconds - plan[f"{phase}_probe_seconds"]) / step_seconds))
        self._save()
        return plan[f"{phase}_steps"]

    def _sft_trainer(self, phase: str, *, steps: int | None) -> SFTTrainer:
        config = dataclasses.replace(self.cfg.sft, output_dir=str(self.out / phase), steps=steps or self.cfg.sft.steps)
        checkpoint = self.out / phase / "checkpoint"
        trainer = SFTTrainer(
            self.model, self.tokenizer, self.task.demonstrations(), config, resume_metrics=checkpoint.exists()
        )
        if phase != Stage.SFT:
            self._note_sft_base(trainer, phase)
        if checkpoint.exists():
            trainer.load(checkpoint)
        return trainer

    def _note_sft_base(self, trainer: Any, phase: str) -> None:
        """With LoRA a phase after SFT trains an adapter over the merged SFT model: its checkpoints say so
        (`adapter_over`, with this arc's directory), so that loading one over the preset's bare model is refused
        (`checkpoint.refuse_arc_adapter`) instead of giving a model without its SFT."""
        if is_lora(self.model):
            trainer.checkpoint_notes.update(adapter_over="sft", arc=str(self.out.resolve()), phase=phase)

    def export(self, stage: str = Stage.GRPO, out_dir: str | Path | None = None, *, notes: str = "",
               score: dict[str, Any] | None = None) -> Path:
        """The model after `stage` as a plain transformers directory (LoRA merged; `export.export_model`) in
        `out_dir` (default `output_dir/export-<stage>`), its model card carrying this run's accuracies, `notes`
        (e.g. a score's RESULTS.md) and, from `score` (a score.json's contents), a model-index."""
        from ..eval.export import export_model

        self.hold(stage)
        if out_dir is None:
            out_dir = self.run_dir.add(f"export-{stage}")
        metrics = {f"{s}_accuracy": r["accuracy"] for s in Stage if (r := self.done(f"{s}_eval"))}
        return export_model(self.model, self.tokenizer, out_dir, base_name=self.cfg.model.name, notes=notes,
                            score=score, metrics={**metrics, "test_size": len(self.test), "task": self.cfg.task.kind})

    def run(self) -> dict[str, Any]:
        """Every phase in order, then the summary."""
        self.evaluate(Stage.BASE)
        self.sft()
        self.evaluate(Stage.SFT)
        self.grpo()
        self.evaluate(Stage.GRPO)
        for control in self._controls():
            getattr(self, control)()
            self.evaluate(control)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """`summary.json`: accuracy and format rate after each stage, seconds per phase, steps; and the plots."""
        phases, cfg = self.records["phases"], self.cfg
        summary: dict[str, Any] = {"model": cfg.model.name, "task": cfg.task.kind, "device": str(self.device),
                                   "test_size": len(self.test), "max_new_tokens": cfg.grpo.max_new_tokens,
                                   "time_budget_minutes": cfg.time_budget_minutes}
        for stage in Stage:
            if record := phases.get(f"{stage}_eval"):
                summary[f"{stage}_accuracy"] = record["accuracy"]
                summary[f"{stage}_format_rate"] = record["format_rate"]
                summary.update({f"{stage}_{k}": v for k, v in record.items() if k.startswith(("pass@", "maj@"))})
        summary["format_rate"] = summary.get("grpo_format_rate")
        if "grpo_accuracy" in summary and "sft_accuracy" in summary:
            summary["grpo_gain_points"] = 100 * (summary["grpo_accuracy"] - summary["sft_accuracy"])
        for phase in Stage.trained():
            if record := phases.get(phase):
                summary[f"{phase}_steps"] = record["steps"]
        pairs = ((Stage.SFT, Stage.GRPO), (Stage.CONTROL, Stage.GRPO), (Stage.SFT, Stage.CONTROL),
                 (Stage.RFT, Stage.GRPO), (Stage.SFT, Stage.RFT))
        summary["paired"] = {f"{a} → {b}": _paired(phases[f"{a}_eval"]["correct"], phases[f"{b}_eval"]["correct"])
                             for a, b in pairs if f"{a}_eval" in phases and f"{b}_eval" in phases}
        summary["phase_seconds"] = {"load": self.records["load"]["seconds"],
                                    **{name: record["seconds"] for name, record in phases.items()}}
        summary.update({f"{name}_seconds": s for name, s in summary["phase_seconds"].items()})
        summary["wall_seconds"] = sum(summary["phase_seconds"].values())
        summary["plan"] = self.records["plan"]
        if record := phases.get("grpo_eval"):
            summary["samples_after_grpo"] = record["samples"]
        if not self.world.is_main:
            return summary
        rows = read_jsonl(self.out / Stage.GRPO / "metrics.jsonl")
        if rows:
            plot_rewards(rows, self.out / "reward_curve.png")
            plot_kl(rows, self.out / "kl.png")
            plot_advantage_histograms(rows, self.out / "advantage_histograms.png")
        plot_accuracy(summary, self.out / "accuracy.png")
        plot_sharpening(summary, self.out / "sharpening.png")
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _take(mine: dict[str, Any], main: dict[str, Any]) -> None:
    """Make `mine` equal to `main`, nested dicts updated in place."""
    for key in set(mine) - set(main):
        del mine[key]
    for key, value in main.items():
        if isinstance(value, dict) and isinstance(mine.get(key), dict):
            _take(mine[key], value)
        else:
            mine[key] = value


def _paired(first: list[bool], second: list[bool]) -> dict[str, int]:
    """Problem by problem: how many the second model solves that the first did not (`fixed`), the reverse
    (`broken`), and both (`both`). A difference in accuracy is fixed − broken over the number of problems."""
    return {"fixed": sum(b and not a for a, b in zip(first, second, strict=True)),
            "broken": sum(a and not b for a, b in zip(first, second, strict=True)),
            "both": sum(a and b for a, b in zip(first, second, strict=True))}


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """The first setting that differs ("grpo.steps was 60, is 80 now"), a key missing on one side read as None;
    None when there is none."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if changed := _first_difference(old.get(key), new.get(key), f"{where}.{key}" if where else key):
                return changed
        return None
    return None if old == new else f"{where} was {old!r}, is {new!r} now"


def run_demo(cfg: RunConfig | None = None, device: str | None = None, progress: bool = True, *,
             resume: bool = True) -> dict[str, Any]:
    """Run the whole arc and write `summary.json`, progress.json, each phase's metrics and checkpoints, and PNG
    plots to `cfg.output_dir` (see `Arc`)."""
    return Arc(cfg or RunConfig(), device, progress=progress, resume=resume).run()
