"""Scaling model: how long a GRPO step takes per device on N devices, and which part bounds it.

A step is a rollout, an update and (N > 1) the gradients' all-reduce. With A the parameters a token multiplies by
(the layers and the LM head, not the looked-up embedding tables), W = A · b the bytes those weights take, r = rows
per device (prompts × group / N), T_p prompt and T_c completion tokens, F a device's FLOP/s, B its memory bytes/s,
e_f and e_b the shares of them the kit reaches, o a fixed cost per decode step (launching its kernels or graph):

    prefill   = 2 · A · r · T_p / (e_f · F)
    decode    = T_c · (max(W + KV, 2 · A · r) / rate + o)       each step reads every weight once and the cache
                (the weight read at e_b · B, the multiply at e_f · F: whichever takes longer)
    update    = k · A · r · (T_p + T_c) / (e_f · F)              k = 2 per forward, 2 for LoRA's backward (input
                gradients only) or 4 for full fine-tuning's, 2 more under gradient checkpointing, 2 more for the
                reference forward when β > 0
    allreduce = 2 · (N − 1) / N · G / L                          ring all-reduce of G = the trainable gradients'
                bytes (fp32) over links of L bytes/s per device
    sharded   full fine-tuning over N > 1 devices shards the weights FSDP-style: each forward and backward
              gathers them, (T_c + 3) · (N − 1) / N · P · b / L more on XLA devices (the decode gathers them at every
              step), (1 + 3) · (N − 1) / N · P · b / L under torchrun (`engine.sharding`: once per rollout)

Splitting the batch over more devices divides the compute terms by N but not the weight read: a decode step reads
every weight on every device however few rows it holds, so a rollout at small batches stays as long on N devices
as on one, and the update is what data parallelism shortens. Devices that share one host (CPU processes, XLA's
virtual CPU devices) share its FLOP/s and bandwidth: each gets F / N and B / N, so the compute terms stay and the
weight read grows N-fold.

An estimate from published speeds and two efficiencies, with no per-op costs beyond the decode step's fixed one:
docs/scaling.md sets it beside measured runs and says where it misses. `predict` gives the per-phase seconds,
`SPEEDS` the numbers per chip family, `scaling_table` a row per board.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .planner import PlanInput, accelerator, model_spec, plan


@dataclass(frozen=True)
class Speeds:
    """One device's published speeds, and what the kit reaches of them."""

    flops: float
    """Dense FLOP/s in the dtype the kit trains in there (bf16 on TPUs, fp32 on a T4)."""
    bandwidth: float
    """Memory bytes/s."""
    link: float
    """All-reduce bytes/s per device between the devices (ICI on a TPU slice, PCIe between two T4s)."""
    decode_overhead_s: float
    """Fixed seconds per decode step: launching its graph (XLA) or its kernels (eager)."""
    flops_efficiency: float = 0.3
    """The share of `flops` the kit's matrix products reach (the estimate the presets use)."""
    bandwidth_efficiency: float = 0.6
    """The share of `bandwidth` a weight read reaches."""
    shared_host: bool = False
    """The devices share one host's compute and memory (CPU processes, virtual XLA devices): `flops` and `bandwidth`
    are the host's, split over the devices."""


_V5E = dict(flops=197e12, bandwidth=819e9, link=100e9, decode_overhead_s=0.037)
_V6E = dict(flops=918e12, bandwidth=1640e9, link=224e9, decode_overhead_s=0.023)
SPEEDS: dict[str, Speeds] = {
    "v5e": Speeds(**_V5E),
    "v6e": Speeds(**_V6E),
    "t4": Speeds(flops=8.1e12, bandwidth=320e9, link=6e9, decode_overhead_s=0.012),
}
"""Per device, by family. TPUs (Google's published chip numbers): bf16 FLOP/s, HBM bytes/s, half the chip's
published ICI bandwidth as the all-reduce's bus rate; the decode step's fixed cost is what the TPU presets' estimates
take for torch_xla's per-step overhead (docs/presets.md). T4: NVIDIA's fp32 FLOP/s (the kit trains in fp32 there:
no bf16), GDDR6 bytes/s, and ≈ 6 GB/s between two T4s over PCIe through the host (no NVLink on Kaggle's T4 × 2);
its fixed cost per decode step is the kit's eager decode step's kernel launches."""


def speeds_for(board: str) -> Speeds | None:
    """The speeds of `board`'s devices (`planner.accelerator` names: v5e-8, v6e-1, t4, t4-x2, …), or None for a board
    whose family has none here (CPUs vary too much: calibrate them, as `tools/scaling.py` does)."""
    key = accelerator(board).family
    return SPEEDS.get(key)


def flops_per_token(p: PlanInput, *, checkpointing: bool) -> float:
    """FLOPs per token of the update, per the module docstring's k · A."""
    k = 2 + (2 if p.lora else 4) + (2 if checkpointing else 0) + (2 if p.beta > 0 else 0)
    return k * matmul_params(p.model)


def matmul_params(model: str) -> int:
    """A: the parameters each token is multiplied by, the LM head included, the looked-up tables not."""
    spec = model_spec(model)
    return spec.params - spec.embedding_params + spec.vocab * spec.hidden


def predict(p: PlanInput, *, speeds: Speeds | None = None, completion_tokens: float | None = None,
            checkpointing: bool | None = None) -> dict[str, Any]:
    """Seconds per GRPO step on `p.tpu`'s devices at `speeds` (default the board's published ones):
    each phase, the step, which phase bounds it and whether its decode is bound by the weight read or by the
    multiply. `completion_tokens`: decode steps per rollout (default `p.max_new_tokens`: every row runs to the
    limit). `checkpointing`: default what the planner picks for `p`."""
    acc = accelerator(p.tpu)
    n = acc.devices
    speeds = speeds or speeds_for(p.tpu)
    if speeds is None:
        raise ValueError(f"no published speeds for {acc.name}: pass speeds= (measured ones, as tools/scaling.py does)")
    spec = model_spec(p.model)
    b = p.dtype_bytes or (2 if acc.bf16 else 4)
    if checkpointing is None:
        checkpointing = bool(plan(p)["gradient_checkpointing"])
    share = n if speeds.shared_host else 1
    flops = speeds.flops * speeds.flops_efficiency / share
    bandwidth = speeds.bandwidth * speeds.bandwidth_efficiency / share
    rows = p.prompts_per_step * p.group_size / n
    steps = p.max_new_tokens if completion_tokens is None else completion_tokens
    a = matmul_params(p.model)
    weights = a * b
    cache = rows * (p.prompt_length + steps / 2) * spec.kv_per_token * b  # read at every step: the mean context
    read, multiply = (weights + cache) / bandwidth, 2 * a * rows / flops
    prefill = 2 * a * rows * p.prompt_length / flops
    decode = steps * (max(read, multiply) + speeds.decode_overhead_s)
    update = flops_per_token(p, checkpointing=checkpointing) * rows * (p.prompt_length + steps) / flops
    trainable = spec.lora_params(p.lora_r, p.lora_targets) if p.lora else spec.params
    ring = 2 * (n - 1) / n
    allreduce = ring * trainable * 4 / speeds.link
    gathers = steps + 3 if acc.tpu else 4  # torchrun's processes gather the weights once per rollout (`sharding`)
    gather = gathers * (n - 1) / n * spec.params * b / speeds.link if (not p.lora and n > 1) else 0.0
    rollout = prefill + decode
    parts = {"rollout": rollout, "update": update, "communication": allreduce + gather}
    return {
        "board": acc.name, "devices": n, "rows_per_device": rows, "decode_steps": steps,
        "checkpointing": checkpointing,
        "seconds": {**parts, "prefill": prefill, "decode": decode, "step": sum(parts.values())},
        "bound_by": max(parts, key=parts.get),
        "decode_bound_by": "weight read" if read >= multiply else "multiply",
    }


def scaling_table(model: str, boards: tuple[str, ...], **inputs: Any) -> list[dict[str, Any]]:
    """`predict` and the planner's memory per device for `model` on each board (`inputs`: more `PlanInput` fields),
    one row per board: the numbers docs/scaling.md prints."""
    rows = []
    for board in boards:
        p = PlanInput(model=model, tpu=board, **inputs)
        memory = plan(p)
        if not memory["fits"]:
            rows.append({"board": accelerator(board).name, "fits": False,
                         "gib_per_device": memory["estimate_gib"]["total"]})
            continue
        p = dataclasses.replace(p, micro_batch_size=memory["micro_batch_size"])
        guess = predict(p, checkpointing=memory["gradient_checkpointing"])
        rows.append({**guess, "fits": True, "gib_per_device": memory["estimate_gib"]["total"],
                     "micro_batch_size": memory["micro_batch_size"]})
    return rows

