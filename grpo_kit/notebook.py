"""Helpers the course notebooks call, so the notebooks stay about GRPO and not about plumbing.

- `environment()`: Colab / Kaggle / local, and the hardware (TPU board, GPU, CPU).
- `choose_config()`: the preset that fits the hardware, falling back — and saying so — to the embedded tiny
  Gemma when there is no accelerator or the hub cannot be reached / the license was not accepted.
- `quick()`: True when CI runs the notebooks (`GRPO_KIT_QUICK=1`): the same cells with fewer steps.
- `check()`: the exercise checker: prints ✅ or raises with a hint.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from .config import DemoConfig, auto_preset, load_demo_config


def quick() -> bool:
    """Notebook runs in CI set GRPO_KIT_QUICK=1: fewer steps, same code path."""
    return os.environ.get("GRPO_KIT_QUICK") == "1"


def steps(full: int, quick_steps: int) -> int:
    """`full` normally, `quick_steps` under CI."""
    return quick_steps if quick() else full


def environment() -> dict[str, Any]:
    """Where this notebook runs and on what."""
    from .device import detect_accelerator

    return {
        "colab": "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ,
        "kaggle": "KAGGLE_KERNEL_RUN_TYPE" in os.environ,
        "hardware": detect_accelerator(),
        "python": sys.version.split()[0],
    }


def hub_model_reachable(name: str, token: str | None = None) -> tuple[bool, str]:
    """Can `name` be downloaded from here? (a local directory always can). Returns (ok, reason)."""
    if name == "tiny-gemma" or Path(name).is_dir():
        return True, "local"
    try:
        from huggingface_hub import model_info

        from .models import hf_token

        model_info(name, token=hf_token(token), timeout=10)
    except Exception as e:  # noqa: BLE001 - offline, gated, unknown: all mean "cannot use it here"
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return True, "hub"


def choose_config(preset: str = "auto", model: str | None = None) -> DemoConfig:
    """The config for this hardware; the tiny Gemma when there is no accelerator or no hub access."""
    name = auto_preset() if preset == "auto" else preset
    cfg = load_demo_config(name)
    if model:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=model))
    ok, why = hub_model_reachable(cfg.model.name, cfg.model.hf_token)
    if not ok:
        print(f"⚠️  {cfg.model.name} cannot be loaded here ({why}).\n"
              "    Falling back to the embedded tiny Gemma (cpu-tiny preset): every cell still runs.\n"
              "    For real Gemma: accept the license on its Hugging Face page and set HF_TOKEN (Colab: a secret).")
        cfg = load_demo_config("cpu-tiny")
    print(f"preset {name if ok else 'cpu-tiny'} · model {cfg.model.name} · hardware {environment()['hardware']}")
    return cfg


def check(condition: bool, hint: str) -> None:
    """Exercise checker: ✅ when `condition` holds, else an AssertionError carrying the hint."""
    if not condition:
        raise AssertionError(f"Not yet: {hint}")
    print("✅ correct")
