"""Atomic checkpoints: weights (or the LoRA adapter), optimizer, RNG states, step and metrics history.

A checkpoint is a directory written under a temporary name and renamed into place, so a crash mid-save
never leaves a half-written checkpoint where a resume would find it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Trainable state: the adapter under LoRA, else all weights (tied embeddings stored once)."""
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
    else:
        state, seen = {}, set()
        for name, tensor in model.state_dict().items():
            if tensor.data_ptr() in seen and "lm_head" in name:
                continue
            seen.add(tensor.data_ptr())
            state[name] = tensor
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    extra: dict[str, Any] | None = None,
    generator: torch.Generator | None = None,
) -> Path:
    """Write `path/` atomically: weights.safetensors, optimizer.pt, state.json (step, extra), rng.pt."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file(_weights(model), str(tmp / "weights.safetensors"))
        if optimizer is not None:
            torch.save(_to_cpu(optimizer.state_dict()), tmp / "optimizer.pt")
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if generator is not None:
            rng["generator"] = generator.get_state()
        torch.save(rng, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}, indent=2))
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, Any]:
    """Restore what `save_checkpoint` wrote; returns state.json's contents (step and extras)."""
    path = Path(path)
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"{path} is not a grpo_kit checkpoint (no state.json)")
    device = next(model.parameters()).device
    weights = load_file(str(path / "weights.safetensors"))
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, {k: v.to(device) for k, v in weights.items()})
    else:
        missing, unexpected = model.load_state_dict({k: v.to(device) for k, v in weights.items()}, strict=False)
        missing = [m for m in missing if "lm_head" not in m]
        if missing or unexpected:
            raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if optimizer is not None and (path / "optimizer.pt").exists():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=False))
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if generator is not None and "generator" in rng:
        generator.set_state(rng["generator"])
    return json.loads((path / "state.json").read_text())
