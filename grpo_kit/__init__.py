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

from .engine.device import SetupError, torch_xla_mismatch

# public name -> the module that defines it, under grpo_kit; a name that is its module's own last part (rewards,
# notebook) is that module, offered as a namespace
PUBLIC: dict[str, str] = {
    # trainers and their settings
    "GRPOTrainer": "train.grpo",
    "SFTTrainer": "train.sft",
    "RFTTrainer": "train.rft",
    "GRPOConfig": "train.config",
    "SFTConfig": "train.config",
    "RFTConfig": "train.config",
    "ModelConfig": "engine.model_config",
    "TaskConfig": "train.config",
    "RunConfig": "train.config",
    "Controls": "train.controls",
    "PRESETS": "train.config",
    "GRPO_RECIPE": "train.config",
    "PRESET_TIMES": "train.config",
    "load_run_config": "train.config",
    "Arc": "course.arc",
    "run_demo": "course.arc",
    # models and devices
    "load_model": "engine.models",
    "load_tokenizer": "engine.models",
    "add_lora": "engine.models",
    "merge_and_restart_lora": "engine.models",
    "count_parameters": "engine.models",
    "resolve_model": "engine.hub",
    "ModelAccessError": "engine.hub",
    "stop_token_ids": "data.chat",
    "decode_completions": "data.chat",
    "GEMMA_CHAT_TEMPLATE": "data.chat",
    "GEMMA4_CHAT_TEMPLATE": "data.chat",
    "get_device": "engine.device",
    "xla_problem": "engine.device",
    "SetupError": "engine.device",
    # data and rewards
    "ArithmeticTask": "data.tasks",
    "WordProblemTask": "data.tasks",
    "GSM8KTask": "data.tasks",
    "make_task": "data.tasks",
    "load_gsm8k": "data.tasks",
    "parse_number": "data.answer_format",
    "load_task": "data.tasks",
    "DataTask": "data.tasks",
    "Columns": "data.tasks",
    "answer_matches": "data.answer_format",
    "infer_answer_type": "data.answer_format",
    "DEFAULT_REWARDS": "data.rewards",
    "DEFAULT_WEIGHTS": "data.rewards",
    "strict_format_reward": "data.rewards",
    "soft_format_reward": "data.rewards",
    "correctness_reward": "data.rewards",
    "answer_digits_reward": "data.rewards",
    "arithmetic_steps_reward": "data.rewards",
    "make_length_penalty": "data.rewards",
    "ClassifierReward": "data.rewards",
    "RewardError": "data.rewards",
    "RewardState": "data.rewards",
    "compute_rewards": "data.rewards",
    "rewards": "data.rewards",
    "judge_reward": "data.rewards",
    "JudgeReward": "data.rewards",
    "test_reward": "data.rewards",
    # the algorithm's math, as pure tensor functions
    "compute_advantages": "algo.advantages",
    "group_zscore": "algo.advantages",
    "zero_std_fraction": "algo.advantages",
    "policy_loss": "algo.losses",
    "LossSpec": "algo.losses",
    "kl_estimate": "algo.losses",
    # generation, evaluation, SFT batches
    "encode_prompts": "engine.sampling",
    "Batching": "eval.evaluation",
    "generate_completions": "eval.evaluation",
    "evaluate": "eval.evaluation",
    "pass_at_k": "eval.evaluation",
    "sampled_scores": "eval.evaluation",
    "encode_demonstrations": "train.sft",
    "collate": "train.sft",
    # watching, steering, saving
    "Dashboard": "course.dashboard",
    "LaunchedRun": "course.launched",
    "control_changes": "course.dashboard",
    "read_jsonl": "train.metrics",
    "export_model": "eval.export",
    "push_folder": "eval.export",
    "push": "eval.export",
    "load_checkpoint": "train.checkpoint",
    # your task: the frozen harness, the leaderboard
    "score_model": "eval.scoring",
    "leaderboard": "eval.scoring",
    "LeaderboardView": "eval.scoring",
    "ScoreSettings": "eval.scoring",
    "SCORE_SETTINGS": "eval.scoring",
    # paired intervals and online difficulty targeting
    "paired_difference": "eval.evaluation",
    "DifficultyTargeting": "algo.difficulty",
    # sizing a run
    "PlanInput": "eval.planner",
    "plan": "eval.planner",
    "plan_table": "eval.planner",
    "model_spec": "eval.planner",
    # the bridge to TRL: our GRPOConfig as trl.GRPOConfig's keyword arguments
    "trl_grpo_settings": "train.config",
    # the notebooks' helpers (environment, preset with fallback, course checkpoints, exercise checks)
    "notebook": "course.notebook",
}
# where the public name differs from the name in its module
_RENAMED = {"plan_table": "table"}

__all__ = sorted(PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'grpo_kit' has no attribute {name!r}")
    module = importlib.import_module(f".{PUBLIC[name]}", __name__)
    value = module if PUBLIC[name].rpartition(".")[2] == name else getattr(module, _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))


_mismatch = torch_xla_mismatch()
if _mismatch:  # transformers would fail later, inside an import, with an undefined-symbol error
    raise SetupError(_mismatch)
