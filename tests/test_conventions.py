"""The conventions users bring from TRL and the Hub: rewards called as TRL's GRPOTrainer calls them (conversational
completions, trainer_state, log_metric, log_extra), `answer_type="math"` through math-verify, `report_to` trackers fed
from the metrics rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from grpo_kit.data.rewards import DEFAULT_REWARDS, RewardState, compute_rewards, correctness_reward, test_reward
from grpo_kit.train.config import GRPOConfig, RunConfig, SFTConfig
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.validation import ConfigError


# Copied verbatim from TRL's GRPOTrainer documentation ("Example 2: Reward completions with a specific format").
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def _config(**kwargs) -> GRPOConfig:
    return GRPOConfig(**{**dict(prompts_per_step=4, group_size=4, max_new_tokens=16, micro_batch_size=16,
                                output_dir=None, log_kl=False, seed=0), **kwargs})


def test_a_reward_from_trls_docs_trains_unchanged(tiny, task):
    """The docs' conversational reward reads completion[0]["content"]: it fails on plain strings, so two steps that
    log its mean show it got TRL's format; TRL's own think_format_reward too, where TRL is installed."""
    model, tok = tiny
    rewards = [*DEFAULT_REWARDS, format_reward_func]
    try:
        from trl.rewards import think_format_reward

        rewards.append(think_format_reward)
    except ImportError:
        pass
    trainer = GRPOTrainer(model, tok, rewards, task.prompt_stream(), _config())
    rows = trainer.train(steps=2, progress=False)
    assert len(rows) == 2 and all("rewards/format_reward_func/mean" in r for r in rows)
    if len(rewards) == 5:
        assert all("rewards/think_format_reward/mean" in r for r in rows)


def test_rewards_get_trainer_state_log_metric_and_log_extra_as_trl_passes_them(tiny, task):
    """trainer_state.global_step is the step being scored; log_metric's values reach the metrics row (averaged over
    the step's calls) and the dashboard's panel; log_extra's column rides with the logged completions."""
    from grpo_kit.course.dashboard import draw

    model, tok = tiny
    seen = []

    def length_reward(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
        seen.append((trainer_state.global_step, trainer_state.max_steps, type(completions[0]).__name__))
        lengths = [len(c[0]["content"]) for c in completions]
        log_metric("mean_length", sum(lengths) / len(lengths))
        log_metric("mean_length", 0.0)
        log_extra("length", lengths)
        return [0.0] * len(completions)

    trainer = GRPOTrainer(model, tok, [*DEFAULT_REWARDS, length_reward], task.prompt_stream(), _config(steps=7))
    rows = trainer.train(steps=2, progress=False)
    assert seen == [(0, 7, "list"), (1, 7, "list")]
    for row in rows:
        lengths = [len(c["completion"]) for c in row["completions"]]
        assert [c["extra"]["length"] for c in row["completions"]] == lengths
        assert row["logged/mean_length"] > 0 and row["logged/mean_length"] < max(lengths)  # (mean + 0) / 2
    figure = draw(rows)
    assert any("logged by your rewards" in ax.get_title() for ax in figure.axes)


def test_a_reward_is_given_only_the_keywords_it_takes_and_positional_names_still_work():
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}]] * 2
    texts = ["<reasoning>2+2=4</reasoning><answer>4</answer>", "<answer>5</answer>"]

    def strict(prompts, completions, answer):  # no **kwargs: trainer_state and the rest are left out
        return [float(c[0]["content"].endswith(f"<answer>{a}</answer>")) for c, a in zip(completions, answer,
                                                                                           strict=True)]

    result = compute_rewards([strict, lambda p, c, **kw: [len(c[0][0]["content"]) * 0.0] * len(c)], prompts, texts,
                             {"answer": ["4", "4"]}, state=RewardState(global_step=3, max_steps=9))
    assert result.per_function[0].tolist() == [1.0, 0.0] and result.per_function[1].tolist() == [0.0, 0.0]
    plain = compute_rewards([lambda prompts, completions, **kw: [float(isinstance(c, str)) for c in completions]],
                            ["What is 2 + 2?"] * 2, texts)
    assert plain.per_function[0].tolist() == [1.0, 1.0]  # text prompts: plain text completions, as in TRL


def test_test_reward_calls_a_reward_as_the_trainer_does(capsys):
    rows = test_reward(format_reward_func, [
        {"completion": "<think>2+2=4</think><answer>4</answer>", "expected": 1.0},
        {"completion": "<answer>4</answer>", "expected": 0.0}])
    assert [r["ok"] for r in rows] == [True, True] and "2 of 2 cases as expected" in capsys.readouterr().out


# ---- answer_type="math" -------------------------------------------------------------------------------------------
def test_math_answers_compare_as_math_verify_reads_them_within_the_tolerance():
    pytest.importorskip("math_verify")
    from grpo_kit.data.answer_format import answer_matches

    assert answer_matches("2/3", "\\frac{2}{3}", "math") and answer_matches("\\frac{2}{3}", "2/3", "math")
    assert answer_matches("0.666…", "\\frac{2}{3}", "math", abs_tol=1e-3)  # 0.666 within 0.001 of 2/3
    assert not answer_matches("0.666…", "\\frac{2}{3}", "math")  # not within the default 1e-6
    assert answer_matches("0.6667", "2/3", "math", rel_tol=1e-3)
    assert answer_matches("x^2+2x+1", "(x+1)^2", "math") and answer_matches("\\sqrt{2}", "2^{1/2}", "math")
    assert answer_matches("\\boxed{\\frac{1}{2}}", "0.5", "math")
    assert not answer_matches("3", "\\frac{2}{3}", "math") and not answer_matches("banana", "2/3", "math")
    assert not answer_matches(None, "2/3", "math")


def test_math_answers_through_the_task_the_reward_and_grpo_kit_score(tmp_path, capsys):
    pytest.importorskip("math_verify")
    from grpo_kit.cli import main
    from grpo_kit.data.tasks import load_task

    rows = [{"prompt": f"What is {i} divided by {i + 1}?", "answer": f"\\frac{{{i}}}{{{i + 1}}}"} for i in range(1, 9)]
    path = tmp_path / "fractions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(path, answer_type="math", num_test=4)
    assert {r["answer_type"] for r in task.test_set()} == {"math"}
    completions = ["<reasoning>.</reasoning><answer>1/2</answer>", "<answer>0.5</answer>", "<answer>2/1</answer>"]
    assert correctness_reward(None, completions, answer=["\\frac{1}{2}"] * 3, answer_type=["math"] * 3) == [
        1.0, 1.0, 0.0]
    out = tmp_path / "score"
    assert main(["score", "--task", str(path), "--model", "tiny-gemma", "--answer-type", "math", "--num-test", "4",
                 "--output-dir", str(out)]) == 0
    score = json.loads((out / "score.json").read_text())
    assert score["n"] == 4 and len(score["items"]) == 4 and 0.0 <= score["accuracy"] <= 100.0
    assert "answer_type=" not in capsys.readouterr().err


def test_math_without_math_verify_says_what_to_install(monkeypatch):
    import builtins

    from grpo_kit.data.answer_format import answer_matches

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name.startswith("math_verify") else real(name, *a, **k))
    with pytest.raises(ValueError, match=r"^answer_type 'math' needs math-verify: pip install 'grpo-kit\[math\]'$"):
        answer_matches("1/2", "0.5", "math")


# ---- report_to ------------------------------------------------------------------------------------------------
def test_report_to_takes_trls_names_and_refuses_others():
    assert GRPOConfig(report_to="tensorboard").report_to == ("tensorboard",)
    assert SFTConfig(report_to=["trackio", "wandb"]).report_to == ("trackio", "wandb")
    assert GRPOConfig().report_to == () and RunConfig().report_to is None
    with pytest.raises(ConfigError, match=r"^GRPOConfig.report_to=\('mlflow',\): must be a list of any of trackio, "):
        GRPOConfig(report_to=["mlflow"])


def test_tensorboard_gets_every_number_of_the_metrics_rows(tiny, task, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from grpo_kit.train.metrics import read_jsonl
    from grpo_kit.train.trackers import scalars

    model, tok = tiny
    out = tmp_path / "grpo"
    GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(),
                _config(output_dir=str(out), report_to=["tensorboard"])).train(steps=3, progress=False)
    rows = read_jsonl(out / "metrics.jsonl")
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert list(out.glob("tensorboard/events.out.tfevents.*"))
    for key in ("reward_mean", "rewards/correctness_reward/mean", "policy_loss", "step_seconds"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows], key
    assert set(events.Tags()["scalars"]) == set(scalars(rows[-1]))


TRACKER_RUN = textwrap.dedent("""
    import json, sys
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.train.config import GRPOConfig
    from grpo_kit.train.grpo import GRPOTrainer
    from grpo_kit.engine.models import load_model
    from grpo_kit.data.rewards import DEFAULT_REWARDS
    from grpo_kit.data.tasks import ArithmeticTask
    import torch
    tracker, out = sys.argv[1], sys.argv[2]
    model, tok = load_model(ModelConfig(), torch.device("cpu"))
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=16, micro_batch_size=16, output_dir=out,
                     log_kl=False, report_to=[tracker])
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, ArithmeticTask().prompt_stream(), cfg)
    rows = trainer.train(steps=2, progress=False)
    print(json.dumps([{k: r[k] for k in ("step", "reward_mean", "policy_loss")} for r in rows]))
    if tracker == "wandb":  # what the W&B run holds now (its offline file is read back only by W&B's own core)
        run = trainer.logger.forward.__self__.writers[0].run
        print("summary", json.dumps({k: run.summary[k] for k in ("_step", "reward_mean", "policy_loss")}))
""")


@pytest.mark.parametrize("tracker", ["trackio", "wandb"])
def test_trackio_and_wandb_get_the_metrics_rows_offline(tmp_path, tracker):
    """In their own processes, offline (TRACKIO_DIR, WANDB_MODE=offline): what each stored equals the rows."""
    pytest.importorskip(tracker)
    out = tmp_path / "grpo"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACKIO_DIR": str(tmp_path / "trackio"), "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    done = subprocess.run([sys.executable, "-c", TRACKER_RUN, tracker, str(out)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("[")))
    if tracker == "trackio":
        read = ("from trackio.sqlite_storage import SQLiteStorage; import json, sys; "
                "print(json.dumps(SQLiteStorage.get_logs('grpo_kit', sys.argv[1])))")
        back = subprocess.run([sys.executable, "-c", read, str(out)], capture_output=True, text=True, env=env,
                              timeout=300)
        logs = json.loads(next(line for line in back.stdout.splitlines() if line.startswith("[")))
        assert [(log["step"], log["reward_mean"], log["policy_loss"]) for log in logs] == [
            (r["step"], pytest.approx(r["reward_mean"]), pytest.approx(r["policy_loss"])) for r in rows]
    else:
        last = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("summary "))[8:])
        assert last == {"_step": rows[-1]["step"], "reward_mean": pytest.approx(rows[-1]["reward_mean"]),
                        "policy_loss": pytest.approx(rows[-1]["policy_loss"])}
        assert list(out.glob("wandb/offline-run-*/run-*.wandb"))  # in the output directory, recorded as the kit's


def test_the_arcs_report_to_reaches_every_phase(tmp_path):
    """RunConfig.report_to sets each phase's trackers; its SFT phase writes its own event files."""
    pytest.importorskip("tensorboard")
    import dataclasses

    from grpo_kit.course.arc import Arc
    from grpo_kit.train.config import load_run_config

    cfg = dataclasses.replace(load_run_config("cpu-tiny-quick"), output_dir=str(tmp_path / "arc"),
                              report_to=("tensorboard",))
    arc = Arc(cfg, "cpu", progress=False)
    assert arc.cfg.sft.report_to == arc.cfg.grpo.report_to == ("tensorboard",)
    arc.sft()
    assert list((tmp_path / "arc" / "sft" / "tensorboard").glob("events.out.tfevents.*"))
