"""The scaling model (`grpo_kit.eval.scaling`) against GRPO runs on this host (`python -m tools scaling`, `make
scaling`): one device against several, for the tiny Gemma and Gemma 3 270M, as eager processes under torchrun (gloo)
and as XLA's virtual CPU devices under SPMD.

Each run is `grpo-kit train` in its own process, alone, for a few GRPO steps; its phases are the medians over the
steps after the first two (XLA compiles there): the rollout (`rollout_seconds`), the update (log-probs, forward,
backward, optimizer) and the step. The host's speeds are calibrated on the one-device run of each model and backend
(`calibrate`): the FLOP/s its update reached, its memory bandwidth (a large sum, timed), and the decode step's fixed
cost (what the rollout took beyond the read and the multiply). The model then predicts the several-device run from
those, as devices sharing this host; the report sets predicted beside measured (docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_kit.eval.planner import PlanInput
from grpo_kit.eval.scaling import Speeds, flops_per_token, matmul_params, predict

WARMUP_STEPS = 2
"""Steps left out of the medians: XLA compiles its graphs in the first ones."""


@dataclass(frozen=True)
class Model:
    """A model the runs train, with the GRPO settings they use."""

    key: str
    preset: str
    plan_name: str
    """Its name for the planner."""
    steps: int
    prompts_per_step: int
    group_size: int
    micro_batch_size: int
    beta: float
    prompt_length: int
    """Prompt tokens after the chat template, about (the task's prompts are short arithmetic or word problems)."""
    max_new_tokens: int = 24

    def grpo_settings(self) -> str:
        """The runs' `grpo:` settings (a YAML flow mapping); no checkpoints while timing."""
        return (f"{{steps: {self.steps}, prompts_per_step: {self.prompts_per_step}, group_size: {self.group_size}, "
                f"max_new_tokens: {self.max_new_tokens}, micro_batch_size: {self.micro_batch_size}, beta: {self.beta}, "
                "save_every: 0, save_every_seconds: 100000}")


MODELS = {
    "tiny": Model("tiny", "cpu-tiny-quick", "tiny-gemma", steps=7, prompts_per_step=8, group_size=4,
                  micro_batch_size=16, beta=0.04, prompt_length=24),
    "270m": Model("270m", "cpu-gemma-270m", "gemma-3-270m", steps=5, prompts_per_step=4, group_size=4,
                  micro_batch_size=8, beta=0.0, prompt_length=64),
}
RUNS = (("tiny", "eager", (1, 2)), ("tiny", "xla", (1, 8)), ("270m", "eager", (1, 2)))
"""(model, backend, device counts): the first count calibrates, the others are predicted. Gemma 3 270M has no XLA
run: on 8 virtual devices its GRPO step does not fit this host's 24 GiB (eight copies of its weights and fp32 copies
of its head), and its graphs take minutes each to compile on 2 cores."""


def _command(model: Model, backend: str, devices: int, out: Path) -> tuple[list[str], dict[str, str]]:
    config = out.parent / f"{out.name}.yaml"
    # a whole copy of the weights per process: the data parallelism the model predicts (the tiny Gemma is fully
    # fine-tuned, which torchrun would otherwise shard: engine/sharding.py)
    config.write_text(f"grpo: {model.grpo_settings()}\ntask: {{num_test: 8}}\nsft: {{steps: 1}}\n"
                      "model: {shard_weights: false}\n")
    train = ["-m", "grpo_kit.cli", "train", "--preset", model.preset, "--config", str(config), "--output-dir",
             str(out), "--quiet"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "XLA_", "CPU_NUM_DEVICES", "GRPO_KIT"))}
    if backend == "xla":
        env.update(GRPO_KIT_DEVICE="xla", PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices),
                   GRPO_KIT_SPMD="1" if devices > 1 else "0")
        return [sys.executable, *train], env
    env.update(GRPO_KIT_DEVICE="cpu", USE_TORCH_XLA="0")
    if devices == 1:
        return [sys.executable, *train], env
    # each process one thread of the host's cores, as torchrun's default OMP_NUM_THREADS=1 would give
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}",
            *train], {**env, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // devices))}


def measure(model: Model, backend: str, devices: int, root: Path, *, timeout: float = 1800) -> dict[str, Any]:
    """One run's medians per phase (seconds), its mean decode steps and its wall time; or its error."""
    out = root / f"{model.key}-{backend}-{devices}"
    command, env = _command(model, backend, devices, out)
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][WARMUP_STEPS:]
    update_keys = ("logprob_seconds", "forward_seconds", "backward_seconds", "optimizer_seconds")
    return {
        "seconds": {
            "rollout": statistics.median(r["rollout_seconds"] for r in rows),
            "update": statistics.median(sum(r.get(k, 0.0) for k in update_keys) for r in rows),
            "step": statistics.median(r["step_seconds"] - r.get("reward_seconds", 0.0) for r in rows),
        },
        "decode_steps": statistics.mean(r["completion_length_max"] for r in rows),
        "steps_measured": len(rows), "wall_seconds": round(wall, 1),
    }


def memory_bandwidth(megabytes: int = 1024, repeats: int = 5) -> float:
    """This host's bytes/s reading a large tensor (the fastest of `repeats` sums)."""
    import torch

    data = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def _plan_input(model: Model, devices: int, dtype_bytes: int) -> PlanInput:
    return PlanInput(model=model.plan_name, tpu=f"cpu-x{devices}", lora=True, prompts_per_step=model.prompts_per_step,
                     group_size=model.group_size, prompt_length=model.prompt_length,
                     max_new_tokens=model.max_new_tokens, micro_batch_size=model.prompts_per_step * model.group_size,
                     beta=model.beta, dtype_bytes=dtype_bytes, lora_r=8)


def calibrate(model: Model, one: dict[str, Any], *, bandwidth: float, dtype_bytes: int) -> Speeds:
    """The host's speeds that make the model reproduce `one` (a one-device run): FLOP/s from its update, the
    measured `bandwidth`, and the decode step's fixed cost as the rest of its rollout."""
    p = _plan_input(model, 1, dtype_bytes)
    rows = p.prompts_per_step * p.group_size
    steps = one["decode_steps"]
    flops = flops_per_token(p, checkpointing=False) * rows * (p.prompt_length + steps) / one["seconds"]["update"]
    bare = Speeds(flops=flops, bandwidth=bandwidth, link=bandwidth / 4, decode_overhead_s=0.0,
                  flops_efficiency=1.0, bandwidth_efficiency=1.0, shared_host=True)
    without_overhead = predict(p, speeds=bare, completion_tokens=steps, checkpointing=False)["seconds"]["rollout"]
    overhead = max(0.0, (one["seconds"]["rollout"] - without_overhead) / steps)
    return Speeds(**{**bare.__dict__, "decode_overhead_s": overhead})


def run_scaling(*, runs: tuple = RUNS, progress: bool = True) -> dict[str, Any]:
    """Every run of `runs`, its prediction and the calibration it came from."""
    import torch

    from grpo_kit.engine.device import default_dtype

    bandwidth = memory_bandwidth()
    eager_bytes = torch.tensor([], dtype=default_dtype(torch.device("cpu"))).element_size()
    results = []
    with tempfile.TemporaryDirectory(prefix="grpo-kit-scaling-") as tmp:
        for key, backend, counts in runs:
            model = MODELS[key]
            dtype_bytes = eager_bytes if backend == "eager" else 4  # XLA's CPU back end multiplies bf16 in fp32
            measured = {}
            for n in counts:
                if progress:
                    print(f"[scaling] {key} {backend} × {n} …", file=sys.stderr, flush=True)
                measured[n] = measure(model, backend, n, Path(tmp))
                if progress:
                    print(f"[scaling] {key} {backend} × {n}: {measured[n]}", file=sys.stderr, flush=True)
            one = measured[counts[0]]
            if "error" in one:
                results.append({"model": key, "backend": backend, "measured": measured})
                continue
            speeds = calibrate(model, one, bandwidth=bandwidth, dtype_bytes=dtype_bytes)
            predicted = {n: predict(_plan_input(model, n, dtype_bytes), speeds=speeds, checkpointing=False,
                                    completion_tokens=measured[n].get("decode_steps", one["decode_steps"]))
                         for n in counts}
            results.append({"model": key, "backend": backend, "measured": measured, "predicted": predicted,
                            "calibration": speeds.__dict__, "dtype_bytes": dtype_bytes,
                            "matmul_params": matmul_params(model.plan_name)})
    return {"host": _host(), "bandwidth_bytes_per_s": bandwidth, "runs": results}


def _host() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{os.cpu_count()} cores"
    kind = "with AMX" if "amx_tile" in flags else ("AVX512-BF16" if "avx512_bf16" in flags else "AVX2")
    name = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "")
    return f"{os.cpu_count()} cores, {name} ({kind})"


def _ratio(measured: float, predicted: float) -> str:
    return f"{measured / predicted:.2f}" if predicted else "–"


def report_table(result: dict[str, Any]) -> str:
    """The measured-against-predicted table of docs/scaling.md."""
    lines = ["| model | backend | devices | phase | measured s | predicted s | measured / predicted |",
             "|---|---|---|---|---|---|---|"]
    for run in result["runs"]:
        for n, got in run["measured"].items():
            if "error" in got:
                lines.append(f"| {run['model']} | {run['backend']} | {n} | (failed) | {got['error']} | | |")
                continue
            guess = run["predicted"][n]["seconds"] if "predicted" in run else {}
            for phase in ("rollout", "update", "step"):
                m, p = got["seconds"][phase], guess.get(phase, 0.0)
                lines.append(f"| {run['model']} | {run['backend']} | {n} | {phase} | {m:.3f} | {p:.3f} | "
                             f"{_ratio(m, p)} |")
    return "\n".join(lines)


BOARDS = ("t4", "t4-x2", "v5e-1", "v5e-8", "v5e-16", "v5e-32", "v6e-1", "v6e-8")
"""The boards docs/scaling.md predicts for: Kaggle's T4 and T4 × 2, TPU v5e from one chip to a 32-chip pod slice,
v6e's one chip and eight."""
PREDICTION_MODELS = ("gemma-3-1b-it", "gemma-4-e2b-it")


def predictions_table() -> str:
    """Predicted seconds per GRPO step per board (the TPU presets' recipe), with the memory plan per device."""
    from grpo_kit.eval.planner import accelerator, model_spec
    from grpo_kit.eval.scaling import scaling_table

    lines = ["| model | board | devices | GiB / device (plan) | rollout s | update s | communication s | step s | "
             "bound by |", "|---|---|---|---|---|---|---|---|---|"]
    for model in PREDICTION_MODELS:
        for board in BOARDS:
            # a GPU keeps Gemma 4's per-layer table on the host, as the gpu-gemma-4-e2b preset does
            host_table = bool(model_spec(model).ple_table_params) and not accelerator(board).tpu
            (row,) = scaling_table(model, (board,), ple_on_host=host_table)
            if not row["fits"]:
                lines.append(f"| {model} | {row['board']} | | {row['gib_per_device']:.1f} (does not fit) | | | | | |")
                continue
            s = row["seconds"]
            bound = f"{row['bound_by']} (decode: {row['decode_bound_by']})"
            lines.append(f"| {model} | {row['board']} | {row['devices']} | {row['gib_per_device']:.1f} | "
                         f"{s['rollout']:.1f} | {s['update']:.2f} | {s['communication']:.3f} | {s['step']:.1f} | "
                         f"{bound} |")
    return "\n".join(lines)


def write_report(result: dict[str, Any] | None, page: str | Path) -> Path:
    """Replace the generated blocks of `page` (docs/scaling.md): the predictions (always) and, given a result of
    `run_scaling`, the measured-against-predicted table with the host it ran on."""
    page = Path(page)
    text = _replace(page.read_text(), "predicted", predictions_table())
    if result is not None:
        body = (f"Measured on {result['host']} (memory read at {result['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s), "
                f"each run alone; medians over the steps after the first {WARMUP_STEPS}.\n\n{report_table(result)}")
        text = _replace(text, "measured", body)
    page.write_text(text)
    return page


def _replace(text: str, name: str, body: str) -> str:
    start, end = f"<!-- scaling:{name} -->", f"<!-- /scaling:{name} -->"
    if start not in text or end not in text:
        raise ValueError(f"docs/scaling.md has no {start} … {end} block to write the {name} table into")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
