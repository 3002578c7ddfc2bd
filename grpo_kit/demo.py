"""The CPU demo: SFT warm-up → GRPO with verifier rewards only → greedy evaluation, with plots."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from .config import DemoConfig
from .device import get_device
from .evaluation import evaluate
from .grpo import GRPOTrainer
from .metrics import read_jsonl
from .models import load_model
from .plots import plot_accuracy, plot_advantage_histograms, plot_kl, plot_rewards
from .rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
from .sft import SFTTrainer
from .tasks import ArithmeticTask


def run_demo(cfg: DemoConfig | None = None, device: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the whole demo and write `summary.json`, `metrics.jsonl` and PNG plots to `cfg.output_dir`."""
    cfg = cfg or DemoConfig()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    wall = time.perf_counter()
    dev = get_device(device)
    model, tokenizer = load_model(cfg.model, dev)
    task = ArithmeticTask(**dataclasses.asdict(cfg.task))
    test = task.test_set()
    n_new = cfg.grpo.max_new_tokens

    baseline = evaluate(model, tokenizer, test, max_new_tokens=n_new)
    t0 = time.perf_counter()
    sft = SFTTrainer(model, tokenizer, task.demonstrations(), dataclasses.replace(cfg.sft, output_dir=str(out)))
    sft.train(progress=progress)
    sft_seconds = time.perf_counter() - t0
    after_sft = evaluate(model, tokenizer, test, max_new_tokens=n_new)

    t0 = time.perf_counter()
    grpo_cfg = dataclasses.replace(cfg.grpo, output_dir=str(out), reward_weights=cfg.grpo.reward_weights or DEFAULT_WEIGHTS)
    trainer = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo_cfg)
    trainer.train(progress=progress)
    grpo_seconds = time.perf_counter() - t0
    after_grpo = evaluate(model, tokenizer, test, max_new_tokens=n_new)

    summary = {
        "baseline_accuracy": baseline["accuracy"],
        "sft_accuracy": after_sft["accuracy"],
        "grpo_accuracy": after_grpo["accuracy"],
        "grpo_gain_points": 100 * (after_grpo["accuracy"] - after_sft["accuracy"]),
        "format_rate": after_grpo["format_rate"],
        "sft_format_rate": after_sft["format_rate"],
        "sft_seconds": sft_seconds,
        "grpo_seconds": grpo_seconds,
        "sft_steps": sft.step,
        "grpo_steps": trainer.step,
        "test_size": len(test),
        "device": str(dev),
        "model": cfg.model.name,
        "samples_after_grpo": after_grpo["samples"][:4],
    }
    rows = read_jsonl(out / "metrics.jsonl")
    plot_rewards(rows, out / "reward_curve.png")
    plot_kl(rows, out / "kl.png")
    plot_advantage_histograms(rows, out / "advantage_histograms.png")
    plot_accuracy(summary, out / "accuracy.png")
    summary["wall_seconds"] = time.perf_counter() - wall
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
