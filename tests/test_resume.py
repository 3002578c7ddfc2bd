"""Fault injection: a `grpo-kit train` process killed with SIGKILL at random points of its run (in a step, a save or
a metrics append) and run again, five times over, ends with every step logged exactly once and the same last row
as a run that was never interrupted."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

# timings, memory and compile counts differ between runs; everything the training computes must not
VARYING = ("seconds", "tokens_per_s", "memory_", "xla_")


def _train(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "grpo_kit.cli", "train", "--preset", "cpu-tiny-quick", "--config", str(config),
            "--output-dir", str(out), "--device", "cpu", "--quiet"]


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _computed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(part in k for part in VARYING)}


@pytest.mark.slow
def test_a_run_killed_five_times_resumes_to_the_uninterrupted_result(tmp_path):
    config = tmp_path / "settings.yaml"
    config.write_text("grpo: {steps: 10, save_every: 1, log_completions: 0}\ntask: {num_test: 8}\n")
    subprocess.run(_train(config, tmp_path / "uninterrupted"), check=True, capture_output=True, timeout=600)
    reference = [json.loads(line) for line in (tmp_path / "uninterrupted" / "metrics.jsonl").read_text().splitlines()]

    out, rng, kills = tmp_path / "killed", random.Random(0), []
    metrics = out / "metrics.jsonl"
    for _ in range(5):
        before = _lines(metrics)
        proc = subprocess.Popen(_train(config, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while _lines(metrics) <= before and proc.poll() is None:  # wait for the run to make progress, then kill
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.25))  # somewhere in the next step, save or append
        proc.kill()
        proc.wait()
        kills.append((_lines(metrics), proc.returncode))
    assert all(code == -9 for _, code in kills), f"a run ended before it was killed: {kills}"

    final = subprocess.run(_train(config, out), capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-2000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 11)), (
        f"steps logged: {[r['step'] for r in rows]} after kills {kills}")
    assert _computed(rows[-1]) == _computed(reference[-1])
    assert sorted(p.name for p in out.iterdir()) == [".grpo_kit", "checkpoint", "metrics.jsonl"]  # no leftovers


def test_sft_resumed_from_its_checkpoint_continues_exactly(tiny, task, tmp_path):
    """Batches, learning-rate schedule and optimizer state carry over: three steps, a checkpoint, three more
    give the same losses and weights as six steps in one go."""
    import torch

    from grpo_kit.train.config import SFTConfig
    from grpo_kit.train.sft import SFTTrainer

    model, tok = tiny
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = SFTConfig(steps=6, batch_size=8, warmup_steps=2, log_every=1, save_every=3, output_dir=str(tmp_path / "sft"))
    whole = SFTTrainer(model, tok, task.demonstrations(), cfg)
    rows = whole.train(progress=False)
    final = {k: v.clone() for k, v in model.state_dict().items()}
    assert json.loads((tmp_path / "sft" / "checkpoint" / "state.json").read_text())["step"] == 3  # saved on the way

    model.load_state_dict(start)
    resumed = SFTTrainer(model, tok, task.demonstrations(), cfg, resume_metrics=True)
    resumed.load(tmp_path / "sft" / "checkpoint")
    assert resumed.step == 3 and [r["step"] for r in resumed.logger.rows] == [1, 2, 3]
    # the seconds of the steps before the checkpoint come with it (a resumed phase's time counts them)
    assert resumed.trained_seconds == pytest.approx(sum(r["step_seconds"] for r in rows[:3]))
    rows_resumed = resumed.train(progress=False)
    assert [r["step"] for r in rows_resumed] == list(range(1, 7))
    assert [(r["loss"], r["learning_rate"]) for r in rows_resumed[3:]] == [
        (r["loss"], r["learning_rate"]) for r in rows[3:]]
    for name, tensor in final.items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    with pytest.raises(ValueError, match=r"SFTConfig.batch_size=4: the checkpoint .* was trained with 8"):
        SFTTrainer(model, tok, task.demonstrations(), dataclasses.replace(cfg, batch_size=4)).load(
            tmp_path / "sft" / "checkpoint")


def test_an_ema_reference_is_saved_and_restored(sft_model, task, tmp_path):
    """Under full fine-tuning an EMA reference moves with the policy and cannot be rebuilt from the starting
    weights: the checkpoint carries it, and the resumed run's KL and weights match the uninterrupted run's."""
    import torch

    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from grpo_kit.train.config import GRPOConfig
    from grpo_kit.train.grpo import GRPOTrainer

    model, tok = sft_model
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=24, micro_batch_size=8, warmup_steps=1, beta=0.1,
                     ema_reference=0.5, learning_rate=1e-3, reward_weights=DEFAULT_WEIGHTS,
                     output_dir=str(tmp_path / "g"))
    first = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(), cfg)
    first.train(steps=2, progress=False)
    first.save(tmp_path / "ckpt")
    rows = first.train(steps=4, progress=False)
    reference = {k: v.clone() for k, v in first.reference.frozen.state_dict().items()}
    assert (tmp_path / "ckpt" / "reference.safetensors").exists()
    assert all(r["kl"] > 0 for r in rows[2:]), (
        "the reference must have moved away from the policy for this to test anything")

    model.load_state_dict(start)
    second = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(), cfg, resume_metrics=True)
    second.load(tmp_path / "ckpt")
    resumed = second.train(steps=4, progress=False)
    assert [r["kl"] for r in resumed[2:]] == [r["kl"] for r in rows[2:]]
    assert [r["reward_mean"] for r in resumed[2:]] == [r["reward_mean"] for r in rows[2:]]
    for name, tensor in reference.items():
        assert torch.equal(tensor, second.reference.frozen.state_dict()[name]), name


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_kit.cli", *argv], capture_output=True, text=True, timeout=600)


def test_sft_resumes_on_its_own_and_refuses_to_redo_or_overwrite_a_run(tmp_path):
    """`grpo-kit sft` run again in its output directory: a finished run is refused (exit 2) until its steps are
    raised (it trains on from its checkpoint, metrics contiguous) or --overwrite starts it over; --no-resume is
    refused while the directory holds a run. The Hub token given in the settings appears in no file or output."""
    out, secret = tmp_path / "sft", "hf_SENTINEL_0123456789"
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        f"sft: {{steps: 4, batch_size: 8, log_every: 1}}\nmodel: {{hf_token: {secret}}}\ntask: {{num_test: 4}}\n")
    common = ["sft", "--preset", "cpu-tiny-quick", "--config", str(settings), "--output-dir", str(out), "--device",
              "cpu", "--quiet"]
    outputs = [_cli(*common)]
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-2000:]

    outputs.append(_cli(*common))
    assert outputs[-1].returncode == 2 and "is a finished run (4 of sft.steps=4): raise sft.steps" in outputs[-1].stderr
    outputs.append(_cli(*common, "--no-resume"))
    assert outputs[-1].returncode == 2 and "holds a run already: pass --overwrite" in outputs[-1].stderr

    settings.write_text(settings.read_text().replace("steps: 4", "steps: 6"))
    outputs.append(_cli(*common[:-1]))
    assert outputs[-1].returncode == 0 and "resuming from" in outputs[-1].stderr and "at step 4" in outputs[-1].stderr
    assert json.loads(outputs[-1].stdout)["steps"] == 6
    assert [r["step"] for r in map(json.loads, (out / "sft_metrics.jsonl").read_text().splitlines())] == [1, 2, 3, 4, 5,
                                                                                                          6]

    outputs.append(_cli(*common, "--overwrite"))
    assert outputs[-1].returncode == 0 and json.loads(outputs[-1].stdout)["steps"] == 6
    assert len((out / "sft_metrics.jsonl").read_text().splitlines()) == 6

    written = [p.read_bytes() for p in out.rglob("*") if p.is_file()]
    assert written and not any(secret.encode() in data for data in written)
    assert not any(secret in o.stdout + o.stderr for o in outputs)
