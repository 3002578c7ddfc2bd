"""The bridge to TRL: `trl_grpo_settings` names our GRPOConfig in trl.GRPOConfig's words, and notebook 05's TRL cell
trains the tiny Gemma with trl.GRPOTrainer for two steps on the course's rewards (run here, in a process where
transformers is not bound to torch_xla, as on a GPU or CPU runtime with TRL installed)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grpo_kit.train.config import TRL_GRPO_NAMES, GRPOConfig, trl_grpo_settings

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_named_for_trl_is_a_field_of_trls_grpo_config_with_our_value():
    trl = pytest.importorskip("trl", reason="TRL is the bench's comparison (extra `bench`)")
    cfg = GRPOConfig(prompts_per_step=8, group_size=4, micro_batch_size=32, reward_weights={"correctness_reward": 2.0},
                     advantage="batch")
    settings = trl_grpo_settings(cfg, ["correctness_reward", "strict_format_reward"])
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(settings) <= fields, set(settings) - fields
    assert settings["num_generations"] == 4 and settings["per_device_train_batch_size"] == 32
    assert settings["scale_rewards"] == "batch" and settings["reward_weights"] == [2.0, 1.0]
    assert all(settings[trl_name] == getattr(cfg, ours) for ours, trl_name in TRL_GRPO_NAMES.items())
    with pytest.raises(ValueError, match="advantage='mad' has no TRL counterpart"):
        trl_grpo_settings(dataclasses.replace(cfg, advantage="mad"), [])


SCRIPT = r"""
import json, sys, types
import nbformat
import grpo_kit as gk
from grpo_kit import notebook as nbk
from grpo_kit.data.rewards import DEFAULT_REWARDS
from grpo_kit.data.tasks import ArithmeticTask
from grpo_kit.engine.models import load_model
from grpo_kit.engine.model_config import ModelConfig
import torch

cells = nbformat.read(sys.argv[1], as_version=4).cells
(cell,) = [c.source for c in cells if "gk.trl_grpo_settings(" in c.source]
model, tokenizer = load_model(ModelConfig(), torch.device("cpu"))
cfg = nbk.load_run_config("cpu-tiny")
grpo_cfg = nbk.course_grpo_config(cfg, output_dir=sys.argv[2])
namespace = {"model": model, "tokenizer": tokenizer, "task": ArithmeticTask(), "grpo_cfg": grpo_cfg,
             "rewards": list(DEFAULT_REWARDS), "mode": types.SimpleNamespace(tiny=True), "nbk": nbk}
exec(cell, namespace)
trainer = namespace["trl_trainer"]
print(json.dumps({"steps": trainer.state.global_step,
                  "rewards": [log["reward"] for log in trainer.state.log_history if "reward" in log]}))
"""


@pytest.mark.slow
def test_notebook_05s_trl_cell_trains_the_tiny_gemma_two_steps_with_trls_trainer(tmp_path):
    pytest.importorskip("trl", reason="TRL is the bench's comparison (extra `bench`)")
    env = {**os.environ, "USE_TORCH_XLA": "0", "GRPO_KIT_QUICK": "1", "GRPO_KIT_RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "notebooks" / "05_grpo_training.ipynb"),
                           str(tmp_path / "grpo")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == 2 and len(result["rewards"]) == 2, result
    assert "skipped" not in done.stdout


def test_the_trl_cell_is_in_notebook_05_and_skips_with_a_note_where_trl_cannot_train():
    cells = nbformat.read(ROOT / "notebooks" / "05_grpo_training.ipynb", as_version=4).cells
    (cell,) = [c.source for c in cells if "gk.trl_grpo_settings(" in c.source]
    assert 'find_spec("trl") is None' in cell and "is_torch_xla_available()" in cell and "skipped" in cell
