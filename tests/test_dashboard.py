"""The dashboard's state: points per step, controls reaching the trainer, markers, pause/stop, redraw budget."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

import pytest

import grpo_kit.course.dashboard as dashboard_module
from grpo_kit.course.dashboard import Dashboard, completions_html, control_changes, draw
from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
from grpo_kit.train.config import GRPOConfig
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.train.metrics import series

SMALL = dict(prompts_per_step=4, group_size=4, max_new_tokens=24, micro_batch_size=8, warmup_steps=1, log_completions=2)


@pytest.fixture()
def dashboard(tiny, task):
    model, tok = tiny
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=None, reward_weights=DEFAULT_WEIGHTS))
    return Dashboard(trainer, redraw_seconds=0.0, max_plot_fraction=1.0)



def wait_until(condition: Callable[[], object], timeout: float = 300.0) -> None:
    """Poll `condition` until it holds; fail (instead of hanging the suite) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout:.0f} s"
        time.sleep(0.02)

def test_after_n_steps_the_plots_hold_n_points(dashboard):
    dashboard.start(steps=3).wait(timeout=600)
    assert [r["step"] for r in dashboard.rows] == [1, 2, 3]
    fig = draw(dashboard.rows)
    reward_ax = fig.axes[0]
    assert len(reward_ax.lines[0].get_xdata()) == 3
    assert dashboard.redraws >= 1 and dashboard.image.value[:4] == b"\x89PNG"
    assert "finished at step 3" in dashboard.status.value
    assert "<table>" in dashboard.browser.value


def test_a_slider_change_reaches_the_trainer_at_the_next_step_and_is_marked(dashboard):
    trainer = dashboard.trainer
    dashboard.on_step(trainer, trainer.train_step())
    dashboard.sliders["beta"].value = 0.2
    dashboard.sliders["temperature"].value = 0.5
    dashboard.weight_sliders["strict_format_reward"].value = 0.5
    dashboard.on_step(trainer, trainer.train_step())
    first, second = dashboard.rows
    assert first["beta"] == 0.0 and second["beta"] == pytest.approx(0.2)
    assert second["temperature"] == pytest.approx(0.5)
    assert second["reward_weights"]["strict_format_reward"] == pytest.approx(0.5)
    assert second["controls_version"] > first["controls_version"]
    (step, what), = control_changes(dashboard.rows)
    assert step == 2 and "beta 0→0.2" in what and "reward weights" in what
    assert series(dashboard.rows, "beta") == ([1, 2], [0.0, pytest.approx(0.2)])


def test_stop_and_pause_buttons_act_on_the_running_thread(dashboard, monkeypatch):
    """Step counters and events, no wall clock: pause is seen to hold the loop in its paused wait between two
    steps, and stop, pressed while paused, ends the run without another step."""
    import threading

    controls, held = dashboard.controls, threading.Event()
    real_wait = controls.wait_while_paused

    def wait_while_paused(*args, **kwargs):
        if controls.snapshot()["paused"]:
            held.set()  # the loop reached the pause between steps and is about to block in it
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(controls, "wait_while_paused", wait_while_paused)
    dashboard.start(steps=200)
    wait_until(lambda: dashboard.rows)
    dashboard.buttons["pause"].click()
    assert held.wait(300), "the loop never reached its paused wait"
    paused_at = len(dashboard.rows)
    assert dashboard.running and paused_at < 200
    dashboard.buttons["stop"].click()
    dashboard.wait(timeout=120)
    assert not dashboard.running and len(dashboard.rows) == paused_at  # no step ran after the pause took hold


def test_redraws_keep_within_the_plot_budget(dashboard):
    dashboard.max_plot_fraction = 0.05
    dashboard.redraw_seconds = 0.0
    trainer = dashboard.trainer
    start = time.perf_counter()
    for _ in range(4):
        dashboard.on_step(trainer, trainer.train_step())
    elapsed = time.perf_counter() - start
    # after a draw costing c, the next waits c / 5 % of wall time: plotting stays within 5 % plus the last draw
    assert dashboard.redraws >= 1
    assert dashboard.plot_seconds <= 0.05 * elapsed + dashboard._last_cost + 1e-3


def test_completions_html_escapes_and_lists_every_reward():
    row = {"step": 7, "completions": [{"prompt": "1+1<", "completion": "<answer>2</answer>",
                                       "rewards": {"a": 1.0, "b": None}, "reward": 1.0, "advantage": 0.5}]}
    out = completions_html(row)
    assert "1+1&lt;" in out and "&lt;answer&gt;2&lt;/answer&gt;" in out and "+0.50" in out and "–" in out


def test_xla_and_memory_panels_appear_when_the_rows_carry_them():
    rows = [{"step": s, "reward_mean": 1.0, "xla_compiles_step": 8 if s == 1 else 0, "step_seconds": 2.0,
             "memory_bytes_in_use": 3 * 2**30, "memory_peak_bytes": 4 * 2**30, "memory_host_peak_bytes": 2**30}
            for s in (1, 2, 3)]
    titles = {ax.get_title().split("\n")[0]: ax for ax in draw(rows).axes}
    assert list(titles["XLA"].lines[0].get_ydata()) == [8, 0, 0]
    memory = {line.get_label(): list(line.get_ydata()) for line in titles["memory"].lines}
    assert memory == {"bytes_in_use": [3.0] * 3, "peak_bytes": [4.0] * 3, "host_peak_bytes": [1.0] * 3}
    assert "memory" not in {ax.get_title().split("\n")[0] for ax in draw([{"step": 1, "reward_mean": 1.0}]).axes}


class ScriptedBrowser:
    """Stands in for the browser: the foreground loop's event pump, which acts out `script[k]` on its k-th call.

    The real pump (jupyter_ui_poll) lets the kernel run the widget message handlers between steps; this one
    runs the same handlers (slider values, button clicks) at the same place, so the loop's own logic is what
    is tested here. tests/browser drives the real thing."""

    def __init__(self, monkeypatch, script):
        self.calls, self.script, self.steps_seen = 0, script, []

        @contextlib.contextmanager
        def events():
            yield self.pump

        monkeypatch.setattr(dashboard_module, "_widget_events", events)

    def pump(self):
        self.calls += 1
        action = self.script.get(self.calls)
        if action is not None:
            action()


def test_run_trains_in_the_foreground_and_draws_at_the_first_step(dashboard):
    dashboard.redraw_seconds, dashboard.max_plot_fraction = 2.0, 0.1  # the defaults
    dashboard.run(steps=1)
    assert dashboard.redraws == 2  # the first step's draw, then the closing one
    rows = dashboard.run(steps=3)
    assert [r["step"] for r in rows] == [1, 2, 3] and dashboard.trainer.step == 3
    assert dashboard.redraws >= 2 and dashboard.image.value[:4] == b"\x89PNG"  # step 1, then the final redraw
    assert "finished at step 3" in dashboard.status.value and not dashboard.trainer.is_training
    assert dashboard.run(steps=3) == rows  # already there: nothing more to train


def test_foreground_controls_act_between_steps_pause_holds_and_stop_ends(dashboard, monkeypatch):
    clock = {}
    browser = ScriptedBrowser(monkeypatch, {})
    browser.script = {
        2: lambda: setattr(dashboard.sliders["beta"], "value", 0.3),  # before step 2
        3: lambda: (dashboard.buttons["pause"].click(), clock.setdefault("paused", dashboard.trainer.step)),
        # calls 4..8 happen while paused (one per poll interval): the step count must not move
        8: lambda: (clock.setdefault("still", dashboard.trainer.step), dashboard.buttons["resume"].click()),
        10: lambda: dashboard.buttons["stop"].click(),
    }
    rows = dashboard.run(steps=50)
    betas = [r["beta"] for r in rows]
    assert betas[0] == 0.0 and all(b == pytest.approx(0.3) for b in betas[1:])
    assert clock == {"paused": 2, "still": 2}
    assert len(rows) < 50 and "stopped at step" in dashboard.status.value
    assert control_changes(rows)[0][0] == 2


def test_an_error_inside_a_step_is_shown_raised_and_frees_the_trainer(tiny, task, tmp_path):
    model, tok = tiny
    calls = []

    def flaky_reward(prompts, completions, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise ZeroDivisionError("reward broke")
        return [1.0] * len(completions)

    trainer = GRPOTrainer(model, tok, [flaky_reward], task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=str(tmp_path), save_every=1, reward_on_error="raise"))
    dash = Dashboard(trainer, redraw_seconds=0.0, max_plot_fraction=1.0)
    with pytest.raises(Exception, match="reward broke"):
        dash.run(steps=5)
    assert "stopped by an error after step 1" in dash.status.value and "reward broke" in dash.status.value
    assert trainer.step == 1 and not trainer.is_training
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1  # the failed step logged nothing and saved nothing


def test_an_interrupt_stops_at_the_step_boundary_and_is_raised(dashboard, monkeypatch):
    browser = ScriptedBrowser(monkeypatch, {})
    browser.script = {2: lambda: os.kill(os.getpid(), signal.SIGINT)}
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the test runs as a shell's background job
    with pytest.raises(KeyboardInterrupt, match="stopped cleanly after step"):
        dashboard.run(steps=20)
    assert dashboard.trainer.step == len(dashboard.rows) <= 3 and "interrupted" in dashboard.status.value
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_a_second_loop_on_a_training_trainer_is_refused(dashboard):
    dashboard.start(steps=200)
    try:
        wait_until(lambda: dashboard.trainer.is_training)
        with pytest.raises(RuntimeError, match="another loop"):
            Dashboard(dashboard.trainer)
        with pytest.raises(RuntimeError, match="already training"):
            dashboard.trainer.train(steps=300, progress=False)
        with pytest.raises(RuntimeError, match="already training"):
            dashboard.run(steps=300)
    finally:
        dashboard.stop()
        dashboard.wait(timeout=300)
    assert not dashboard.trainer.is_training
    Dashboard(dashboard.trainer)  # allowed again once the run has ended


def test_a_second_trainer_on_a_model_in_training_is_refused(dashboard, task):
    trainer = dashboard.trainer
    again = GRPOTrainer(trainer.model, trainer.tokenizer, DEFAULT_REWARDS, task.prompt_stream(),
                        GRPOConfig(**SMALL, output_dir=None, reward_weights=DEFAULT_WEIGHTS))  # the cell run again
    dashboard.start(steps=200)
    try:
        wait_until(lambda: trainer.is_training)
        with pytest.raises(RuntimeError, match="already being trained by another GRPOTrainer"):
            Dashboard(again).run(steps=3)
        assert again.step == 0
    finally:
        dashboard.stop()
        dashboard.wait(timeout=300)
    assert again.train_step()["step"] == 1  # free once the first loop has ended


def test_background_mode_is_refused_in_colab(dashboard, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", object())
    with pytest.raises(RuntimeError, match="Colab.*dash.run"):
        dashboard.start(steps=2)


def test_experiment_moves_the_slider_between_two_runs(dashboard):
    before, after = dashboard.experiment({"temperature": 0.3, "strict_format_reward": 0.0}, steps=2)
    assert [r["step"] for r in before] == [1, 2] and [r["step"] for r in after] == [3, 4]
    assert dashboard.sliders["temperature"].value == pytest.approx(0.3)
    assert all(r["temperature"] == pytest.approx(GRPOConfig().temperature) != 0.3 for r in before)
    assert all(
        r["temperature"] == pytest.approx(0.3) and r["reward_weights"]["strict_format_reward"] == 0.0 for r in after)
    with pytest.raises(ValueError, match="no control named 'bogus'"):
        dashboard.experiment({"bogus": 1.0}, steps=0)


def _notebook_trainer(tiny, task, monkeypatch, extra_rewards: tuple = (), **changes):
    """Notebook 05's trainer under CI's quick mode: the course's settings and controls, a fourth reward at weight 0
    (the notebook's thorough_reward; here the step-arithmetic one); 4 prompts × 4 a step and no warm-up (the recorded
    learning rate is then the control's) to keep it fast. `extra_rewards` come last, at weight 1."""
    import dataclasses

    from grpo_kit import notebook as nbk
    from grpo_kit.data.rewards import arithmetic_steps_reward

    monkeypatch.setenv("GRPO_KIT_QUICK", "1")
    model, tok = tiny
    cfg = nbk.course_grpo_config(nbk.load_run_config("cpu-tiny"), output_dir="unused")
    cfg = dataclasses.replace(cfg, output_dir=None, log_completions=0, prompts_per_step=4, group_size=4,
                              micro_batch_size=16, warmup_steps=1,
                              reward_weights={**cfg.reward_weights, "arithmetic_steps_reward": 0.0}, **changes)
    rewards = [*DEFAULT_REWARDS, arithmetic_steps_reward, *extra_rewards]
    return GRPOTrainer(model, tok, rewards, task.prompt_stream(), cfg)


def _html_text(widget) -> str:
    """The text of every HTML widget inside `widget`."""
    own = widget.value if type(widget).__name__ == "HTML" else ""
    return own + "".join(_html_text(child) for child in getattr(widget, "children", ()))


def test_every_slider_shown_under_the_notebooks_settings_reaches_the_next_row(tiny, task, monkeypatch):
    """Notebook 05 trains one pass per batch: ε cannot act there, so no ε slider is shown (a note says why, and
    moving it is refused with the reason); every slider that is shown changes the next step's row."""
    dash = Dashboard(_notebook_trainer(tiny, task, monkeypatch), redraw_seconds=0.0)
    assert "epsilon" not in dash.sliders and "ε (clip) is not shown: with one pass" in _html_text(dash.widget)
    with pytest.raises(ValueError, match=r"ε \(clip\) is not among the controls: .*num_iterations = 1"):
        dash.move(epsilon=0.1)
    assert set(dash.sliders) == {"learning_rate", "beta", "temperature", "top_p"}
    dash.run(steps=1)
    for name, slider in [*dash.sliders.items(), *dash.weight_sliders.items()]:
        new = slider.min + 0.37 * (slider.max - slider.min) if name != "learning_rate" else 3.0e-4
        dash.move(**{name: new})
        dash.run(steps=dash.trainer.step + 1)
        row = dash.rows[-1]
        got = row[name] if name in dash.sliders else row["reward_weights"][name]
        assert got == pytest.approx(slider.value, rel=1e-6), (name, got, slider.value)


def test_with_two_passes_the_epsilon_slider_is_shown_and_narrowing_it_clips_more(sft_model, task, monkeypatch):
    """One step from the same weights and the same batch with the slider at 0.5 and at its narrowest, 0.02: the
    policy ratios are the same up to the first clip, so the narrower ε clips a larger share of tokens. A fifth
    reward ranks each group's completions by their place in it, so every group has advantages to clip. (Steps taken
    one after another, as `Dashboard.experiment` takes them, with the course's rewards leave this to chance on the
    warmed-up tiny model: most of its groups score alike, and the share clipped is ≈ 1 % either side.)"""
    model, _ = sft_model
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def place_in_group(prompts, completions, completion_ids, **kw):  # noqa: ANN001, ANN003
        return [float(row % 4) for row in range(len(prompts))]

    rows = []
    for epsilon in (0.5, 0.02):
        model.load_state_dict(start)
        trainer = _notebook_trainer(sft_model, task, monkeypatch, extra_rewards=(place_in_group,), num_iterations=2)
        dash = Dashboard(trainer, redraw_seconds=0.0)
        assert "epsilon" in dash.sliders
        dash.move(epsilon=epsilon)
        dash.run(steps=1)
        rows.append(dash.rows[-1])
    wide, narrow = rows
    assert wide["epsilon"] == pytest.approx(0.5) and narrow["epsilon"] == pytest.approx(0.02)
    assert wide["reward_mean"] == narrow["reward_mean"]  # the same batch
    assert narrow["clip_high"] + narrow["clip_low"] > wide["clip_high"] + wide["clip_low"], (wide, narrow)


def test_length_bias_measures_each_loss_types_push_per_token_on_wrong_answers(sft_model, task, capsys):
    from grpo_kit import notebook as nbk

    model, tok = sft_model
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=None, reward_weights=DEFAULT_WEIGHTS, temperature=1.2))
    probe = task.prompt_stream(seed=99)
    assert nbk.length_bias(trainer, [next(probe) for _ in range(8)])
    said = capsys.readouterr().out
    ratios = {line.split(":")[0].strip(): float(line.rsplit("× ", 1)[1].rstrip(")")) for line in said.splitlines()
              if line.lstrip().startswith(("grpo:", "dapo:", "dr_grpo:"))}
    assert ratios["grpo"] < 1 and ratios["dapo"] == pytest.approx(1) and ratios["dr_grpo"] == pytest.approx(1), said


def test_a_live_setting_declared_once_is_a_control_a_rule_a_slider_and_a_column(tiny, task, monkeypatch):
    """Adding one `LiveSetting` (here the gradient-norm clip) gives the control its start value from the config,
    the config's rule for new values, a slider on the dashboard and a column in every metrics row."""
    from grpo_kit.train import controls as controls_module
    from grpo_kit.train.controls import Controls, LiveSetting
    from grpo_kit.validation import ConfigError

    extra = LiveSetting("max_grad_norm", "grad clip", 0.1, 5.0, 0.1)
    monkeypatch.setitem(controls_module.LIVE_SETTINGS, extra.name, extra)  # the one place
    trainer = _notebook_trainer(tiny, task, monkeypatch, max_grad_norm=1.5)
    assert Controls.from_config(trainer.config).snapshot()["max_grad_norm"] == 1.5
    with pytest.raises(ConfigError, match=r"Controls.max_grad_norm=-1.0: must be > 0"):
        trainer.controls.update(max_grad_norm=-1)
    dash = Dashboard(trainer, redraw_seconds=0.0)
    assert dash.sliders["max_grad_norm"].description == "grad clip" and dash.sliders["max_grad_norm"].value == 1.5
    dash.run(steps=1)
    dash.move(max_grad_norm=2.5)
    dash.run(steps=2)
    assert [r["max_grad_norm"] for r in dash.rows] == [1.5, 2.5]
    assert control_changes(dash.rows) == [(2, "max_grad_norm 1.5→2.5")]
