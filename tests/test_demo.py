import dataclasses
import json
import math
import statistics
import time

import pytest
import torch

from grpo_kit.cli import main
from grpo_kit.course.arc import PROBE_STEPS, SFT_PROBE_STEPS, Arc
from grpo_kit.course.stages import Stage
from grpo_kit.train.config import RunConfig, load_run_config


def test_quick_demo_writes_summary_metrics_and_plots(tmp_path, capsys):
    out = tmp_path / "demo"
    demo = ["demo", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--quiet"]
    assert main(demo) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("base_accuracy", "sft_accuracy", "grpo_accuracy", "format_rate", "sft_seconds", "grpo_seconds",
                "base_eval_seconds", "wall_seconds", "test_size"):
        assert key in summary, key
    assert "control_accuracy" not in summary  # the control is off unless asked for
    assert summary["grpo_steps"] == 6 and summary["sft_steps"] == 40
    rows = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    for name in ("reward_curve.png", "kl.png", "advantage_histograms.png", "accuracy.png", "sharpening.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    printed = json.loads(capsys.readouterr().out)
    assert printed["grpo_accuracy"] == summary["grpo_accuracy"]
    # running again continues: every phase is already recorded, so nothing trains and the numbers stay
    assert main(demo) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["grpo_accuracy"] == summary["grpo_accuracy"] and again["phase_seconds"] == summary["phase_seconds"]
    # other settings in the same directory are refused, naming the setting; --overwrite starts over
    assert main([*demo, "--config", str(_yaml(tmp_path))]) == 2
    assert "grpo.learning_rate was 0.0001, is 0.0003 now" in capsys.readouterr().err
    assert main([*demo, "--config", str(_yaml(tmp_path)), "--overwrite"]) == 0


def test_rft_trains_at_grpos_rate_and_an_arc_at_another_rate_is_refused_naming_the_setting(tmp_path):
    """RFT learns from the model's own samples as GRPO does, and at SFT's rate it threw the tiny Gemma off its SFT
    start (RunConfig.rft_learning_rate): by default it trains at GRPO's rate, recorded as a number. An arc recorded
    at another rate continues only at that rate, and is refused at another, naming the setting."""
    cfg = _tiny(tmp_path / "arc", rft_control=True)
    assert Arc(cfg, "cpu", progress=False).cfg.rft_learning_rate == cfg.grpo.learning_rate == 1e-4
    assert Arc(cfg, "cpu", progress=False).records["settings"]["rft_learning_rate"] == 1e-4  # the rate, as a number
    at_sfts = dataclasses.replace(cfg, rft_learning_rate=cfg.sft.learning_rate, output_dir=str(tmp_path / "at-sfts"))
    assert Arc(at_sfts, "cpu", progress=False).cfg.rft_learning_rate == 1e-3
    with pytest.raises(ValueError, match="rft_learning_rate was 0.001, is 0.0001 now"):
        Arc(dataclasses.replace(cfg, output_dir=at_sfts.output_dir), "cpu", progress=False)
    assert Arc.from_dir(tmp_path / "at-sfts", "cpu").cfg.rft_learning_rate == 1e-3  # read back as it trained


def _yaml(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text("grpo: {learning_rate: 3e-4}\n")
    return path


def _tiny(out, **changes) -> RunConfig:
    cfg = load_run_config("cpu-tiny-quick")
    task = dataclasses.replace(cfg.task, num_test=16)
    return dataclasses.replace(cfg, output_dir=str(out), task=task, **changes)


def _control_steps_sized_from(plan, trained_seconds):
    """The control's steps: its probe's, then as many as fit the rest of GRPO's trained seconds at its probe's
    median step."""
    after_probe = trained_seconds - plan["control_probe_seconds"]
    return SFT_PROBE_STEPS + max(0, math.floor(after_probe / plan["control_probe_step_seconds"]))


def _resized(plan, rows, phase, seconds, probe_steps=SFT_PROBE_STEPS):
    """SFT's, the control's or RFT's steps sized again a third of the way through its planned ones (at least one
    step after its probe): as many in all as fit what is left of `seconds` at the median of the later half of the
    steps timed so far."""
    resized_at = max(probe_steps + 1, plan[f"{phase}_steps"] // 3)
    timed = [r["step_seconds"] for r in rows if r["step"] <= resized_at]
    recent = statistics.median(timed[len(timed) // 2 :])
    return resized_at + max(0, math.floor((seconds - sum(timed)) / recent))


def test_time_budget_sizes_each_phase_from_measured_times_and_the_controls_match_grpo(tmp_path):
    cfg = _tiny(tmp_path / "arc", time_budget_minutes=1.0, control=True, rft_control=True, sft_fraction=0.4,
                eval_pass_k=2)
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, steps=1000),
                              sft=dataclasses.replace(cfg.sft, steps=1000, log_every=1))
    arc = Arc(cfg, "cpu", progress=False)
    summary = arc.run()
    plan, phases = summary["plan"], arc.records["phases"]
    # SFT got its share of what the budget left after loading, the base evaluation and four evaluations to come
    # (each counted as 1 + k greedy ones: pass@k's samples have not been timed yet)
    base_eval = phases["base_eval"]
    left = 60 - arc.records["load"]["seconds"] - base_eval["seconds"] - 4 * 3 * base_eval["greedy_seconds"]
    assert plan["sft_seconds"] == pytest.approx(0.4 * left)
    # its step count from the median of its probe's steps after the first
    sft_rows = _rows(tmp_path / "arc" / "sft" / "sft_metrics.jsonl")
    probe = [r["step_seconds"] for r in sft_rows if 2 <= r["step"] <= SFT_PROBE_STEPS]
    assert plan["sft_probe_step_seconds"] == pytest.approx(statistics.median(probe))
    assert plan["sft_steps"] == max(SFT_PROBE_STEPS, math.floor(plan["sft_seconds"] / plan["sft_probe_step_seconds"]))
    # and again a third of the way in, from the later half of the steps so far
    assert plan["sft_resized_steps"] == _resized(plan, sft_rows, "sft", plan["sft_seconds"]) == summary["sft_steps"]
    assert plan["sft_step_seconds"] > 0  # the median SFT step
    assert summary["sft_steps"] < 1000 and summary["grpo_steps"] < 1000  # the budget, not the step settings, ended them
    # GRPO: a third of what was left (each control gets as much), in steps of the measured length, and stopped at
    # that third if its steps grow slower (by at most one step past it)
    # (or, if its planned steps ran faster than the probe's, once more as many as fit what was left)
    planned = plan["grpo_steps"] + plan.get("grpo_more_steps", 0)
    assert 2 <= summary["grpo_steps"] <= planned
    assert summary["grpo_seconds"] <= plan["grpo_seconds"] + max(phases["grpo"]["step_seconds"]) + 5  # + the save
    assert summary["grpo_steps"] == planned or phases["grpo"]["trained_seconds"] >= plan["grpo_seconds"]
    grpo_seconds_after_probe = plan["grpo_seconds"] - plan["grpo_probe_seconds"]
    assert plan["grpo_steps"] == 2 + max(0, math.floor(grpo_seconds_after_probe / plan["grpo_step_seconds"]))
    assert plan["grpo_step_seconds"] == phases["grpo"]["step_seconds"][1]
    # the control: SFT steps for the seconds GRPO trained, sized after its probe at its own steps' median
    trained = phases["grpo"]["trained_seconds"]
    assert trained == pytest.approx(sum(phases["grpo"]["step_seconds"])) and trained <= summary["grpo_seconds"]
    assert plan["control_steps"] == _control_steps_sized_from(plan, trained)
    # and, as SFT, again a third of the way in, so that it trains for about as long as GRPO did
    control_rows = _rows(tmp_path / "arc" / "control" / "sft_metrics.jsonl")
    assert plan["control_resized_steps"] == _resized(plan, control_rows, "control", trained) == summary["control_steps"]
    # RFT: as many steps as fit the seconds GRPO trained at its own probed step time, and again a third of the way in
    # (its steps grow slower as more samples are right)
    rft_seconds_after_probe = trained - plan["rft_probe_seconds"]
    assert plan["rft_steps"] == 2 + max(0, math.floor(rft_seconds_after_probe / plan["rft_probe_step_seconds"]))
    rft_rows = _rows(tmp_path / "arc" / "rft" / "rft_metrics.jsonl")
    resized = _resized(plan, rft_rows, "rft", trained, PROBE_STEPS)
    assert plan["rft_resized_steps"] == resized == summary["rft_steps"] >= 2
    assert [r["step"] for r in rft_rows] == list(range(1, summary["rft_steps"] + 1))
    assert all(0 <= r["sampled_accuracy"] <= 1 and r["accepted"] <= 4 * 4 for r in rft_rows)
    assert phases["rft"]["accepted"] == sum(r["accepted"] for r in rft_rows)
    # at GRPO's learning rate (SFT's is ten times it here): in the warm-up both controls share, its first step's
    # rate is the control's times GRPO's over SFT's
    assert cfg.sft.warmup_steps > 1 and cfg.grpo.learning_rate / cfg.sft.learning_rate == pytest.approx(0.1)
    assert rft_rows[0]["learning_rate"] == pytest.approx(control_rows[0]["learning_rate"] * 0.1)
    for stage in ("base", "sft", "grpo", "control", "rft"):
        assert 0 <= summary[f"{stage}_accuracy"] <= 1 and summary[f"{stage}_format_rate"] is not None
    for stage in ("sft", "grpo", "control", "rft"):  # the sampled scores, k = 2
        assert 0 <= summary[f"{stage}_pass@1"] <= summary[f"{stage}_pass@2"] <= 1
        assert 0 <= summary[f"{stage}_maj@2"] <= 1
    assert {"rft → grpo", "sft → rft"} <= set(summary["paired"])
    assert summary["test_size"] == 16 and set(summary["phase_seconds"]) == {
        "load", "base_eval", "sft", "sft_eval", "grpo", "grpo_eval", "control", "control_eval", "rft", "rft_eval"}


def test_without_an_sft_fraction_sft_runs_its_steps_and_the_budget_sizes_grpo_and_the_control(tmp_path):
    cfg = _tiny(tmp_path / "arc", time_budget_minutes=0.5, control=True, sft_fraction=None)
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, steps=1000),
                              sft=dataclasses.replace(cfg.sft, steps=12, log_every=1))
    arc = Arc(cfg, "cpu", progress=False)
    summary = arc.run()
    plan, phases = summary["plan"], arc.records["phases"]
    # SFT: its 12 steps, neither probed nor re-sized
    assert summary["sft_steps"] == 12 and not {"sft_seconds", "sft_steps", "sft_resized_steps"} & set(plan)
    assert [r["step"] for r in _rows(tmp_path / "arc" / "sft" / "sft_metrics.jsonl")] == list(range(1, 13))
    # GRPO: half of what the budget left after SFT and its evaluation, with two evaluations to come
    spent = arc.records["load"]["seconds"] + sum(phases[p]["seconds"] for p in ("base_eval", "sft", "sft_eval"))
    assert plan["grpo_seconds"] == pytest.approx((30 - spent - 2 * phases["sft_eval"]["greedy_seconds"]) / 2)
    assert summary["grpo_steps"] < 1000 and "control_resized_steps" in plan  # sized by the budget


def _budgeted_arc_with_grpo_sized_to(grpo_steps, tmp_path, monkeypatch):
    """The tiny arc on a 30-second budget with a control, run whole, its GRPO phase sized to `grpo_steps` after
    the probe whatever the probe measured (`grpo.steps` 1000, so that the setting does not bind)."""
    cfg = _tiny(tmp_path / "arc", time_budget_minutes=0.5, control=True, sft_fraction=0.4)
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, steps=1000))
    sized = Arc._size_after_probe

    def resized(self, phase, **kwargs):  # noqa: ANN001, ANN003, ANN202
        steps = sized(self, phase, **kwargs)
        if phase == "grpo":
            steps = self.records["plan"]["grpo_steps"] = grpo_steps
        return steps

    monkeypatch.setattr(Arc, "_size_after_probe", resized)
    arc = Arc(cfg, "cpu", progress=False)
    return cfg, arc, arc.run()


def test_a_time_budgeted_grpo_phase_stops_when_its_share_is_spent(tmp_path, monkeypatch):
    """GRPO's steps are sized from its probe; steps that then run slower than the probe's stop at its share of
    the budget instead of overrunning it (by at most the step that crosses it), and the control gets the seconds
    GRPO took. Stood in for by sizing GRPO to 1,000 steps after the probe."""
    cfg, arc, summary = _budgeted_arc_with_grpo_sized_to(1000, tmp_path, monkeypatch)
    plan, grpo = summary["plan"], arc.records["phases"]["grpo"]
    assert plan["grpo_steps"] == 1000 and 2 < summary["grpo_steps"] < 1000
    # its seconds also count saving the final weights (well under 5 s for the tiny model)
    assert plan["grpo_seconds"] < summary["grpo_seconds"] <= plan["grpo_seconds"] + max(grpo["step_seconds"]) + 5
    assert plan["control_steps"] == _control_steps_sized_from(plan, grpo["trained_seconds"])
    assert cfg.grpo.max_seconds is None and arc.trainer.config.max_seconds is None  # not a setting: the trainer's
    assert plan["grpo_seconds"] <= arc.trainer.trained_seconds <= plan["grpo_seconds"] + max(grpo["step_seconds"])


def test_a_time_budgeted_grpo_phase_sized_too_short_takes_more_steps_to_fill_its_share(tmp_path, monkeypatch):
    """Steps that run faster than the probe's end GRPO's planned steps before its share is spent: it takes once as
    many more as fit what is left at its median step. Stood in for by sizing GRPO to 3 steps after the probe."""
    cfg, arc, summary = _budgeted_arc_with_grpo_sized_to(3, tmp_path, monkeypatch)
    plan, grpo = summary["plan"], arc.records["phases"]["grpo"]
    three = sum(grpo["step_seconds"][:3])
    assert three < plan["grpo_seconds"] / 2  # three steps leave most of the share
    median = sorted(grpo["step_seconds"][:3])[1]
    assert plan["grpo_more_steps"] == math.floor((plan["grpo_seconds"] - three) / median) > 0
    assert summary["grpo_steps"] == 3 + plan["grpo_more_steps"] or grpo["trained_seconds"] >= plan["grpo_seconds"]
    assert grpo["trained_seconds"] > plan["grpo_seconds"] / 2
    assert plan["control_steps"] == _control_steps_sized_from(plan, grpo["trained_seconds"])
    again = Arc(cfg, "cpu", progress=False).grpo()  # recorded: a new process takes the same steps
    assert again["steps"] == summary["grpo_steps"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def length_reward(prompts, completions, **_):
    return [float(len(c[0]["content"])) for c in completions]  # TRL's conversational form


def test_lora_arc_resumed_in_a_new_process_holds_the_same_weights_and_grpo_references_the_sft_model(tmp_path):
    cfg = _tiny(tmp_path / "arc")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=True, lora_r=4),
                              sft=dataclasses.replace(cfg.sft, steps=6, learning_rate=5e-3),
                              grpo=dataclasses.replace(cfg.grpo, steps=2, learning_rate=5e-3))
    ids = torch.tensor([[2, 10, 11, 12, 13, 14]])
    arc = Arc(cfg, "cpu", progress=False, rewards=[length_reward])  # rewards that always differ within a group
    arc.evaluate("base")
    arc.sft()
    sft_logits = _logits(arc.model, ids)
    trainer = arc.grpo_trainer()
    with trainer.reference.model() as reference:  # the adapter switched off: the SFT model, not the base
        assert torch.allclose(_logits(reference, ids), sft_logits, atol=1e-5)
    assert torch.allclose(_logits(arc.model, ids), sft_logits, atol=1e-5)  # a fresh adapter changes nothing yet
    arc.grpo()
    grpo_logits = _logits(arc.model, ids)
    assert not torch.allclose(grpo_logits, sft_logits, atol=1e-4)
    arc.evaluate("grpo")

    again = Arc(cfg, "cpu", progress=False)  # as after a disconnect: a new process, the same directory
    assert again.done("grpo")["steps"] == 2 and again.done("base_eval") == arc.done("base_eval")
    again.hold("grpo")
    assert torch.allclose(_logits(again.model, ids), grpo_logits, atol=1e-5)
    again.control()  # starts from the SFT model again, not from GRPO's
    fresh = Arc(cfg, "cpu", progress=False)
    fresh.hold("control")
    assert torch.allclose(_logits(fresh.model, ids), _logits(again.model, ids), atol=1e-5)


def test_an_interrupted_grpo_phase_continues_from_its_checkpoint(tmp_path):
    cfg = _tiny(tmp_path / "arc")
    cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=4),
                              grpo=dataclasses.replace(cfg.grpo, steps=4))
    arc = Arc(cfg, "cpu", progress=False, rewards=[length_reward])
    arc.sft()
    trainer = arc.grpo_trainer()
    trainer.train(steps=2, progress=False)
    trainer.save(tmp_path / "arc" / "grpo" / "checkpoint")  # what save_every_seconds leaves behind
    whole = Arc(dataclasses.replace(cfg, output_dir=str(tmp_path / "whole")), "cpu", progress=False,
                rewards=[length_reward])
    whole.sft()
    whole.grpo()

    resumed = Arc(cfg, "cpu", progress=False, rewards=[length_reward])  # a new process after the disconnect
    assert resumed.grpo_trainer().step == 2
    record = resumed.grpo()
    assert record["steps"] == 4
    rows = [json.loads(line) for line in (tmp_path / "arc" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the seconds the controls are sized from count the steps taken before the disconnect too
    assert record["seconds"] >= record["trained_seconds"] == pytest.approx(sum(r["step_seconds"] for r in rows))
    assert rows[-1]["grad_norm"] > 0
    expected = dict(whole.model.named_parameters())
    for name, p in resumed.model.named_parameters():
        assert torch.allclose(p, expected[name], atol=1e-6), name


def test_the_controls_train_for_the_seconds_grpo_trained_not_for_a_pause(tmp_path):
    """A pause during GRPO (notebook 08's dashboard holds the run between steps) is not training time: the controls
    are sized from the seconds GRPO's steps took, not from the phase's wall clock. Stood in for by a `run` that
    sleeps before it trains."""
    cfg = _tiny(tmp_path / "arc", control=True, rft_control=True)
    cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=4),
                              grpo=dataclasses.replace(cfg.grpo, steps=3))
    arc = Arc(cfg, "cpu", progress=False)
    arc.sft()

    def paused_then_trains(steps):  # noqa: ANN001, ANN202
        time.sleep(3.0)
        return arc.trainer.train(steps=steps, progress=False)

    grpo = arc.grpo(run=paused_then_trains)
    assert grpo["seconds"] > grpo["trained_seconds"] + 3.0 and grpo["trained_seconds"] < 3.0
    plan = arc.records["plan"]
    assert arc.control()["steps"] == plan["control_resized_steps"]
    assert plan["control_steps"] == _control_steps_sized_from(plan, grpo["trained_seconds"])
    arc.rft()  # sized after its probe from the same seconds
    assert plan["rft_steps"] == 2 + max(
        0, math.floor((grpo["trained_seconds"] - plan["rft_probe_seconds"]) / plan["rft_probe_step_seconds"]))
    del arc.records["phases"]["grpo"]["trained_seconds"]  # as a kit that did not keep it recorded GRPO
    assert arc._grpo_for("SFT")["trained_seconds"] == grpo["seconds"]


class _Disconnect(Exception):
    """What the test raises in place of a dropped runtime."""


@pytest.mark.parametrize("phase", ["sft", "grpo", "control", "rft"])
def test_a_resumed_phase_records_the_seconds_trained_before_the_disconnect(tmp_path, monkeypatch, phase):
    """A phase's seconds (what the time budget has spent; GRPO's size the controls) count the steps taken before a
    disconnect, from its checkpoint, not only those of the process that finished it. The steps before the
    disconnect are made to count 500 s each, so a phase that restarted its clock records far less."""
    from grpo_kit.train.loop import TrainingLoop

    cfg = _tiny(tmp_path / "arc", control=True, rft_control=True, control_steps=4, rft_steps=4)
    cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=4, save_every_seconds=1e-9),
                              grpo=dataclasses.replace(cfg.grpo, steps=4, save_every_seconds=1e-9))
    arc = Arc(cfg, "cpu", progress=False, rewards=[length_reward])
    for earlier in list(Stage)[1 : list(Stage).index(phase)]:  # the phases before it, finished
        getattr(arc, earlier)()
    counted = TrainingLoop._count_step_seconds

    def slow_then_gone(self, seconds):  # steps 1 and 2 are saved; the runtime drops in step 3
        if self.step > 2:
            raise _Disconnect
        counted(self, seconds + 500.0)

    monkeypatch.setattr(TrainingLoop, "_count_step_seconds", slow_then_gone)
    with pytest.raises(_Disconnect):
        getattr(arc, phase)()
    monkeypatch.setattr(TrainingLoop, "_count_step_seconds", counted)

    record = getattr(Arc(cfg, "cpu", progress=False, rewards=[length_reward]), phase)()  # a new process
    assert record["steps"] == 4
    assert 1000.0 < record["seconds"] < 1000.0 + 300.0


def test_demo_settings_are_validated():
    from grpo_kit.validation import ConfigError

    for bad, match in (({"sft_fraction": 1.0}, "sft_fraction"), ({"time_budget_minutes": 0}, "time_budget_minutes"),
                       ({"eval_pass_k": -1}, "eval_pass_k")):
        with pytest.raises(ConfigError, match=match):
            RunConfig(**bad)


def test_a_task_without_worked_solutions_skips_sft_and_its_control_and_trains_grpo_from_the_base(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _tiny(tmp_path / "arc", control=True)
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, kind="file", source=str(data),
                                                            prompt_column="question", num_test=8))
    arc = Arc(cfg, "cpu", progress=False)
    assert not arc.has_solutions and arc._controls() == ()
    before = {n: p.detach().clone() for n, p in arc.model.named_parameters()}
    summary = arc.run()
    assert arc.done("sft")["skipped"] and summary["sft_steps"] == 0 and summary["grpo_steps"] == 6
    assert arc.done("sft_eval")["same_as"] == "base" and "control_accuracy" not in summary
    again = Arc(cfg, "cpu", progress=False)  # a new process: the "SFT model" it starts GRPO from is the base model
    again.hold("sft")
    assert all(torch.equal(p, before[n]) for n, p in again.model.named_parameters())


def test_an_arc_recorded_before_a_setting_existed_resumes_and_a_changed_setting_is_named(tmp_path):
    """A run recorded by an older kit lacks the settings added since (at their default None, they change nothing):
    it resumes. A setting that differs is named, with both values."""
    cfg = _tiny(tmp_path / "arc")
    arc = Arc(cfg, "cpu", progress=False)
    arc.evaluate("base")
    path = tmp_path / "arc" / "progress.json"
    records = json.loads(path.read_text())
    del records["settings"]["control_steps"], records["settings"]["rft_steps"]  # as an older kit wrote them
    path.write_text(json.dumps(records))
    assert Arc(cfg, "cpu", progress=False).done("base_eval")
    assert Arc.from_dir(tmp_path / "arc").cfg.grpo == cfg.grpo
    changed = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, steps=cfg.grpo.steps + 1))
    with pytest.raises(ValueError, match=rf"grpo.steps was {cfg.grpo.steps}, is {cfg.grpo.steps + 1} now"):
        Arc(changed, "cpu", progress=False)
