"""The scaling model (`grpo_kit.eval.scaling`): boards of N devices, what splitting the batch shortens and what it
does not, the calibration `tools/scaling.py` uses, and the generated tables of docs/scaling.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_kit.eval.planner import PlanInput, accelerator
from grpo_kit.eval.scaling import SPEEDS, Speeds, flops_per_token, matmul_params, predict, speeds_for
from tools import scaling as tool


def test_boards_of_n_devices():
    assert (accelerator("t4-x2").devices, accelerator("t4-x2").gib_per_device, accelerator("t4-x2").bf16) == (2, 15.0,
                                                                                                             False)
    slice16 = accelerator("v5e-16")
    assert (slice16.devices, slice16.gib_per_device, slice16.tpu, slice16.name) == (16, 16.0, True, "TPU v5e-16")
    assert accelerator("cpu-x8").devices == 8 and not accelerator("cpu-x8").tpu
    assert accelerator("v5e-8") == accelerator("tpu-v5e-8")
    for bad in ("t4-x0", "v9z-8", "v2-16", "cpu-xx"):
        with pytest.raises(ValueError, match="unknown accelerator") as e:
            accelerator(bad)
        assert "\n" not in str(e.value)


def test_splitting_the_batch_shortens_the_update_not_the_weight_bound_rollout():
    one = predict(PlanInput(model="gemma-3-1b-it", tpu="v5e-1"), checkpointing=False)
    eight = predict(PlanInput(model="gemma-3-1b-it", tpu="v5e-8"), checkpointing=False)
    assert one["decode_bound_by"] == eight["decode_bound_by"] == "weight read"
    assert eight["seconds"]["update"] == pytest.approx(one["seconds"]["update"] / 8, rel=1e-3)
    assert eight["seconds"]["decode"] == pytest.approx(one["seconds"]["decode"], rel=0.05)  # only the cache shrinks
    assert one["seconds"]["communication"] == 0 and eight["seconds"]["communication"] > 0
    assert one["bound_by"] == eight["bound_by"] == "rollout"
    s = eight["seconds"]
    assert s["step"] == pytest.approx(s["rollout"] + s["update"] + s["communication"], abs=1e-3)


def test_update_is_the_formula():
    """k · A · rows · tokens / (e_f · F), with k = 2 forward + 2 LoRA backward + 2 reference forward (β > 0)."""
    p = PlanInput(model="tiny-gemma", tpu="v5e-1", prompts_per_step=4, group_size=2, prompt_length=10,
                  max_new_tokens=6, beta=0.04)
    assert flops_per_token(p, checkpointing=False) == 6 * matmul_params("tiny-gemma")
    assert flops_per_token(PlanInput(model="tiny-gemma", lora=False, beta=0.0), checkpointing=True) == \
        8 * matmul_params("tiny-gemma")
    v5e = SPEEDS["v5e"]
    got = predict(p, checkpointing=False)["seconds"]["update"]
    assert got == pytest.approx(6 * matmul_params("tiny-gemma") * 8 * 16 / (v5e.flops * v5e.flops_efficiency),
                                rel=1e-3)


def test_devices_sharing_a_host_share_its_speeds():
    """On one host the update stays as long on N devices and the weight read (here the bound) grows N-fold."""
    host = Speeds(flops=1e11, bandwidth=1e9, link=1e9, decode_overhead_s=0.0, shared_host=True)
    p = PlanInput(model="gemma-3-270m", tpu="cpu", prompts_per_step=2, group_size=2, max_new_tokens=8, beta=0.0)
    one = predict(p, speeds=host, checkpointing=False)
    two = predict(PlanInput(**{**p.__dict__, "tpu": "cpu-x2"}), speeds=host, checkpointing=False)
    assert two["seconds"]["update"] == pytest.approx(one["seconds"]["update"], rel=1e-6)
    assert one["decode_bound_by"] == "weight read"
    assert two["seconds"]["decode"] == pytest.approx(2 * one["seconds"]["decode"], rel=0.01)


def test_full_fine_tuning_over_tpu_devices_gathers_the_weights():
    lora = predict(PlanInput(model="gemma-3-1b-it", tpu="v5e-8"), checkpointing=True)
    full = predict(PlanInput(model="gemma-3-1b-it", tpu="v5e-8", lora=False), checkpointing=True)
    assert full["seconds"]["communication"] > 100 * lora["seconds"]["communication"]


def test_boards_without_published_speeds_say_so():
    assert speeds_for("cpu") is None and speeds_for("v2-8") is None and speeds_for("t4-x2") == SPEEDS["t4"]
    with pytest.raises(ValueError, match="no published speeds for CPU.*speeds="):
        predict(PlanInput(model="tiny-gemma", tpu="cpu"), checkpointing=False)


def test_calibration_reproduces_the_one_device_run():
    """`tools/scaling.calibrate` picks the host's speeds so that the model gives the measured one-device phases."""
    model = tool.MODELS["tiny"]
    one = {"seconds": {"rollout": 2.0, "update": 0.5, "step": 2.6}, "decode_steps": 20.0}
    speeds = tool.calibrate(model, one, bandwidth=5e9, dtype_bytes=4)
    back = predict(tool._plan_input(model, 1, 4), speeds=speeds, completion_tokens=20.0, checkpointing=False)
    assert back["seconds"]["update"] == pytest.approx(0.5, rel=1e-3)
    assert back["seconds"]["rollout"] == pytest.approx(2.0, rel=1e-3)
    assert speeds.decode_overhead_s > 0 and speeds.shared_host


def test_report_tables(tmp_path):
    page = tmp_path / "scaling.md"
    page.write_text("intro\n<!-- scaling:predicted -->\nold\n<!-- /scaling:predicted -->\nmiddle\n"
                    "<!-- scaling:measured -->\n<!-- /scaling:measured -->\nend\n")
    run = {"model": "tiny", "backend": "eager",
           "measured": {1: {"seconds": {"rollout": 2.0, "update": 1.0, "step": 3.1}},
                        2: {"error": "timed out after 5 s"}},
           "predicted": {1: {"seconds": {"rollout": 2.0, "update": 1.0, "step": 3.0}}}}
    tool.write_report({"host": "2 cores", "bandwidth_bytes_per_s": 5e9, "runs": [run]}, page)
    text = page.read_text()
    assert "old" not in text and text.startswith("intro") and text.rstrip().endswith("end")
    for board in ("GPU T4 × 2", "TPU v5e-8", "TPU v5e-16", "TPU v5e-32", "TPU v6e-8"):
        assert f"| {board} |" in text
    assert "| tiny | eager | 1 | step | 3.100 | 3.000 | 1.03 |" in text
    assert "| tiny | eager | 2 | (failed) | timed out after 5 s |" in text
    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="scaling:predicted"):
        tool.write_report(None, tmp_path / "bare.md")


def test_plan_prints_the_prediction():
    done = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "plan", "--model", "gemma-3-1b-it", "--tpu",
                           "v5e-16"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["devices"] == 16 and report["predicted"]["bound_by"] == "rollout"
    cpu = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "plan", "--model", "tiny-gemma", "--tpu", "cpu"],
                         capture_output=True, text=True, check=True)
    assert "predicted" not in json.loads(cpu.stdout)
