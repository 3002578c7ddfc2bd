"""How the CPU multiplies the engine's frozen weights: in bf16 where that is the faster (`cpu_bf16_products`,
`product_dtype`), and through weights reordered once into oneDNN's blocked layout for a decode step's few rows
(`prepack_weight`, `prepacked_linear`); plus the CPU facts those choices read (/proc/cpuinfo) and the denormal
setting every CPU run takes at import (`flush_denormals`)."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import torch


def flush_denormals() -> bool:
    """Have this process's CPU arithmetic treat denormal floats (magnitudes below 1.2e-38, in fp32 and bf16) as zero;
    returns whether the CPU can (`torch.set_flush_denormal`).

    Why: a model that has memorised its demonstrations (a few dozen worked solutions after a few dozen SFT steps)
    has gradients and Adam moments that small, and x86 CPUs compute with denormals many times slower
    (docs/cpu_choices.md). Values that small are far below anything a loss or an update resolves.

    The setting is per thread, and OpenMP's worker threads take it from the thread that starts them, so importing
    grpo_kit sets it before torch's first parallel work. Called after that work, it reaches only the calling thread."""
    return torch.set_flush_denormal(True)


flush_denormals()  # at import: before torch starts its CPU worker threads (see the docstring)


@functools.cache
def cpuinfo_field(name: str) -> str:
    """The first value of `name` in Linux's /proc/cpuinfo ("vendor_id", "model name"), read once per process; ""
    where the file does not say."""
    try:
        return next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.split(":", 1)[0].strip() == name), "")
    except OSError:
        return ""


def cpu_vendor() -> str:
    """The CPU's vendor as Linux names it ("GenuineIntel", "AuthenticAMD"); "" where /proc/cpuinfo does not say."""
    return cpuinfo_field("vendor_id")


def cpu_bf16_products() -> bool:
    """Are bf16 weight products faster than fp32 on this CPU (through oneDNN, accumulating in fp32)? True with AMX
    tiles, and with AVX512-BF16 on an AMD CPU, where a bf16 product runs several times faster than fp32. An Intel CPU
    with AVX512-BF16 but no AMX multiplies bf16 slower than fp32, and a CPU without AVX512-BF16 emulates it: there the
    kit stays fp32 (docs/cpu_choices.md has the measurements). Read at run time, so the same code picks fp32 on an
    AVX2-only laptop. GRPO_KIT_CPU_BF16=0 turns it off everywhere (fp32)."""
    if os.environ.get("GRPO_KIT_CPU_BF16", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    if torch.cpu._is_amx_tile_supported():
        return True
    return bool(torch.cpu._is_avx512_bf16_supported()) and cpu_vendor() == "AuthenticAMD"


PREPACK_MAX_ROWS = 64
"""Rows up to which a decode step's products run through prepacked weights (`prepacked_linear`): a GRPO step's rows
and an evaluation batch's (64). Larger batches run through the plain weights, where oneDNN's kernel for a prepacked
bf16 weight is the slower (docs/cpu_choices.md); a prefill's products always do (`decoder.Constants.prepack`)."""


def cpu_prepacked_products() -> bool:
    """Do the eager CPU sampler's products with frozen weights run through oneDNN with each weight reordered once
    (`prepack_weight`, `prepacked_linear`) instead of `F.linear` / `torch.mm`, which repack the weight on every call?
    For a decode step's few rows the repacking costs about as much as the product (docs/cpu_choices.md). Same products
    up to float summation order. Any x86-64 CPU with oneDNN (every PyPI x86 wheel); GRPO_KIT_CPU_PREPACK=0 turns it off
    (the products then run plainly)."""
    if os.environ.get("GRPO_KIT_CPU_PREPACK", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    return platform.machine().lower() in ("x86_64", "amd64") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def onednn_has_bf16() -> bool:
    """Does oneDNN have bf16 kernels on this CPU (AVX512 BW/VL/DQ or AVX-NE-CONVERT)? Not on an AVX2-only one (most
    laptops), where a bf16 weight cannot be prepacked and its products stay plain."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def prepack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """W (out, in) reordered once into oneDNN's blocked layout for `prepacked_linear` (an opaque tensor of the same
    size, not differentiable: rollouts only), or None where products stay plain (not on the CPU, not fp32 or bf16,
    `cpu_prepacked_products` off, or a bf16 W on a CPU where oneDNN has no bf16 kernel: an AVX2-only one, whose
    reorder raises "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq")."""
    if (weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in (torch.float32, torch.bfloat16)
            or not cpu_prepacked_products()):
        return None
    if weight.dtype == torch.bfloat16 and not onednn_has_bf16():
        return None
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)  # 32: the layout for a decode step's rows


def prepacked_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b (x (…, in) in W's dtype) with W from `prepack_weight`; returns (…, out) in that dtype."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr="none", scalars=[], algorithm="")


def product_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the eager CPU sampler multiplies a weight in — its layers' projections and the LM head
    (`decoder.Constants`, `streamed_head.draw_from_head`): bf16 for fp32 weights on a CPU with native
    bf16 products (`cpu_bf16_products`), else the weight's own dtype. Norms, residual sums, softmax, sums and
    log-probs stay in fp32 either way."""
    if weight.device.type == "cpu" and weight.dtype == torch.float32 and cpu_bf16_products():
        return torch.bfloat16
    return weight.dtype

