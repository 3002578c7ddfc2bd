"""The one place that knows cpu / cuda / xla.

Everything else calls these functions, so adding a backend (TorchTPU, announced to replace torch_xla) is a
change here only. torch_xla is imported lazily: importing grpo_kit never requires it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def xla_available() -> bool:
    """torch_xla can be imported (it has wheels for Linux x86_64 only)."""
    try:
        import torch_xla  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


def tpu_present() -> bool:
    """A TPU is attached (Colab/Kaggle TPU VMs expose /dev/accel* or /dev/vfio; PJRT_DEVICE=TPU says so)."""
    if os.environ.get("PJRT_DEVICE", "").upper() == "TPU" or os.environ.get("TPU_NAME"):
        return True
    return any(Path("/dev").glob("accel*")) or Path("/dev/vfio").is_dir() and any(Path("/dev/vfio").iterdir())


def get_device(kind: str | None = None) -> torch.device:
    """Choose the device: `kind` (or env GRPO_KIT_DEVICE) of cpu / cuda / xla, else automatic:
    xla when torch_xla and a TPU are present, else cuda when available, else cpu."""
    kind = (kind or os.environ.get("GRPO_KIT_DEVICE") or "auto").lower()
    if kind == "auto":
        if xla_available() and tpu_present():
            kind = "xla"
        elif torch.cuda.is_available():
            kind = "cuda"
        else:
            kind = "cpu"
    if kind == "xla":
        if not xla_available():
            raise RuntimeError("device 'xla' asked for, but torch_xla is not installed: pip install 'grpo-kit[tpu]'")
        import torch_xla

        return torch_xla.device()
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"unknown device kind {kind!r}; choose auto, cpu, cuda or xla")
    return torch.device(kind)


def is_xla(device: torch.device | str) -> bool:
    return torch.device(device).type == "xla"


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on TPU and GPU (Gemma overflows in fp16), fp32 on CPU (no fast bf16 on most CPUs)."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return default_dtype(device)
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype {name!r} not supported; choose auto, float32 or bfloat16 (float16 breaks Gemma)")
    return table[name]


def move_model(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Move (and cast) a model, then re-tie its input and output embeddings.

    `model.to(xla)` silently unties Gemma's `lm_head` and `embed_tokens`; gradients then differ from CPU by
    up to 49 %. Re-tying after every move makes this safe on every backend.
    """
    model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "tie_word_embeddings", False) and hasattr(base, "tie_weights"):
        base.tie_weights()
    return model


def mark_step(device: torch.device) -> None:
    """End the current lazy graph on XLA (compile/run it); a no-op elsewhere. Call once per decode step and
    once per optimizer step."""
    if is_xla(device):
        import torch_xla

        torch_xla.sync()


def manual_seed(seed: int, device: torch.device) -> None:
    torch.manual_seed(seed)
    if is_xla(device):
        import torch_xla

        torch_xla.manual_seed(seed)


def compile_stats() -> dict[str, float]:
    """XLA graph compilations so far in this process and their total seconds (zeros without torch_xla)."""
    if not xla_available():
        return {"compiles": 0, "compile_seconds": 0.0}
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    if not data:
        return {"compiles": 0, "compile_seconds": 0.0}
    return {"compiles": int(data[0]), "compile_seconds": float(data[1]) / 1e9}


def memory_stats(device: torch.device) -> dict[str, Any]:
    """Device memory in use and peak, in bytes, where the backend reports it (empty dict on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return {"bytes_in_use": torch.cuda.memory_allocated(device), "peak_bytes": torch.cuda.max_memory_allocated(device)}
    if device.type == "xla":
        import torch_xla.core.xla_model as xm

        info = xm.get_memory_info(device)
        return {"bytes_in_use": info.get("bytes_used"), "peak_bytes": info.get("peak_bytes_used"), "bytes_limit": info.get("bytes_limit")}
    return {}
