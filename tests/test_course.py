"""The course's hand-off between notebooks when each runs on a machine of its own (Colab, Kaggle): checkpoints
in `runs_dir()`, and a missing one rebuilt — never an untrained model evaluated or exported."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from grpo_kit import notebook as nbk
from grpo_kit.engine.models import load_model

ROOT = Path(__file__).resolve().parents[1]


def test_runs_dir_is_the_setting_else_local_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path / "kept"))
    assert nbk.runs_dir() == tmp_path / "kept"
    monkeypatch.delenv("GRPO_KIT_RUNS_DIR")
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    assert nbk.runs_dir() in (nbk.Path("runs"), nbk.Path("/content/drive/MyDrive/grpo_kit/runs"))


def test_a_missing_checkpoint_is_rebuilt_once_then_loaded(monkeypatch, tmp_path, capsys):
    """06 opened alone: the GRPO checkpoint is rebuilt from an SFT checkpoint that is rebuilt first (each
    announced); the next notebook on this machine loads both; the GRPO weights are trained, not the init."""
    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_KIT_QUICK", "1")
    cfg = nbk.load_run_config("cpu-tiny")
    model, _, path = nbk.course_model("grpo", cfg, torch.device("cpu"))
    said = capsys.readouterr().out
    assert "sft: no checkpoint" in said and "grpo: no checkpoint" in said and "rebuilt and saved" in said
    assert path == tmp_path / "course" / "grpo" / "checkpoint" and path.exists()
    assert (tmp_path / "course" / "sft" / "checkpoint").exists()

    again, _, _ = nbk.course_model("grpo", cfg, torch.device("cpu"))
    assert "grpo: loaded" in capsys.readouterr().out
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    untrained, _ = load_model(cfg.model, torch.device("cpu"))
    assert any(
        not torch.equal(a, b) for a, b in zip(untrained.state_dict().values(), again.state_dict().values(), strict=True)
    )


def test_lora_grpo_stands_on_the_sft_model_and_loads_back_the_same(monkeypatch, tmp_path):
    """Under LoRA, notebook 05's GRPO trains a fresh adapter on the SFT model merged: its reference (the adapter
    off) is the SFT model, not the base model, and loading the GRPO checkpoint rebuilds that same chain."""
    import dataclasses

    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_KIT_QUICK", "1")
    cfg = nbk.load_run_config("cpu-tiny")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=True))
    cpu = torch.device("cpu")
    trained, _, _ = nbk.course_model("grpo", cfg, cpu)  # rebuilds SFT, then GRPO on it
    sft, _, _ = nbk.course_model("sft", cfg, cpu)
    base, _ = load_model(cfg.model, cpu)
    loaded, _, _ = nbk.course_model("grpo", cfg, cpu)
    ids = torch.tensor([[2, 10, 11, 12, 13, 14, 15, 16]])

    def logits(model):
        model.eval()
        with torch.no_grad():
            return model(input_ids=ids).logits

    assert torch.allclose(logits(loaded), logits(trained), atol=1e-5)
    with loaded.disable_adapter():
        reference = logits(loaded)
    assert torch.allclose(reference, logits(sft), atol=1e-5)
    assert not torch.allclose(reference, logits(base), atol=1e-3)  # the SFT adapter was trained, and merged


def test_the_capstone_falls_back_to_270m_but_to_the_tiny_gemma_on_several_virtual_tpu_devices(
    monkeypatch, tmp_path, capsys
):
    """Gemma 3 1B out of reach on a TPU board: Gemma 3 270M from PyPI, unless the board is several XLA CPU devices
    sharing the host's memory (the kaggle-tpu replica), where the tiny Gemma runs the notebook, announced."""
    from grpo_kit.engine import device

    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_KIT_QUICK", raising=False)
    monkeypatch.setattr(device, "detect_accelerator", lambda: "v5e-8")
    monkeypatch.setattr(
        nbk, "model_access", lambda name, token=None: (name != "google/gemma-3-1b-it", "gated on the hub")
    )
    monkeypatch.setattr(device, "virtual_tpu_devices", lambda: 1)
    cfg, preset = nbk.capstone_config()
    assert (preset, cfg.model.name, cfg.task.kind) == ("cpu-gemma-270m", "gemma-3-270m-offline", "word_problems")
    assert "Gemma 3 270M from PyPI on generated word problems instead" in capsys.readouterr().out
    monkeypatch.setattr(device, "virtual_tpu_devices", lambda: 8)
    cfg, preset = nbk.capstone_config()
    assert (preset, cfg.model.name, cfg.control) == ("cpu-tiny", "tiny-gemma", True)
    out = capsys.readouterr().out
    assert "8 XLA CPU devices sharing the host's memory" in out and "the tiny Gemma on arithmetic instead" in out


def test_notebook_09_names_the_users_task_once_not_the_presets(monkeypatch, tmp_path, capsys):
    """Notebook 09 takes notebook 08's model and settings but trains on your data: its settings line names your task,
    and the preset's own task (the generated problems it replaces) is not announced first."""
    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_KIT_QUICK", raising=False)
    monkeypatch.setattr(nbk, "model_access", lambda name, token=None: (True, ""))
    data = nbk.example_task_file()
    columns = {"prompt": "question", "solution": "solution"}
    cfg, preset = nbk.your_task_config(data, columns=columns, preset="cpu-gemma-270m")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"preset cpu-gemma-270m · model {cfg.model.name} · your task "
                                                   f"{data} (file), 40 rows held out · control on (more SFT "
                                                   "for GRPO's seconds) · time budget "), lines
    assert cfg.task.kind == "file" and " task word_problems" not in lines[0]
    assert cfg.grpo.gate_shaped_rewards and not cfg.grpo.difficulty_targeting  # your rows have no level column


def test_a_run_travels_to_the_next_session_as_a_kaggle_dataset_version(tmp_path, monkeypatch, capsys):
    import kagglehub

    from grpo_kit import notebook as nbk
    from grpo_kit.train.rundir import claim

    run = tmp_path / "session1" / "your_task"
    claim(run, "arc").add("progress.json")
    (run / "progress.json").write_text('{"phases": {"sft": {"steps": 7}}}')
    (run / "sft").mkdir()
    (run / "sft" / "weights.safetensors").write_bytes(b"w")
    store = tmp_path / "kaggle-datasets"
    uploads = []

    def dataset_upload(handle, local_dataset_dir, version_notes="", ignore_patterns=None):
        uploads.append((handle, version_notes, ignore_patterns))
        shutil.copytree(local_dataset_dir, store / handle, dirs_exist_ok=True)

    monkeypatch.setattr(kagglehub, "dataset_upload", dataset_upload)
    monkeypatch.setattr(kagglehub, "dataset_download", lambda handle: str(store / handle))
    monkeypatch.setenv("KAGGLE_USERNAME", "me")
    monkeypatch.setenv("KAGGLE_KEY", "kaggle_test_key")
    assert nbk.save_run(run, "me/my-run") == "https://www.kaggle.com/datasets/me/my-run"
    assert uploads[0][0] == "me/my-run" and ".grpo_kit/lock" in uploads[0][2]
    later = tmp_path / "session2" / "your_task"
    nbk.restore_run("me/my-run", later)
    assert (later / "sft" / "weights.safetensors").read_bytes() == b"w" and "steps" in (
        later / "progress.json").read_text()
    (later / "progress.json").write_text("{}")  # this session's own progress: never overwritten by a restore
    nbk.restore_run("me/my-run", later)
    assert (later / "progress.json").read_text() == "{}" and "kept as it is" in capsys.readouterr().out
    with pytest.raises(ValueError, match="is not a grpo-kit run directory"):
        nbk.save_run(tmp_path, "me/other")
    assert nbk.session_budget() == 9 * 60 - 45 and nbk.session_budget(120, reserve_minutes=30) == 90
    with pytest.raises(ValueError, match="nothing left to train"):
        nbk.session_budget(40)


def test_notebook_05s_description_and_estimate_count_the_experiments_and_controls_its_cells_run():
    """describe("05") and its TPU estimate count what the notebook's cells train: each `dash.experiment(...)` call (2 ×
    n steps) and each control (`nbk.course_control`, GRPO's seconds)."""
    import nbformat

    from grpo_kit.course import modes as course

    cells = nbformat.read(ROOT / "notebooks" / "05_grpo_training.ipynb", as_version=4).cells
    source = "\n".join(c.source for c in cells if c.cell_type == "code")
    assert len(re.findall(r"\bdash2?\.experiment\(", source)) == course.GUIDED_EXPERIMENTS
    import ast

    def trains_a_control(node):
        return any(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "course_control" for n in ast.walk(node))

    loops = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.For) and trains_a_control(node)]
    (loop,) = loops  # one loop trains the controls, each named by the first item of its pair
    named = {pair.elts[0].value for pair in loop.iter.elts}
    assert named == set(course.CONTROLS_05), named
    mode = course.CourseMode(preset="tpu-v5e-1-gemma-3-1b", model="Gemma 3 1B-IT", hardware="TPU v5e-1",
                             sft_steps=200, grpo_steps=60, quick=False)
    said = mode.describe("05")
    assert f"{course.GUIDED_EXPERIMENTS} experiments of 2 × 8" in said and "2 controls" in said, said


def test_course_mode_follows_the_model_and_gives_steps_and_minutes_per_mode(monkeypatch, capsys):
    """The tiny Gemma on a CPU, Gemma 3 1B-IT on a TPU: the steps each notebook takes (full, short, quick) and the
    expected minutes — measured for the tiny Gemma, estimated from PRESET_TIMES for 1B, said which."""
    from grpo_kit.course.modes import course_mode
    from grpo_kit.train.config import PRESET_TIMES

    monkeypatch.delenv("GRPO_KIT_QUICK", raising=False)
    tiny = course_mode(nbk.load_run_config("cpu-tiny"), hardware="cpu")
    assert tiny.preset == "cpu-tiny" and "tiny Gemma" in tiny.model
    assert [tiny.steps(k) for k in ("sft", "grpo", "experiment", "test")] == [tiny.sft_steps, tiny.grpo_steps, 8, 200]
    gemma = course_mode(nbk.load_run_config("tpu-v5e-1-gemma-3-1b"), hardware="v5e-1")
    assert (gemma.preset, gemma.model, gemma.hardware) == ("tpu-v5e-1-gemma-3-1b", "Gemma 3 1B-IT", "TPU v5e-1")
    times = PRESET_TIMES["tpu-v5e-1-gemma-3-1b"]
    minutes, basis = gemma.minutes("05")
    # GRPO and two controls for its seconds, 5 experiments of 2 × 8 steps, exercise 05.1's step; four evaluations
    expected = (3 * gemma.grpo_steps + 5 * 2 * 8 + 1) * times["grpo_step_seconds"] + 4 * times["eval_seconds"]
    assert minutes == -(-expected // 60) and basis.startswith("estimate")
    gemma.announce("05")
    said = capsys.readouterr().out
    assert (
        f"{gemma.grpo_steps} GRPO steps" in said and f"≈ {minutes:g} min (estimate" in said and "short version" in said)
    short = course_mode(nbk.load_run_config("tpu-v5e-1-gemma-3-1b"), hardware="v5e-1", short=True)
    assert [short.steps(k) for k in ("grpo", "experiment", "test")] == [12, 3, 48] and short.minutes("05")[
        0] < minutes / 2
    monkeypatch.setenv(
        "GRPO_KIT_QUICK", "1"
    )  # read when the mode is made; the headers ask for full mode whatever it is
    quick = course_mode(nbk.load_run_config("tpu-v5e-1-gemma-3-1b"), hardware="v5e-1")
    assert [quick.steps(k) for k in ("sft", "grpo", "experiment", "test")] == [40, 4, 3, 48]
    assert gemma.minutes("05") == (minutes, basis)
    with pytest.raises(ValueError, match="unknown kind of step 'rl'"):
        gemma.steps("rl")


def test_keep_runs_mounts_drive_on_colab_and_says_which_earlier_checkpoints_are_there(monkeypatch, tmp_path, capsys):
    import sys
    import types

    mounted = []
    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=mounted.append)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "test")
    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_KIT_QUICK", raising=False)
    (tmp_path / "course" / "sft" / "checkpoint").mkdir(parents=True)
    assert nbk.keep_runs(needs=("sft", "grpo")) == tmp_path
    said = capsys.readouterr().out
    assert mounted == ["/content/drive"] and str(tmp_path) in said
    assert "02_sft_warmup's SFT checkpoint: found" in said and "05_grpo_training's GRPO checkpoint: not there" in said
    monkeypatch.setenv("GRPO_KIT_QUICK", "1")  # CI and the replicas never ask for Drive
    nbk.keep_runs()
    assert mounted == ["/content/drive"]
    with pytest.raises(ValueError, match="unknown course stage 'rl'"):
        nbk.keep_runs(needs=("rl",))


def test_a_control_trains_from_the_sft_checkpoint_for_the_seconds_given_and_no_longer(monkeypatch, tmp_path):
    """nbk.course_control: more SFT or RFT from notebook 02's checkpoint (rebuilt here), sized from its own steps'
    pace, stopped once its steps have trained the seconds given (at most one step past them); bad input named."""
    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_KIT_QUICK", "1")
    cfg = nbk.load_run_config("cpu-tiny")
    cpu = torch.device("cpu")
    for kind in ("sft", "rft"):
        model, record = nbk.course_control(kind, cfg, cpu, seconds=3.0)
        # it takes its probe steps unless the seconds run out first (the limit is checked before each step)
        assert record["steps"] >= nbk.CONTROL_PROBE_STEPS or record["seconds"] >= 3.0, (kind, record)
        assert record["steps"] >= 1, (kind, record)
        assert record["seconds"] < 3.0 + 2.0, (kind, record)  # the limit is checked before each step
        sft_model, _, _ = nbk.course_model("sft", cfg, cpu)  # the checkpoint it started from, unchanged
        moved = [not torch.equal(a, b) for a, b in zip(model.parameters(), sft_model.parameters(), strict=True)]
        assert any(moved), f"{kind}: the control's weights are the SFT checkpoint's"
    with pytest.raises(ValueError, match="unknown control 'grpo': one of sft, rft"):
        nbk.course_control("grpo", cfg, cpu, seconds=1.0)
    with pytest.raises(ValueError, match="seconds=0"):
        nbk.course_control("sft", cfg, cpu, seconds=0)
