"""Memory planner vs measured peak memory, on the CPU.

For each model, a fresh process loads it, runs GRPO steps with a given shape, and reports how much its
resident memory grew while training (the highest RSS sampled every millisecond during the steps minus the
RSS after loading) next to the
planner's estimate of the same thing (everything but the weights, which are exact: parameters × 4 bytes).

    python -m tools.plan_vs_measured                 # tiny Gemma, two shapes
    python -m tools.plan_vs_measured --gemma-270m    # also the real Gemma 3 270M (≈ 2 min, 8 GB RAM)

Target: within ±25 %.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, threading, time
import torch
torch.set_num_threads(2)
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.train.config import GRPOConfig
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.engine.models import load_model
from grpo_kit.data.rewards import soft_format_reward
from grpo_kit.data.tasks import ArithmeticTask
args = json.loads(sys.argv[1])
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
model, tok = load_model(ModelConfig(name=args["model"], dtype="float32", lora=args["lora"],
                                    gradient_checkpointing=args["checkpointing"]), torch.device("cpu"))
after_load = rss()
highest = [after_load]
def watch():  # resident memory sampled every millisecond: the peak of this phase, not of start-up
    while not done.is_set():
        highest[0] = max(highest[0], rss())
        time.sleep(0.001)
done = threading.Event()
watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
cfg = GRPOConfig(steps=2, prompts_per_step=args["prompts"], group_size=args["group"], micro_batch_size=args["micro"],
                 max_new_tokens=args["max_new_tokens"], prompt_bucket=args["prompt_length"], output_dir=None,
                 beta=0.0, log_kl=False, warmup_steps=0, log_completions=0)
trainer = GRPOTrainer(model, tok, [soft_format_reward], ArithmeticTask().prompt_stream(), cfg)
trainer.train(progress=False)
done.set()
watcher.join()
print(json.dumps({"training_peak_growth": highest[0] - after_load,
                  "params": sum(p.numel() for p in model.parameters())}))
"""


def measure(model: str, lora: bool, *, prompts: int, group: int, micro: int, max_new_tokens: int, prompt_length: int,
            checkpointing: bool = False) -> dict:
    args = dict(model=model, lora=lora, prompts=prompts, group=group, micro=micro, max_new_tokens=max_new_tokens,
                prompt_length=prompt_length, checkpointing=checkpointing)
    # Large blocks through mmap, returned to the OS when freed: RSS then follows live tensors the way a device
    # allocator does, instead of keeping every phase's high-water mark in glibc's arenas.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def estimate(spec_name: str, lora: bool, *, prompts: int, group: int, micro: int, max_new_tokens: int,
             prompt_length: int, checkpointing: bool = False) -> dict:
    from grpo_kit.eval.planner import GIB, PlanInput
    from grpo_kit.eval.planner import estimate as plan_estimate

    p = PlanInput(model=spec_name, tpu="cpu", lora=lora, prompts_per_step=prompts, group_size=group,
                  prompt_length=prompt_length, max_new_tokens=max_new_tokens, beta=0.0, dtype_bytes=4)
    est = plan_estimate(p, micro, checkpointing)
    growth = est["total"] - est["margin"] - est["weights"]
    return {"estimate_gib": {k: round(v / GIB, 4) for k, v in est.items()}, "training_growth_estimate": growth}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemma-270m", action="store_true", help="also measure the real Gemma 3 270M (from PyPI GGUF)")
    args = parser.parse_args()
    cases = [
        ("tiny-gemma", "tiny-gemma", False, 64, 8, 64, 32, 48),
        ("tiny-gemma", "tiny-gemma", False, 64, 8, 512, 32, 48),
    ]
    if args.gemma_270m:
        from grpo_kit.engine.models import gemma_270m_dir

        gemma_270m_dir()  # build the cached HF directory once (≈ 1 min), outside the measured process
        cases.append(("gemma-3-270m", "gemma-3-270m-offline", True, 2, 4, 8, 32, 64))
    rows = []
    for spec, name, lora, prompts, group, micro, new, plen in cases:
        shape = {"prompts": prompts, "group": group, "micro": micro, "max_new_tokens": new, "prompt_length": plen}
        m = measure(name, lora, **shape)
        e = estimate(spec, lora, **shape)
        ratio = e["training_growth_estimate"] / max(m["training_peak_growth"], 1)
        rows.append({"model": spec, "lora": lora, "rows": prompts * group, "micro_batch": micro,
                     "prompt_length": plen, "max_new_tokens": new,
                     "measured_training_growth_mib": round(m["training_peak_growth"] / 2**20, 1),
                     "estimated_training_growth_mib": round(e["training_growth_estimate"] / 2**20, 1),
                     "estimate_over_measured": round(ratio, 3), "within_25_percent": abs(ratio - 1) <= 0.25})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
