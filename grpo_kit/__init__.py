"""grpo_kit: learn and run GRPO on Gemma (SFT warm-up, reward design, GRPO) on TPU, GPU or CPU.

The public API, used as ``import grpo_kit as gk``::

    device = gk.get_device()
    model, tokenizer = gk.load_model(gk.ModelConfig(name="gemma-3-270m", lora=True), device)
    task = gk.ArithmeticTask()
    trainer = gk.GRPOTrainer(model, tokenizer, gk.DEFAULT_REWARDS, task.prompt_stream(), gk.GRPOConfig())
    trainer.train()
    gk.evaluate(model, tokenizer, task.test_set())

Names load on first use (PEP 562), so ``import grpo_kit`` stays cheap and the command line can set up
torch_xla's environment before torch_xla is imported. Everything not listed in ``PUBLIC`` is internal.
"""

from __future__ import annotations

import importlib
from typing import Any

from .device import SetupError, torch_xla_mismatch

# public name -> the module that defines it (None: the name is a submodule offered as a namespace)
PUBLIC: dict[str, str | None] = {
    # trainers and their settings
    "GRPOTrainer": "grpo",
    "SFTTrainer": "sft",
    "RFTTrainer": "rft",
    "GRPOConfig": "config",
    "SFTConfig": "config",
    "RFTConfig": "config",
    "ModelConfig": "config",
    "TaskConfig": "config",
    "RunConfig": "config",
    "DemoConfig": "config",
    "Controls": "controls",
    "PRESETS": "config",
    "GRPO_RECIPE": "config",
    "PRESET_TIMES": "config",
    "load_run_config": "config",
    "load_demo_config": "config",
    "Arc": "demo",
    "run_demo": "demo",
    # models and devices
    "load_model": "models",
    "load_tokenizer": "models",
    "add_lora": "models",
    "merge_and_restart_lora": "models",
    "count_parameters": "models",
    "resolve_model": "hub",
    "ModelAccessError": "hub",
    "stop_token_ids": "chat",
    "GEMMA_CHAT_TEMPLATE": "chat",
    "get_device": "device",
    "xla_problem": "device",
    "SetupError": "device",
    # data and rewards
    "ArithmeticTask": "tasks",
    "WordProblemTask": "tasks",
    "GSM8KTask": "tasks",
    "make_task": "tasks",
    "load_gsm8k": "tasks",
    "parse_number": "answer_format",
    "load_task": "tasks",
    "DataTask": "tasks",
    "answer_matches": "answer_format",
    "infer_answer_type": "answer_format",
    "DEFAULT_REWARDS": "rewards",
    "DEFAULT_WEIGHTS": "rewards",
    "strict_format_reward": "rewards",
    "soft_format_reward": "rewards",
    "correctness_reward": "rewards",
    "answer_digits_reward": "rewards",
    "arithmetic_steps_reward": "rewards",
    "make_length_penalty": "rewards",
    "ClassifierReward": "rewards",
    "RewardError": "rewards",
    "RewardState": "rewards",
    "compute_rewards": "rewards",
    "rewards": None,
    "judge_reward": "rewards",
    "JudgeReward": "rewards",
    "test_reward": "rewards",
    # the algorithm's math, as pure tensor functions
    "compute_advantages": "advantages",
    "group_zscore": "advantages",
    "zero_std_fraction": "advantages",
    "policy_loss": "losses",
    "kl_estimate": "losses",
    # generation, evaluation, SFT batches
    "encode_prompts": "sampling",
    "generate_completions": "evaluation",
    "evaluate": "evaluation",
    "pass_at_k": "evaluation",
    "sampled_scores": "evaluation",
    "encode_demonstrations": "sft",
    "collate": "sft",
    # watching, steering, saving
    "Dashboard": "dashboard",
    "control_changes": "dashboard",
    "read_jsonl": "metrics",
    "export_model": "export",
    "push_folder": "export",
    "push": "export",
    "load_checkpoint": "checkpoint",
    # your task: the frozen harness, the leaderboard
    "score_model": "scoring",
    "leaderboard": "scoring",
    "LeaderboardView": "scoring",
    "ScoreSettings": "scoring",
    "SCORE_SETTINGS": "scoring",
    # the study (regimes × seeds, paired intervals) and online difficulty targeting
    "run_study": "study",
    "paired_difference": "evaluation",
    "DifficultyTargeting": "difficulty",
    # sizing a run
    "PlanInput": "planner",
    "plan": "planner",
    "plan_table": "planner",
    "model_spec": "planner",
    # the bridge to TRL: our GRPOConfig as trl.GRPOConfig's keyword arguments
    "trl_grpo_settings": "config",
    # the notebooks' helpers (environment, preset with fallback, course checkpoints, exercise checks)
    "notebook": None,
}
# where the public name differs from the name in its module
_RENAMED = {"plan_table": "table"}

__all__ = sorted(PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'grpo_kit' has no attribute {name!r}")
    module_name = PUBLIC[name]
    if module_name is None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(f".{module_name}", __name__), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))


_mismatch = torch_xla_mismatch()
if _mismatch:  # transformers would fail later, inside an import, with an undefined-symbol error
    raise SetupError(_mismatch)
