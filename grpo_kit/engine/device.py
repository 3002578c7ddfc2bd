"""The one place that knows cpu / cuda / xla.

Everything else calls these functions, so adding a backend (TorchTPU, announced to replace torch_xla) is a
change here only. torch_xla is imported lazily: importing grpo_kit never requires it.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .cpu.products import cpu_bf16_products, cpu_prepacked_products, cpuinfo_field
from .distributed import launched_size, local_rank


class SetupError(RuntimeError):
    """The runtime cannot run what was asked, and the message says how to fix it. Jupyter shows only the
    message (IPython's `_render_traceback_` hook): the frames would say nothing the user can act on."""

    def _render_traceback_(self) -> list[str]:
        return [f"\033[31m{type(self).__name__}: {self}\033[0m"]


def xla_available() -> bool:
    """torch_xla can be imported (it has wheels for Linux x86_64 only)."""
    return xla_problem() is None


def xla_problem() -> str | None:
    """Why torch_xla cannot be used here, naming the fix (None when it imports). torch_xla only works with
    the torch release it was built for: 2.8 with 2.8, 2.9 with 2.9."""
    from importlib.metadata import PackageNotFoundError, version

    torch_release = torch.__version__.split("+")[0]
    try:
        version("torch_xla")
    except PackageNotFoundError:
        same_xla = f"torch_xla[tpu]~={'.'.join(torch_release.split('.')[:2])}.0"
        return (f"torch_xla is not installed: run  %pip install '{same_xla}'  (it must match torch {torch_release}), "
                "then restart the session")
    mismatch = torch_xla_mismatch()
    if mismatch:
        return mismatch
    xla_release = version("torch_xla")
    try:
        import torch_xla  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"; say which
        return f"torch_xla {xla_release} is installed but does not import ({type(exc).__name__}: {exc})"
    return None


def torch_xla_mismatch() -> str | None:
    """A torch_xla built for another torch release is installed (read from the package metadata, without importing
    it): the fix, or None. transformers imports torch_xla whenever it is installed, so such a pair breaks imports
    long before a device is asked for; `import grpo_kit` raises this as a SetupError first."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        xla_release = version("torch_xla")
    except PackageNotFoundError:
        return None
    torch_release = torch.__version__.split("+")[0]
    if xla_release.split(".")[:2] == torch_release.split(".")[:2]:
        return None
    same_xla = f"torch_xla[tpu]~={'.'.join(torch_release.split('.')[:2])}.0"
    return (f"torch_xla {xla_release} does not match torch {torch_release}: run  %pip install '{same_xla}'  "
            f"(or install torch {'.'.join(xla_release.split('.')[:2])} to match torch_xla), then restart the session")


def tpu_present() -> bool:
    """This is a TPU machine: Colab and Kaggle set TPU_ACCELERATOR_TYPE (e.g. `v5litepod-8`) on their TPU
    runtimes; TPU VMs expose /dev/accel* or /dev/vfio; PJRT_DEVICE=TPU or TPU_NAME say so too. Platform
    replicas stand in for the chips with the XLA CPU client (PJRT_DEVICE=CPU) and still take this path."""
    if os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("TPU_NAME"):
        return True
    if os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        return True
    return any(Path("/dev").glob("accel*")) or Path("/dev/vfio").is_dir() and any(Path("/dev/vfio").iterdir())


def tpu_chips_attached() -> bool:
    """Real TPU chips behind PJRT (not the CPU client standing in for them)."""
    return tpu_present() and os.environ.get("PJRT_DEVICE", "TPU").upper() == "TPU"


def virtual_tpu_devices() -> int:
    """How many XLA CPU devices stand in for a TPU here (PJRT_DEVICE=CPU on a machine that says it is a TPU, as
    the platform replicas do; CPU_NUM_DEVICES of them, default 1); 0 on a real TPU and off XLA. These devices
    share the host's memory, each with its own copy of the weights."""
    if not tpu_present() or os.environ.get("PJRT_DEVICE", "").upper() != "CPU":
        return 0
    return int(os.environ.get("CPU_NUM_DEVICES") or 1)


def xla_device_memory() -> tuple[int, float] | None:
    """(devices, GiB of memory per device) as the TPU runtime reports them, to choose settings for a board without a
    preset; None off real TPU chips, or where the runtime reports no limit."""
    if not (xla_available() and tpu_chips_attached()):
        return None
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    try:
        info = xm.get_memory_info(torch_xla.device())
    except Exception:  # noqa: BLE001 - a runtime that cannot say leaves the choice to the user (the caller says so)
        return None
    limit = info.get("bytes_limit") or info.get("kb_total", 0) * 1024
    return (xr.global_runtime_device_count(), limit / 2**30) if limit else None


TPU_KINDS = {"v2": "v2", "v3": "v3", "v4": "v4", "v5litepod": "v5e", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}


def detect_accelerator() -> str:
    """Name the hardware for picking a preset: `v2-8`, `v3-8`, `v5e-1`, `v5e-8` … on a TPU (from
    TPU_ACCELERATOR_TYPE, which Colab and Kaggle set, e.g. `v5litepod-8`), `cuda` with a GPU, else `cpu`."""
    accel = os.environ.get("TPU_ACCELERATOR_TYPE", "")
    if accel and "-" in accel:
        family, count = accel.rsplit("-", 1)
        return f"{TPU_KINDS.get(family.lower(), family.lower())}-{count}"
    if xla_available() and tpu_present():
        import torch_xla.runtime as xr
        import torch_xla.tpu

        return f"v{torch_xla.tpu.version()}-{xr.global_runtime_device_count()}"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


DEVICE_KINDS = ("auto", "cpu", "cuda", "xla")


def check_device_kind(kind: str | None) -> str:
    """`kind` (or env GRPO_KIT_DEVICE, default auto) in lower case; ValueError naming it when it is not one of
    DEVICE_KINDS (checked before any work, so a typo is reported first)."""
    kind = (kind or os.environ.get("GRPO_KIT_DEVICE") or "auto").lower()
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {kind!r}; choose auto, cpu, cuda or xla")
    return kind


def get_device(kind: str | None = None) -> torch.device:
    """Choose the device: `kind` (or env GRPO_KIT_DEVICE) of cpu / cuda / xla, else automatic:
    xla when torch_xla and a TPU are present, else cuda when available, else cpu.

    On a TPU machine without a working torch_xla this raises `SetupError` naming the fix (a TPU preset must
    never train on the host CPU). On a TPU this also switches on SPMD over all its devices (GRPO_KIT_SPMD=0
    turns that off), so call it before creating any XLA tensor. On the XLA CPU backend (tests) SPMD is only used when
    asked for: `enable_spmd`, or GRPO_KIT_SPMD=1 (over CPU_NUM_DEVICES devices). Under torchrun a CUDA device is
    the process's own GPU (`LOCAL_RANK`)."""
    kind = check_device_kind(kind)
    if kind == "auto":
        if tpu_present():
            problem = xla_problem()
            if problem:  # never fall back to the host CPU silently on a TPU machine
                raise SetupError(f"this is a TPU runtime, but {problem}")
            kind = "xla"
        elif torch.cuda.is_available():
            kind = "cuda"
        else:
            kind = "cpu"
    if kind == "xla":
        problem = xla_problem()
        if problem:
            raise SetupError(f"device 'xla' asked for, but {problem}")
        import torch_xla

        enable_compile_cache()  # a real TPU only: re-runs of a notebook skip most compiles
        spmd = os.environ.get("GRPO_KIT_SPMD", "")
        if _MESH is None and (spmd == "1" or (tpu_present() and spmd != "0")):
            enable_spmd()  # one program over every core (also right for a single-core v5e-1)
        return torch_xla.device()
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU")
    if kind == "cuda" and launched_size() > 1:  # under torchrun: this process's own GPU
        if local_rank() >= torch.cuda.device_count():
            raise SetupError(f"torchrun started process {local_rank()} on this machine, but torch sees "
                             f"{torch.cuda.device_count()} GPU(s): use --nproc-per-node {torch.cuda.device_count()}")
        torch.cuda.set_device(local_rank())
        return torch.device("cuda", local_rank())
    return torch.device(kind)


def is_xla(device: torch.device | str) -> bool:
    return torch.device(device).type == "xla"


def activation_checkpoint(function: Any, *args: Any) -> Any:
    """`function(*args)`, keeping only its inputs for the backward pass, which runs `function` again (activation
    checkpointing). torch's non-reentrant checkpoint looks up a `torch.xla` device module, which torch_xla
    (2.8, 2.9) does not register, and stops with an AttributeError; for XLA tensors torch_xla's own checkpoint
    runs instead."""
    if any(isinstance(a, torch.Tensor) and is_xla(a.device) for a in args):
        from torch_xla.utils.checkpoint import checkpoint as xla_checkpoint

        return xla_checkpoint(function, *args)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(function, *args, use_reentrant=False)


def enable_activation_checkpointing(model: torch.nn.Module, device: torch.device) -> None:
    """Recompute each transformer layer's activations in the backward pass (transformers' gradient
    checkpointing), through `activation_checkpoint`'s XLA-safe choice of checkpoint function."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if is_xla(device):
        from torch_xla.utils.checkpoint import checkpoint as xla_checkpoint

        # transformers calls each layer's `_gradient_checkpointing_func`; it builds torch's, which fails on XLA
        for module in model.modules():
            if hasattr(module, "_gradient_checkpointing_func"):
                module._gradient_checkpointing_func = xla_checkpoint


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on TPU and on GPUs that have it (Gemma overflows in fp16); fp32 on CPU (no fast bf16 on most CPUs)
    and on GPUs without bf16 (T4, P100, V100)."""
    kind = torch.device(device).type
    if kind == "cpu" or (kind == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False)):
        return torch.float32
    return torch.bfloat16



def use_cpu_threads() -> int:
    """Set torch's CPU threads for a run and return the count: OMP_NUM_THREADS where it is set (a shared machine, or
    tests run two at a time), else every CPU `os.cpu_count()` reports."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    count = int(threads) if threads.isdigit() and int(threads) > 0 else (os.cpu_count() or 1)
    torch.set_num_threads(count)
    return count


def compile_supported(device: torch.device) -> bool:
    """Can `torch.compile` (inductor → Triton) build kernels for this GPU? Triton needs compute capability
    7.0 or newer (P100 is 6.0) and the triton package; elsewhere the eager sampler is used."""
    if torch.device(device).type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device) >= (7, 0)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return default_dtype(device)
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype {name!r} not supported; choose auto, float32 or bfloat16 (float16 breaks Gemma)")
    return table[name]


def move_model(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Move (and cast) a model, then re-tie its input and output embeddings.

    `model.to(xla)` silently unties Gemma's `lm_head` and `embed_tokens`, and the gradients then differ from the
    CPU's (`tests/test_xla.py`). Re-tying after every move makes this safe on every backend.
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


@contextmanager
def seeded_cpu_rng(seed: int) -> Iterator[None]:
    """Random draws on the CPU inside the block come from `seed`; the process's own CPU stream is restored after it,
    so what runs later draws as if the block had not run."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def compile_stats() -> dict[str, Any]:
    """XLA graph compilations so far in this process, their total seconds, and ops that fell back to the
    CPU (`aten::*` counters: each one is a device→host→device round trip inside the graph). Zeros without
    torch_xla."""
    if not xla_available():
        return {"compiles": 0, "compile_seconds": 0.0, "fallbacks": {}}
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    fallbacks = {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")}
    if not data:
        return {"compiles": 0, "compile_seconds": 0.0, "fallbacks": fallbacks}
    return {"compiles": int(data[0]), "compile_seconds": float(data[1]) / 1e9, "fallbacks": fallbacks}


def memory_stats(device: torch.device) -> dict[str, Any]:
    """Memory in bytes: the device's in use / peak / limit where the backend reports it (CUDA, TPU), and the
    host process's peak RSS everywhere (on a CPU — and on the XLA CPU client, which keeps no allocator
    stats — that is where the tensors live)."""
    device = torch.device(device)
    out: dict[str, Any] = {}
    if device.type == "cuda":
        out = {"bytes_in_use": torch.cuda.memory_allocated(device),
               "peak_bytes": torch.cuda.max_memory_allocated(device)}
    elif device.type == "xla":
        import torch_xla.core.xla_model as xm

        try:
            info = xm.get_memory_info(device)
        except RuntimeError:  # the XLA CPU client has no allocator stats
            info = {}
        if info:
            out = {"bytes_in_use": info.get("bytes_used"), "peak_bytes": info.get("peak_bytes_used"),
                   "bytes_limit": info.get("bytes_limit")}
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["host_peak_bytes"] = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
    except ImportError:  # Windows
        pass
    return out


def graph_input(value: float, device: torch.device) -> float | torch.Tensor:
    """A number a step feeds to its compiled programs: on XLA a one-element device tensor, elsewhere the number.
    XLA bakes the Python numbers 0 and 1 into a graph as constants (others become inputs), so as a device value a
    β moved from 0 to 0.5 or a temperature moved off 1.0 reuses the compiled programs; the tensor is copied from
    the CPU with one element because torch_xla turns a 0-dim one into a constant as well."""
    return value if host_syncs_are_cheap(device) else torch.tensor([float(value)]).to(device)


def host_syncs_are_cheap(device: torch.device) -> bool:
    """True on cpu/cuda, where reading a device value (`.item()`, `bool(t)`) costs microseconds. False on
    XLA, where it cuts the lazy graph and waits for the device: code must then decide on the device."""
    return not is_xla(device)


def enable_compile_cache(path: str | Path | None = None) -> str | None:
    """Persistent XLA compile cache on a real TPU (not on the CPU client, which cannot deserialize
    executables). Returns the directory used, or None when not enabled."""
    if not (tpu_chips_attached() and xla_available()):
        return None
    import torch_xla.runtime as xr

    target = str(path or Path.home() / ".cache" / "grpo_kit" / "xla")
    try:
        xr.initialize_cache(target, readonly=False)
    except RuntimeError:  # already initialised in this process
        pass
    return target


# ---- SPMD: one program over every core ------------------------------------------------------------------

_MESH: Any = None


def enable_spmd(num_devices: int | None = None) -> Any:
    """Switch torch_xla to SPMD and build a 1-D mesh with a `data` axis over all (or `num_devices`) devices.

    Must run before any XLA tensor exists in the process. Returns the mesh; `shard_batch` and
    `shard_parameters` then place tensors on it. On 1 device it still works (everything replicated).
    """
    global _MESH
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    count = xr.global_runtime_device_count()
    n = num_devices or count
    if n > count:
        raise ValueError(f"SPMD asked for {n} devices but the runtime has {count} (CPU tests: set CPU_NUM_DEVICES={n})")
    _MESH = xs.Mesh(np.arange(n), (n,), ("data",))
    return _MESH


def data_parallel_size() -> int:
    """How many devices share the batch (1 without SPMD)."""
    return int(_MESH.size()) if _MESH is not None else 1


def padded_rows(rows: int, device: torch.device | str) -> int:
    """`rows` rounded up to a multiple of the SPMD mesh size on XLA (every device gets the same share); `rows`
    elsewhere. Generation pads a batch of a few prompts this way and drops the extra rows afterwards."""
    size = data_parallel_size() if is_xla(device) else 1
    return -(-rows // size) * size


def shard_batch(tensor: torch.Tensor) -> torch.Tensor:
    """Split dim 0 (prompts × group) over the mesh's `data` axis; a no-op without SPMD or off XLA."""
    if _MESH is None or not is_xla(tensor.device):
        return tensor
    import torch_xla.distributed.spmd as xs

    if tensor.shape[0] % _MESH.size():
        raise ValueError(f"batch of {tensor.shape[0]} rows cannot be split over {_MESH.size()} devices: "
                         f"make prompts_per_step × group_size and micro_batch_size multiples of {_MESH.size()}")
    xs.mark_sharding(tensor, _MESH, ("data",) + (None,) * (tensor.dim() - 1))
    return tensor


def shard_parameters(model: torch.nn.Module) -> int:
    """FSDP-style placement for full fine-tuning: each trainable matrix split along dim 0 over `data`
    (XLA gathers it for the matmul and reduce-scatters its gradient). Frozen weights (the LoRA base) stay
    replicated. Returns how many parameters were sharded."""
    if _MESH is None:
        return 0
    import torch_xla.distributed.spmd as xs

    sharded = 0
    for p in model.parameters():
        if _splits(p):
            xs.mark_sharding(p, _MESH, ("data", None))
            sharded += 1
    return sharded


def _splits(p: torch.Tensor) -> bool:
    """`shard_parameters` splits this parameter over the mesh (a trainable XLA matrix whose rows divide evenly)."""
    n = _MESH.size()
    return p.requires_grad and is_xla(p.device) and p.dim() == 2 and p.shape[0] % n == 0 and n > 1


def reshard_after_load(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                       copies: Iterable[torch.nn.Module] = ()) -> None:
    """Split `model`'s weights over the mesh again, `optimizer`'s moments like their weights, and the weights of
    each of `copies` (frozen copies of `model` with its parameter names: an EMA reference policy) like `model`'s,
    after values were loaded into them from the host (a checkpoint): `load_state_dict` replaces an XLA tensor's data
    with the host copy, which is replicated on every device, so full fine-tuning would otherwise hold whole weights,
    gradients, moments and reference on every chip from then on (and compile other programs than the run it
    resumes). A no-op without SPMD."""
    if _MESH is None:
        return
    import torch_xla.distributed.spmd as xs

    shard_parameters(model)
    for p, state in (optimizer.state.items() if optimizer is not None else ()):
        for value in state.values():
            if _splits(p) and isinstance(value, torch.Tensor) and value.shape == p.shape:
                xs.mark_sharding(value, _MESH, ("data", None))
    split = {name for name, p in model.named_parameters() if _splits(p)}
    for frozen in copies:
        for name, p in frozen.named_parameters():
            if name in split:
                xs.mark_sharding(p, _MESH, ("data", None))


# ---- the compile monitor ----------------------------------------------------------------------------------


class CompileMonitor:
    """Counts XLA compilations and compile seconds per phase (prefill, decode, logprob, train, ...).

    Wrap each phase in `with monitor.phase("decode", batch=..., prompt_len=...)`; the phase must end at a
    sync point (`mark_step`), where XLA compiles. Keyword arguments describe the shapes the phase runs
    with. After `end_warmup()` any new compilation is a warning naming the phase and the shape that
    changed. Ops that fall back to the CPU are counted per phase too (`fallbacks`). Off XLA every count stays 0 and the
    monitor costs nothing.
    """

    def __init__(self) -> None:
        self.compiles: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.shapes: dict[str, set[tuple]] = {}
        self.recompiles_after_warmup = 0
        self.fallbacks: dict[str, int] = {}
        self.warm = False
        self.warnings: list[str] = []

    @contextmanager
    def phase(self, name: str, **shape: Any) -> Iterator[None]:
        before = compile_stats()
        try:
            yield
        finally:
            after = compile_stats()
            new = after["compiles"] - before["compiles"]
            for op, count in after["fallbacks"].items():
                if count - before["fallbacks"].get(op, 0):
                    self.fallbacks[f"{name}:{op}"] = (
                        self.fallbacks.get(f"{name}:{op}", 0) + count - before["fallbacks"].get(op, 0))
            self.compiles[name] = self.compiles.get(name, 0) + new
            self.seconds[name] = self.seconds.get(name, 0.0) + after["compile_seconds"] - before["compile_seconds"]
            key = tuple(sorted(shape.items()))
            seen = self.shapes.setdefault(name, set())
            if new and self.warm:
                self.recompiles_after_warmup += new
                old = ", ".join(str(dict(s)) for s in sorted(seen)) or "none"
                changed = (
                    "a shape not seen before"
                    if key not in seen
                    else "the same shapes (something else changed: a Python value baked into the graph?)"
                )
                message = (
                    f"XLA recompiled {new} graph(s) after warm-up in phase '{name}' with {dict(key)} — {changed}; "
                    f"seen before: {old}"
                )
                self.warnings.append(message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            seen.add(key)

    def end_warmup(self) -> None:
        self.warm = True

    def total(self) -> int:
        return sum(self.compiles.values())

    def metrics(self) -> dict[str, Any]:
        """Flat metrics for a step row: per-phase compile counts and seconds, totals, recompiles."""
        out: dict[str, Any] = {f"xla_compiles/{k}": v for k, v in self.compiles.items()}
        out.update({f"xla_compile_seconds/{k}": round(v, 3) for k, v in self.seconds.items()})
        out["xla_compiles_total"] = self.total()
        out["xla_recompiles_after_warmup"] = self.recompiles_after_warmup
        out["xla_cpu_fallbacks"] = sum(self.fallbacks.values())
        return out


_MONITOR = CompileMonitor()


def compile_monitor() -> CompileMonitor:
    """The process-wide monitor (XLA's compile counter is process-wide too)."""
    return _MONITOR


def guarded_optimizer_step(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], *, grad_norm: torch.Tensor, loss: torch.Tensor
) -> torch.Tensor:
    """Step the optimizer unless the gradient or loss is non-finite; returns 1.0 (on the device) if it was not.

    On cpu/cuda the bad update is skipped outright, so it cannot poison the weights or Adam's moments. On XLA a
    host decision would cut the graph and wait for the device, so the bad gradient is zeroed on the device
    instead (Adam's momentum still moves the weights a little that step)."""
    finite = torch.isfinite(grad_norm) & torch.isfinite(loss)
    if host_syncs_are_cheap(grad_norm.device):
        if bool(finite):
            optimizer.step()
    else:
        for p in params:
            if p.grad is not None:
                p.grad.copy_(torch.where(finite, p.grad, torch.zeros_like(p.grad)))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return (~finite).float()



def describe_machine() -> dict[str, Any]:
    """What a published number depends on: the CPU (model, cores, torch's kernel level, AMX tiles, whether the kit's
    weight products run in bf16), threads, and the Python, torch and transformers versions. `cpu_family_model`
    ("25/17": /proc/cpuinfo's cpu family and model) tells apart CPUs that share a model name (docs/cpu_choices.md)."""
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_amx": torch.cpu._is_amx_tile_supported(),
            "cpu_bf16_products": cpu_bf16_products(), "cpu_prepacked_products": cpu_prepacked_products(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    if model := cpuinfo_field("model name"):
        info["cpu_model"] = model
    if (family := cpuinfo_field("cpu family")) and (number := cpuinfo_field("model")):
        info["cpu_family_model"] = f"{family}/{number}"
    return info
