"""Crash-safe checkpoints: weights (or the LoRA adapter), optimizer, RNG states and step, with no pickle.

A checkpoint is a directory written under a temporary name, fsynced and swapped into place, so a crash mid-save
never leaves a half-written checkpoint where a resume would find it; loading verifies every file's checksum and
reads tensor files with `weights_only=True`, so a checkpoint from elsewhere cannot run code.

Full fine-tuning over a TPU pod slice's hosts holds each weight split over every host's chips, which no host can
gather: there every host writes the shards its chips hold into the checkpoint's `sharded/` folder
(`torch.distributed.checkpoint` with torch_xla's SPMD planner) and the main host writes the rest. Such a checkpoint
loads shard by shard on the hosts of a pod, and whole on one machine (a resume in one process, `grpo-kit export`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import re
import secrets
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..engine import sharding
from ..engine.device import is_xla, reshard_after_load
from ..engine.distributed import World, broadcast
from ..engine.models import is_lora

SHARDED = "sharded"
"""The folder of a checkpoint written over a pod slice's hosts (`spans_hosts`) that holds its weights, optimizer
state and modules as `torch.distributed.checkpoint` files: `weights/<name>`, `optimizer/<index>/<field>` (the
optimizer's state in `optimizer.state_dict()`'s numbering; its settings stay in optimizer.pt) and `<module>/<name>`."""


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


@dataclass
class WholeStates:
    """What a checkpoint holds, gathered whole on the main process for a sharded model (`engine.sharding`; empty on
    the others)."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    modules: dict[str, dict[str, torch.Tensor]]


def whole_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 modules: dict[str, torch.nn.Module] | None = None) -> WholeStates:
    """The sharded `model`'s weights, `optimizer`'s state and each of `modules`' weights, gathered on the main process
    in an unsharded run's layout. Every process must call it."""
    return WholeStates(
        weights=_tied_once(model, sharding.full_weights(model)),
        optimizer=sharding.full_optimizer_state(model, optimizer) if optimizer is not None else None,
        modules={name: _tied_once(m, sharding.full_weights(m)) for name, m in (modules or {}).items()},
    )


def _tied_once(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the LM head when `module` ties it to the embeddings (stored once, as the embeddings)."""
    tied = getattr(getattr(module, "config", None), "tie_word_embeddings", False)
    return {k: v for k, v in state.items() if not (tied and "lm_head" in k)}


def spans_hosts(model: torch.nn.Module, world: World) -> bool:
    """`model` is fully fine-tuned by the hosts of one SPMD program (a pod slice): its trainable weights are split over
    every host's chips, so its checkpoints are written by every host (`SHARDED`). LoRA's adapter is replicated on
    every chip, and the main host writes it alone."""
    return world.size > 1 and not world.splits_batch and not is_lora(model)


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
    return state


TMP_PREFIX = ".tmp-"
"""Checkpoints are written to `<parent>/.tmp-<name>-<8 hex digits>` first; leftovers of that exact form (a killed
save of this checkpoint, not of another one in the same folder) are removed at the next save."""


def temporary_names(path: Path) -> re.Pattern[str]:
    """The names a save of the checkpoint at `path` writes to first (`.tmp-<name>-<8 hex digits>`)."""
    return re.compile(rf"^{re.escape(TMP_PREFIX)}{re.escape(path.name)}-[0-9a-f]{{8}}$")


def _is_checkpoint(path: Path) -> bool:
    return (path / "state.json").is_file()


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (a full disk, a quota, a file-size limit); the previous one is intact."""

    def __str__(self) -> str:
        return str(self.strerror)


def previous_path(path: Path) -> Path:
    """Where a save puts the checkpoint it replaces during the swap (`.<name>.old`)."""
    return path.with_name(f".{path.name}.old")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_whole(path: Path, text: str, *, tmp: Path | None = None) -> None:
    """Write `text` to `path` whole or not at all: into `tmp` (default `.<name>.tmp` beside it; the same file system),
    then swapped in with one rename, so a kill leaves the old file or the new one, never half of one."""
    tmp = tmp or path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to disk, so a power cut or kill cannot leave it empty."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    extra: dict[str, Any] | None = None,
    generator: torch.Generator | None = None,
    modules: dict[str, torch.nn.Module] | None = None,
    world: World | None = None,
) -> Path:
    """Write `path/`: weights.safetensors, optimizer.pt and rng.pt (tensors, loaded back without pickle),
    `<name>.safetensors` for each of `modules` (state that cannot be rebuilt from the base, e.g. an EMA
    reference policy), and state.json (step, `extra`, the SHA-256 of every file). Written to a temporary directory,
    fsynced, then swapped in: a valid checkpoint exists at every instant (during the swap the previous one sits at
    `.<name>.old`, where `load_checkpoint` finds it). Returns `path`.

    With the `world` of several processes every one of them calls it, and the main one writes: a sharded model's
    weights and optimizer state are first gathered to it whole (`engine.sharding`), and with full fine-tuning over a
    pod slice's hosts (`spans_hosts`) every host writes its chips' shards of the tensors into `sharded/`."""
    path, world = Path(path), world or World()
    record = {"step": step, **(extra or {})}
    if spans_hosts(model, world):
        return _save_over_hosts(path, model, optimizer, record, generator=generator, modules=modules or {},
                                world=world)
    whole = whole_states(model, optimizer, modules) if sharding.is_sharded(model) else None
    if not world.is_main:
        return path
    tmp = _temporary(path)
    _write_and_swap(path, tmp, record,
                    write=lambda: _write_files(tmp, whole or _states(model, optimizer, modules or {}),
                                               generator=generator))
    return path


def _temporary(path: Path) -> Path:
    """A new temporary directory beside `path` to write its checkpoint into, after refusing a `path` that is not a
    checkpoint and removing what killed saves of this checkpoint left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if (path.exists() or path.is_symlink()) and not _is_checkpoint(path):
        raise FileExistsError(f"{path} exists and is not a grpo_kit checkpoint: choose another path (the kit replaces "
                              "only checkpoints it wrote)")
    leftovers = temporary_names(path)
    for leftover in path.parent.iterdir():  # a save of this checkpoint that was killed
        if leftovers.match(leftover.name) and leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def _write_and_swap(path: Path, tmp: Path, record: dict[str, Any], *, write: Callable[[], None]) -> None:
    """`write()` the files into `tmp`, add state.json (`record` and the SHA-256 of every file, those in folders
    too), fsync them all, then swap `tmp` in at `path`. A failure removes `tmp` and raises `CheckpointSaveError`."""
    try:
        write()
        files = {f.relative_to(tmp).as_posix(): _sha256(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        (tmp / "state.json").write_text(json.dumps({**record, "files": files}, indent=2, default=str))
        for f in [*tmp.rglob("*"), tmp]:
            _fsync(f)
    except Exception as e:  # noqa: BLE001 - safetensors, torch.save and the OS each raise their own type on a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_error(path, e) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    previous = previous_path(path)
    if path.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(path, previous)
    os.replace(tmp, path)
    _fsync(path.parent)
    shutil.rmtree(previous, ignore_errors=True)


def _save_over_hosts(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                     record: dict[str, Any], *, generator: torch.Generator | None,
                     modules: dict[str, torch.nn.Module], world: World) -> Path:
    """A checkpoint of full fine-tuning over a pod slice's hosts (`spans_hosts`), written by all of them: the main host
    makes the temporary directory (in the output directory every host mounts), every host writes its chips' shards
    into its `sharded/` folder, and the main host adds the RNG states, the optimizer's settings and state.json and
    swaps it in. Every host must call it; a failure on any host raises on all of them."""
    import torch.distributed.checkpoint as dcp
    import torch_xla
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    tmp = _on_main(world, lambda: _temporary(path))
    torch_xla.sync(wait=True)  # the planner reads each tensor's shards, which must not be still computing
    try:
        with warnings.catch_warnings():  # torch_xla's planner predates an argument torch's storage layer now passes
            warnings.filterwarnings("ignore", message=".*set_up_planner has been updated")
            dcp.save(_sharded_entries(model, optimizer, modules), storage_writer=dcp.FileSystemWriter(tmp / SHARDED),
                     planner=SPMDSavePlanner())
    except Exception as e:  # noqa: BLE001 - the storage layer re-raises every host's error as one CheckpointException
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _save_error(path, e) from e
    settings = {"state": {}, "param_groups": optimizer.state_dict()["param_groups"]} if optimizer is not None else None
    states = WholeStates(weights={}, optimizer=settings, modules={})
    _on_main(world, lambda: _write_and_swap(path, tmp, record,
                                            write=lambda: _write_files(tmp, states, generator=generator)))
    return path


def _on_main(world: World, work: Callable[[], Any]) -> Any:
    """`work()` on the main process, its result on every process; an error there is raised on every process (the
    main one's own, a `CheckpointSaveError` naming it elsewhere), so no process waits for one that stopped."""
    result, error = None, None
    if world.is_main:
        try:
            result = work()
        except Exception as e:  # noqa: BLE001 - whatever stopped the main process stops every process
            error = e
    ok, value = broadcast((error is None, result if error is None else f"{type(error).__name__}: {error}"), world)
    if error is not None:
        raise error
    if not ok:
        raise CheckpointSaveError(errno.EIO, f"the main process could not save the checkpoint: {value}")
    return value


def _sharded_entries(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                     modules: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """What `SHARDED` holds, by its names there: the live tensors (each host's chips hold their shards)."""
    entries = {f"weights/{k}": v for k, v in _tied_once(model, model.state_dict()).items()}
    if optimizer is not None:
        entries.update({f"optimizer/{key}": value for key, value in _flat_optimizer_state(optimizer).items()})
    for name, module in modules.items():
        entries.update({f"{name}/{k}": v for k, v in _tied_once(module, module.state_dict()).items()})
    return entries


def _flat_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's state tensors by `<index>/<field>` (`optimizer.state_dict()`'s numbering), as `SHARDED` names
    them under `optimizer/`."""
    return {f"{index}/{field}": value for index, state in optimizer.state_dict()["state"].items()
            for field, value in state.items()}


def _states(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
            modules: dict[str, torch.nn.Module]) -> WholeStates:
    """What a checkpoint of an unsharded model holds, read from it."""
    return WholeStates(weights=_weights(model), optimizer=optimizer.state_dict() if optimizer is not None else None,
                       modules={name: _weights(module) for name, module in modules.items()})


def _write_files(tmp: Path, states: WholeStates, *, generator: torch.Generator | None) -> None:
    """A checkpoint's files but state.json, into the temporary directory `tmp`."""
    if states.weights:  # none over a pod's hosts: they are in `SHARDED`
        save_file({k: v.detach().cpu().contiguous() for k, v in states.weights.items()},
                  str(tmp / "weights.safetensors"))
    for name, weights in states.modules.items():
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(tmp / f"{name}.safetensors"))
    if states.optimizer is not None:
        torch.save(_to_cpu(states.optimizer), tmp / "optimizer.pt")
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if generator is not None:
        rng["generator"] = generator.get_state()
    torch.save(rng, tmp / "rng.pt")


def _save_error(path: Path, e: Exception) -> CheckpointSaveError:
    """The one-line error of a failed save: the checkpoint, the cause, the free space, whether an earlier one is
    kept, and what to do."""
    free = _human(shutil.disk_usage(path.parent).free)
    kept = ("the previous checkpoint is kept" if _is_checkpoint(path) or _is_checkpoint(previous_path(path))
            else "there is no earlier checkpoint")
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    return CheckpointSaveError(getattr(e, "errno", None) or errno.EIO,
                               f"could not save the checkpoint {path} ({type(e).__name__}: {why}); {free} free "
                               f"on that disk; {kept}. Free space there, or choose another output directory, "
                               "then run the same command again to continue")


def checkpoint_state(path: str | Path, *, verify: bool = True) -> tuple[Path, dict[str, Any]]:
    """(the directory to load, its state.json) for the checkpoint at `path`; the previous one (`.<name>.old`) when
    a save was interrupted mid-swap, with a warning. With `verify`, every file's checksum is checked (reading
    every byte: callers that only look at state.json pass False, and `load_checkpoint` verifies)."""
    path = Path(path)
    if not _is_checkpoint(path) and _is_checkpoint(previous_path(path)):
        warnings.warn(
            f"{path} is missing (a save was interrupted): loading the previous checkpoint {previous_path(path)}",
            stacklevel=2)
        path = previous_path(path)
    if not _is_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a grpo_kit checkpoint (no state.json)")
    state = json.loads((path / "state.json").read_text())
    if verify:
        if not isinstance(state.get("files"), dict):
            raise ValueError(
                f"checkpoint {path} has no file manifest (damaged or altered), so its files cannot be checked: "
                "load a checkpoint grpo_kit saved whole, or train again"
            )
        missing = [name for name in state["files"] if not (path / name).exists()]
        if missing:
            raise ValueError(f"checkpoint {path} is missing {', '.join(missing)} (incomplete copy?)")
        for name, digest in state["files"].items():
            if _sha256(path / name) != digest:
                raise ValueError(f"checkpoint {path}: {name} does not match its checksum (corrupt or altered)")
    return path, state


def _tensors_only(path: Path, device: torch.device | str = "cpu") -> Any:
    """torch.load without pickle's code execution: tensors, numbers, strings and containers only."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"refusing to load {path}: it holds more than tensors and plain values "
                         f"(loading it would run code from the file): {str(e).splitlines()[0]}") from None


def refuse_arc_adapter(path: str | Path) -> None:
    """Raise when the checkpoint at `path` is a LoRA adapter that an arc (`course.arc.Arc`) trained over its merged SFT
    model (state.json's `adapter_over`): loaded over the preset's bare model it would be a model without its SFT.
    The arc's own copy (`ARC/<phase>/final`, or the arc's directory) loads with its SFT."""
    state = checkpoint_state(path, verify=False)[1]
    if state.get("adapter_over") == "sft":
        raise ValueError(f"{path} is a LoRA adapter that the arc in {state.get('arc')} trained over its SFT model, "
                         f"which this model lacks: give the arc's own copy, {state.get('arc')}/{state.get('phase')}"
                         "/final (it loads with its SFT)")


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
    *,
    kind: str | None = None,
    modules: dict[str, torch.nn.Module] | None = None,
) -> dict[str, Any]:
    """Restore what `save_checkpoint` wrote; returns state.json's contents (step and extras). `kind` ("sft" or
    "grpo") refuses a checkpoint of the other kind; each of `modules` is loaded from its `<name>.safetensors`."""
    path, state = checkpoint_state(path)
    if kind is not None and state.get("kind", kind) != kind:
        raise ValueError(f"{path} is a {state['kind']} checkpoint, not a {kind} one"
                         + (": start GRPO from it with --init-from, not --resume" if kind == "grpo" else ""))
    listed, over_hosts = state["files"], (path / SHARDED).is_dir()
    needed = ["rng.pt"] + ([f"{SHARDED}/.metadata"] if over_hosts else
                           ["weights.safetensors", *(f"{name}.safetensors" for name in modules or {})])
    needed += ["optimizer.pt"] if optimizer is not None else []
    unlisted = [name for name in needed if name not in listed]
    if unlisted:
        hint = ("; it was saved without optimizer state: start from its weights with --init-from instead of resuming"
                if unlisted == ["optimizer.pt"] else " (saved with other settings?)")
        raise ValueError(f"checkpoint {path} has no {', '.join(unlisted)}{hint}")
    if over_hosts and optimizer is not None and _reads_shards(model) and not optimizer.state:
        # the shards are read into the optimizer's own state, which a step makes (before the weights are loaded: the
        # step moves them)
        from torch_xla.experimental.distributed_checkpoint import prime_optimizer

        prime_optimizer(optimizer).zero_grad(set_to_none=True)
    _load_weights(path, "weights", model)
    for name, module in (modules or {}).items():
        _load_weights(path, name, module)
    if optimizer is not None:
        # read to the host: torch.load cannot place tensors on an XLA device, and the optimizer moves its state to
        # each parameter's device itself
        saved = _tensors_only(path / "optimizer.pt")
        if over_hosts:
            saved["state"] = _sharded_optimizer_state(path, model, optimizer)
        if sharding.is_sharded(model):
            sharding.load_full_optimizer_state(model, optimizer, saved)
        else:
            optimizer.load_state_dict(saved)
    reshard_after_load(model, optimizer, copies=(modules or {}).values())
    rng = _tensors_only(path / "rng.pt")
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_tuples(rng["python"]))
    if generator is not None and "generator" in rng:
        generator.set_state(rng["generator"])
    return state


def _load_weights(path: Path, name: str, model: torch.nn.Module) -> None:
    """`path/<name>.safetensors` (or `<name>/` in `SHARDED`) into `model` (into its adapter under LoRA), refusing
    weights that do not fit."""
    if (path / SHARDED).is_dir():
        live = _tied_once(model, model.state_dict()) if _reads_shards(model) else None
        weights = _read_sharded(path, name, live)
    else:
        weights = load_file(str(path / f"{name}.safetensors"))
    if not sharding.is_sharded(model):  # sharded: each process copies its shard from the host
        device = next(model.parameters()).device
        weights = {k: v.to(device) for k, v in weights.items()}
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, weights)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"checkpoint {path}: {name} does not match the LoRA model: unexpected "
                             f"{result.unexpected_keys[:5]} (full weights given to a LoRA model?)")
        return
    if sharding.is_sharded(model):  # each process keeps its shard of the whole weights
        missing, unexpected = sharding.load_full_weights(model, weights)
    else:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if "lm_head" not in m]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path}: {name} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def _reads_shards(model: torch.nn.Module) -> bool:
    """A checkpoint's `SHARDED` tensors are read shard by shard into `model`'s own tensors (its weights are on XLA,
    where SPMD places them; every process of the program must then read together), not whole on the host."""
    return not is_lora(model) and is_xla(next(model.parameters()).device)


def _read_sharded(path: Path, prefix: str, live: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The tensors named `<prefix>/<name>` in the checkpoint's `SHARDED` folder, by `<name>`: read into `live`'s
    tensors of those names (each host reads its chips' shards) when given, else whole on the host."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    folder = path / SHARDED
    saved = {key[len(prefix) + 1:]: meta for key, meta in
             dcp.FileSystemReader(folder).read_metadata().state_dict_metadata.items() if key.startswith(f"{prefix}/")}
    planner, alone = None, True
    if live is None:
        target = {name: torch.empty(meta.size, dtype=meta.properties.dtype) for name, meta in saved.items()}
    else:
        from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner

        unexpected = sorted(saved.keys() - live.keys())
        if unexpected:
            raise ValueError(f"checkpoint {path}: {prefix} does not match the model: unexpected {unexpected[:5]}")
        target = {name: tensor for name, tensor in live.items() if name in saved}  # the model's check names the missing
        planner, alone = SPMDLoadPlanner(), not dist.is_initialized()
    with warnings.catch_warnings():  # reading in one process is meant: torch's storage layer warns that it assumes it
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({f"{prefix}/{k}": v for k, v in target.items()}, storage_reader=dcp.FileSystemReader(folder),
                 planner=planner, no_dist=alone)
    return target


def _sharded_optimizer_state(path: Path, model: torch.nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[int, dict[str, torch.Tensor]]:
    """The optimizer's state from the checkpoint's `SHARDED` folder, in `optimizer.state_dict()`'s numbering."""
    live = _flat_optimizer_state(optimizer) if _reads_shards(model) else None
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in _read_sharded(path, "optimizer", live).items():
        index, field = key.split("/")
        state.setdefault(int(index), {})[field] = value
    return state


def _as_tuples(value: Any) -> Any:
    """random.setstate wants tuples where a round trip may give lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
