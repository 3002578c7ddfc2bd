"""`grpo-kit xla-check`: prove the XLA path on whatever machine this is (a TPU, or the CPU in CI).

It runs the same short GRPO job twice from the same weights, seed and prompts — once eagerly on the CPU in fp32
(the plain path: no bf16 weight products, even on a CPU that has them natively), once on the XLA device (SPMD over
`devices` devices when more than one) — and reports:

- compiles per step and in total, recompilations after warm-up and ops that fell back to the CPU
  (both must be 0);
- the largest difference between the two runs' per-step losses and metrics, each divided by max(1, |eager
  value|) (`max_scaled_diff_vs_eager`, must be ≤ `tolerance`), and between their weight updates (relative, must
  be ≤ `UPDATE_TOLERANCE`);
- the XLA step time after warm-up.

Sampling noise is drawn on the CPU from a seeded generator in both runs, so both sample the same tokens
(reported per step as `sampled_token_agreement`). The runs go in lockstep: both train on the eager sample, and
before each step the eager run takes the XLA run's weights and Adam moments, so each step compares the same
computation from the same state. Without that, float rounding alone parts two runs: on the tiny Gemma 4 at
lr 1e-3, two eager runs whose starting weights differ by 1e-7 of their size have gradient norms 0.7 apart by
the third step, while the tiny Gemma's stay within 3e-6 (`docs/tpu.md`). Each optimizer step keeps its own step
count, and each step's weight update is compared too (`update_rel_diff`: |XLA update − eager update| / |eager
update|, judged against `UPDATE_TOLERANCE`), so an update XLA computes differently still fails the check.
The job uses rewards an untrained model already varies on (tag counts, length), so every step has
non-zero advantages and a real gradient without an SFT phase.
"""

from __future__ import annotations

import os
import time
from typing import Any

COMPARED_KEYS = (
    "policy_loss", "reward_mean", "reward_std", "advantage_mean", "advantage_std", "grad_norm", "entropy",
    "kl", "clip_low", "clip_high", "ratio_mean", "completion_length_mean",
)
UPDATE_TOLERANCE = 1e-2
"""Largest allowed |XLA update − eager update| / |eager update| in one step. Not ~1e-6 like the metrics: Adam
divides by √v, so an entry whose gradient is ~1e-9 (rounding-sized) moves by a good part of lr either way; a few
such entries among many give ~1e-3, while an update computed differently (a wrong step count, a missed
weight) gives ~1."""


def prepare_environment(devices: int) -> None:
    """Set the XLA runtime variables; must run before torch_xla is imported (the CLI calls it first).
    Without a TPU the XLA CPU client is used, with `devices` virtual devices."""
    from ..engine.device import tpu_present

    # GSPMD prints a deprecation warning per compiled graph; keep errors only
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not tpu_present():
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        os.environ["CPU_NUM_DEVICES"] = str(devices)


def _job_config(steps: int, max_new_tokens: int, devices: int) -> Any:
    """The small GRPO job both runs do."""
    from ..train.config import GRPOConfig

    # The same job for every device count (32 rows, micro-batches of 16: divisible by 1, 2, 4 and 8 devices),
    # so a 1-device and an 8-device report can be compared step by step.
    if 16 % devices:
        raise ValueError(f"xla-check splits micro-batches of 16 rows: --devices must divide 16, got {devices}")
    return GRPOConfig(
        steps=steps, prompts_per_step=8, group_size=4, micro_batch_size=16,
        max_new_tokens=max_new_tokens, prompt_bucket=64, learning_rate=1e-3, temperature=1.0, warmup_steps=0, beta=0.04,
        output_dir=None, seed=0, log_completions=0,
        cpu_bf16=False,  # the eager reference in fp32: bf16 products would differ from XLA's fp32 by their rounding
    )


def _rewards(max_new_tokens: int) -> tuple[list, dict[str, float]]:
    from ..data.rewards import make_length_penalty, soft_format_reward

    length = make_length_penalty(max_new_tokens, max(1, max_new_tokens // 2), name="length_penalty")
    return [soft_format_reward, length], {"soft_format_reward": 1.0, "length_penalty": 1.0}


def _trainer(device: Any, state: dict, steps: int, max_new_tokens: int, devices: int, *, model_name: str) -> Any:
    import dataclasses

    import torch

    from ..data.tasks import ArithmeticTask
    from ..engine.device import move_model, shard_parameters
    from ..engine.model_config import ModelConfig
    from ..engine.models import load_model
    from ..train.grpo import GRPOTrainer

    model, tokenizer = load_model(ModelConfig(name=model_name, dtype="float32"), torch.device("cpu"))
    model.load_state_dict(state)
    model = move_model(model, device)
    if device.type == "xla":
        shard_parameters(model)  # loaded on the CPU, so shard after the move (FSDP-style under SPMD)
    funcs, weights = _rewards(max_new_tokens)
    cfg = dataclasses.replace(_job_config(steps, max_new_tokens, devices), reward_weights=weights)
    return GRPOTrainer(model, tokenizer, funcs, ArithmeticTask().prompt_stream(), cfg)


def _lockstep(eager: Any, xla: Any, steps: int) -> tuple[list[dict], list[dict], list[float], list[float]]:
    """Run both trainers step by step. Before each step the eager trainer takes the XLA trainer's weights and Adam
    moments (`_take_state`). Each step the XLA trainer samples with its own sampler (compiled, monitored, compared
    token by token with the eager sample) but trains on the eager rollout, so that one token flipped by a 1e-7 logit
    difference cannot send the two runs down different trajectories and every comparison is of the same computation
    on the same data. Returns both runs' metrics rows, the token agreement and the update difference per step."""
    from dataclasses import fields

    from ..engine.sampling import Rollout

    captured: dict[str, Any] = {}
    eager_rollout, xla_rollout = eager.rollout, xla.rollout

    def eager_capture(rows: list, controls: dict) -> Rollout:
        captured["eager"] = eager_rollout(rows, controls)
        return captured["eager"]

    def xla_on_eager_data(rows: list, controls: dict) -> Rollout:
        own = xla_rollout(rows, controls)
        ref = captured["eager"]
        same = (own.completion_ids.cpu() == ref.completion_ids) | (ref.completion_mask == 0)
        captured["agreement"] = float(same.float().mean())
        from ..engine.device import shard_batch

        # the XLA sampler keeps no head moments: the XLA update recomputes the head, as it does for its own rollouts
        return Rollout(**{f.name: shard_batch(getattr(ref, f.name).to(xla.device)) for f in fields(Rollout)
                          if f.name not in ("head_mean", "entropy")})

    eager.rollout, xla.rollout = eager_capture, xla_on_eager_data
    eager_rows, xla_rows, agreement, update_diff = [], [], [], []
    for _ in range(steps):
        start = _take_state(eager, xla)
        eager_rows.append(eager.train_step())
        xla_rows.append(xla.train_step())
        agreement.append(captured["agreement"])
        update_diff.append(_update_rel_diff(start, eager, xla))
    return eager_rows, xla_rows, agreement, update_diff


def _take_state(eager: Any, xla: Any) -> list[Any]:
    """Copy the XLA trainer's weights and Adam moments into the eager trainer (its step count stays its own) and
    return the shared starting weights. Reading XLA tensors after a step's sync runs no graph."""
    import torch

    start = []
    with torch.no_grad():
        for mine, theirs in zip(eager.params, xla.params, strict=True):
            weights = theirs.detach().cpu()
            mine.copy_(weights)
            start.append(weights)
            moments = xla.optimizer.state.get(theirs, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in moments:
                    eager.optimizer.state[mine][key].copy_(moments[key].detach().cpu())
    return start


def _update_rel_diff(start: list[Any], eager: Any, xla: Any) -> float:
    """|XLA update − eager update| / |eager update| over all trainable weights, for the step just taken."""
    gap = norm = 0.0
    for w0, mine, theirs in zip(start, eager.params, xla.params, strict=True):
        eager_update = mine.detach() - w0
        gap += float((theirs.detach().cpu() - w0 - eager_update).pow(2).sum())
        norm += float(eager_update.pow(2).sum())
    return (gap / norm) ** 0.5 if norm else float(gap > 0)


def _differences(eager_rows: list[dict[str, Any]], xla_rows: list[dict[str, Any]], *,
                 scaled: bool = False) -> dict[str, float]:
    """Per compared metric (`COMPARED_KEYS`), the largest |eager − XLA| over the steps both logged it; `scaled`
    divides each by max(1, |eager|), so a metric of size ~10 (the gradient norm) is held to the same relative
    rounding as one of size ~1 is held to absolutely."""
    diffs: dict[str, float] = {}
    for key in COMPARED_KEYS:
        pairs = [(a.get(key), b.get(key)) for a, b in zip(eager_rows, xla_rows, strict=True)]
        pairs = [(float(a), float(b)) for a, b in pairs if a is not None and b is not None]
        if pairs:
            diffs[key] = max(abs(a - b) / (max(1.0, abs(a)) if scaled else 1.0) for a, b in pairs)
    return diffs


def _backend() -> str:
    """The PJRT backend the check ran on: tpu, or the CPU client (cpu)."""
    return "tpu" if os.environ.get("PJRT_DEVICE", "").upper() == "TPU" else os.environ.get("PJRT_DEVICE", "CPU").lower()


def _start(devices: int, model_name: str) -> tuple[Any, dict[str, Any]]:
    """The XLA device (SPMD over `devices` when > 1) and the embedded model's starting weights, made on the CPU."""
    import torch

    from ..engine.device import enable_spmd, get_device, use_cpu_threads
    from ..engine.model_config import ModelConfig
    from ..engine.models import load_model

    if devices > 1:
        enable_spmd(devices)
    # Touch the XLA device before any CPU backward in this process (a CPU backward first breaks later XLA
    # backwards in torch_xla 2.9).
    xla = get_device("xla")
    use_cpu_threads()
    start_model, _ = load_model(ModelConfig(name=model_name, dtype="float32", seed=0), torch.device("cpu"))
    return xla, {k: v.clone() for k, v in start_model.state_dict().items()}


def run_xla_check(
    devices: int = 1, steps: int = 20, max_new_tokens: int = 16, tolerance: float = 1e-4, *, model: str = "tiny-gemma"
) -> dict[str, Any]:
    """Run the check on an embedded model (`hub.TINY_MODELS`: the tiny Gemma, or the tiny Gemma 4) and return its
    report (see the module docstring). `prepare_environment` first."""
    import torch

    from ..engine.device import compile_monitor

    xla, state = _start(devices, model)
    eager = _trainer(torch.device("cpu"), state, steps, max_new_tokens, devices, model_name=model)
    on_xla = _trainer(xla, state, steps, max_new_tokens, devices, model_name=model)
    t0 = time.perf_counter()
    eager_rows, xla_rows, agreement, update_diff = _lockstep(eager, on_xla, steps)
    seconds = time.perf_counter() - t0

    diffs = _differences(eager_rows, xla_rows)
    max_diff = max(_differences(eager_rows, xla_rows, scaled=True).values())

    monitor = compile_monitor()
    warm = _job_config(steps, max_new_tokens, devices).compile_warmup_steps
    after = [r["step_seconds"] for r in xla_rows[warm:]]
    report = {
        "model": model,
        "devices": devices,
        "backend": _backend(),
        "spmd": devices > 1,
        "steps": len(xla_rows),
        "max_new_tokens": max_new_tokens,
        "compiles_per_step": [r.get("xla_compiles_step", 0) for r in xla_rows],
        "total_graphs": monitor.total(),
        "graphs_per_phase": dict(monitor.compiles),
        "compile_seconds": round(sum(monitor.seconds.values()), 2),
        "recompiles_after_warmup": monitor.recompiles_after_warmup,
        "recompile_warnings": monitor.warnings,
        "cpu_fallback_ops": dict(monitor.fallbacks),
        "max_abs_diff_vs_eager": max(diffs.values()),
        "max_scaled_diff_vs_eager": max_diff,
        "abs_diff_by_metric": diffs,
        "update_rel_diff": max(update_diff),
        "update_rel_diff_per_step": update_diff,
        "update_tolerance": UPDATE_TOLERANCE,
        "tolerance": tolerance,
        "step_seconds_after_warmup": round(sum(after) / len(after), 4) if after else None,
        "sampled_token_agreement": agreement,
        "seconds": round(seconds, 2),
        "policy_loss_per_step": [r["policy_loss"] for r in xla_rows],
        "reward_mean_per_step": [r["reward_mean"] for r in xla_rows],
    }
    report["ok"] = (report["recompiles_after_warmup"] == 0 and max_diff <= tolerance and not monitor.fallbacks
                    and report["update_rel_diff"] <= UPDATE_TOLERANCE)
    return report
