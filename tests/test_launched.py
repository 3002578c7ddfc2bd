"""A run in processes of its own, steered from the notebook: the controls file (`FileControls` writes it, the run's
main process follows it), and a `Dashboard` over a `LaunchedRun` of two torchrun processes whose slider and stop
button act on the run."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from grpo_kit.course.dashboard import Dashboard
from grpo_kit.course.launched import LaunchedRun
from grpo_kit.train.config import GRPOConfig, load_run_config
from grpo_kit.train.controls import Controls, FileControls, controls_path


def _pair(tmp_path, token: str = "run-1") -> tuple[FileControls, Controls, object]:
    cfg = GRPOConfig(beta=0.04, temperature=1.0)
    path = controls_path(tmp_path)
    return FileControls.from_config(cfg).bind(path, token), Controls.from_config(cfg), path


def test_the_run_follows_the_file_its_token_names(tmp_path, monkeypatch):
    writer, run, path = _pair(tmp_path)
    monkeypatch.setenv("GRPO_KIT_CONTROLS_TOKEN", "run-1")
    assert not run.follow_file(path)  # nothing changed yet
    writer.update(beta=0.3, reward_weights={"correctness_reward": 0.5})
    assert run.follow_file(path)
    snap = run.snapshot()
    assert snap["beta"] == 0.3 and snap["reward_weights"]["correctness_reward"] == 0.5
    assert not run.follow_file(path)  # the same file again: nothing to do
    writer.update(paused=True)
    assert run.follow_file(path) and run.snapshot()["paused"]
    writer.update(paused=False, save_requested=True)
    assert run.follow_file(path) and run.consume_save_request() and not run.snapshot()["paused"]
    writer.update(temperature=0.7)  # the file still counts one save request: not applied twice
    assert run.follow_file(path) and not run.consume_save_request() and run.snapshot()["temperature"] == 0.7


def test_another_runs_file_and_a_bad_file_change_nothing(tmp_path, monkeypatch):
    writer, run, path = _pair(tmp_path, token="an-earlier-run")
    writer.update(stop_requested=True)
    monkeypatch.setenv("GRPO_KIT_CONTROLS_TOKEN", "this-run")
    assert not run.follow_file(path) and not run.snapshot()["stop_requested"]
    monkeypatch.delenv("GRPO_KIT_CONTROLS_TOKEN")
    assert not run.follow_file(path, token=None)  # a run launched without a token follows no file
    path.write_text(json.dumps({"token": "this-run", "settings": {"beta": -1.0}}))
    with pytest.warns(UserWarning, match="not applied") as caught:
        assert not run.follow_file(path, token="this-run")
    assert "\n" not in str(caught[0].message) and run.snapshot()["beta"] == 0.04
    path.write_text("{half a fi")
    with pytest.warns(UserWarning, match="not applied"):
        assert not run.follow_file(path, token="this-run")
    assert not list(path.parent.glob(".*.tmp"))  # FileControls leaves no staging file behind


def test_a_launched_run_checks_its_split(tmp_path):
    cfg = load_run_config("cpu-tiny-quick")
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
        LaunchedRun(dataclasses.replace(cfg, output_dir=str(tmp_path)), processes=3)
    run = LaunchedRun(dataclasses.replace(cfg, output_dir=str(tmp_path)), processes=2, init_from="ckpt")
    command = run.command()
    assert command[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=2" in command
    assert command[command.index("--init-from") + 1] == "ckpt"
    with pytest.raises(ValueError, match="trains to its config's grpo.steps"):
        run.train(steps=cfg.grpo.steps + 1)


@pytest.mark.xdist_group("torchrun")
def test_a_dashboard_steers_two_torchrun_processes(tmp_path, monkeypatch):
    """The slider moved after the first row reaches the run at one step and stays; stop ends it early; the rows are
    the two processes' gathered batch, written by rank 0 alone."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GRPO_KIT_DEVICE", "cpu")
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    for name in [k for k in os.environ if k.startswith(("PJRT_", "XLA_", "CPU_NUM_DEVICES"))]:
        monkeypatch.delenv(name)
    base = load_run_config("cpu-tiny-quick")
    grpo = dataclasses.replace(base.grpo, steps=40, prompts_per_step=4, group_size=4, micro_batch_size=8, beta=0.04,
                               max_new_tokens=16, log_completions=2, save_every=0)
    cfg = dataclasses.replace(base, grpo=grpo, task=dataclasses.replace(base.task, num_test=4),
                              output_dir=str(tmp_path / "run"))
    run = LaunchedRun(cfg, processes=2)
    dash = Dashboard(run, redraw_seconds=0.0, max_plot_fraction=1.0)
    moved_after, stopped_after = [], []
    shown = dash.on_step

    def on_step(trainer, row):
        shown(trainer, row)
        if not moved_after:
            dash.move(beta=0.2)
            moved_after.append(row["step"])
        elif row["beta"] == 0.2 and not stopped_after:
            dash.stop()
            stopped_after.append(row["step"])

    dash.on_step = on_step
    rows = dash.run()
    betas = [r["beta"] for r in rows]
    first = betas.index(0.2)
    assert set(betas[:first]) == {0.04} and set(betas[first:]) == {0.2}, betas
    assert rows[first]["step"] > moved_after[0]
    # stopped early; how many steps past the row the stop was pressed on depends on how far the run is ahead of the
    # dashboard's look at its metrics file (every POLL_SECONDS), not on the controls
    assert stopped_after[0] <= rows[-1]["step"] < 40
    assert {r["processes"] for r in rows} == {2}
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert "stopped" in dash.status.value and run.process.returncode == 0
    assert (tmp_path / "run" / "checkpoint").is_dir()
