"""Full fine-tuning over torchrun's processes, each holding 1/N of the weights, gradients and AdamW moments: PyTorch's
FSDP2 (`torch.distributed.fsdp.fully_shard`) over each decoder layer and over the model (embeddings, final norm and
the LM head tied to them), along one mesh of all the processes.

Per process that is (weights + gradients + two moments + a frozen reference) / N instead of all of it
(`grpo-kit plan --tpu t4-x2 --full`; docs/scaling.md). What the kit does around it:

- The sampler decodes token by token through the kit's own forward (`decoder.forward`), which reads each layer's
  weights itself rather than calling the layer's `forward`, where FSDP2 gathers a layer. So a rollout runs inside
  `gathered`: every layer gathered once (all-gather), the whole weights on every process while it samples, then
  sharded again. (Gathering each layer at each decoded token would move the whole model per token.)
- The update runs the model's own forward (`last_hidden_state`), through which FSDP2 gathers each layer for its
  forward and backward and reduce-scatters its gradient. The gradients are summed over the processes, not averaged
  (`shard`): each process's loss is its share of the whole batch's mean, as without sharding.
- Every process must run as many forwards as the others (each gathers every layer from all of them): the trainers
  give each process the same number of rows (`GRPOTrainer._my_rows` pads with rows that weigh nothing).
- Checkpoints hold the whole weights and optimizer state in the layout of an unsharded run (gathered to the main
  process by `torch.distributed.checkpoint.state_dict`: `full_weights`, `full_optimizer_state`), so a sharded run
  resumes in one process and an unsharded one on several, and `grpo-kit export` reads them as any other.
- Evaluation and anything else that reads whole weights runs inside `gathered` on every process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .distributed import World

_GATHERED = "_grpo_kit_gathered"
"""Set on a sharded model while `gathered` holds its whole weights (nested `gathered` blocks gather once)."""


def _fsdp_module() -> type:
    from torch.distributed.fsdp import FSDPModule

    return FSDPModule


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model` is sharded by `shard` (only full fine-tuning is: the model is the transformers model)."""
    return isinstance(model, _fsdp_module())


def wanted(model: torch.nn.Module, world: World, *, setting: bool | None) -> bool:
    """Whether to shard `model`: full fine-tuning (every weight trained) split over several processes, unless
    `setting` (`ModelConfig.shard_weights`) says otherwise. LoRA trains a few weights; one copy of the frozen rest per
    process is what its speed needs, so it is never sharded."""
    if world.size <= 1 or not world.splits_batch:
        return False
    full = all(p.requires_grad for p in model.parameters())
    if setting and not full:
        raise ValueError("ModelConfig.shard_weights=True: sharding is for full fine-tuning; a LoRA model keeps one "
                         "copy of its frozen weights per process (set lora: false, or leave shard_weights unset)")
    return full if setting is None else setting


def decoder_layers(hf: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformers model's decoder layers (`model.layers` of a Gemma causal LM)."""
    return hf.model.layers


def mesh(world: World, device: torch.device) -> Any:
    """A 1-D device mesh of `world`'s processes, one `device` each."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world.size,))


def shard(hf: torch.nn.Module, along: Any) -> None:
    """Shard `hf` in place along the device mesh `along`: each decoder layer, then the model (FSDP2), with gradients
    summed over the processes."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(hf):
        fully_shard(layer, mesh=along)
    fully_shard(hf, mesh=along)
    for module in _fsdp_modules(hf):
        module.set_gradient_divide_factor(1.0)
        if hasattr(module, "set_force_sum_reduction_for_comms"):  # torch ≥ 2.8: a plain sum (gloo has no other)
            module.set_force_sum_reduction_for_comms(True)


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    return [m for m in model.modules() if isinstance(m, _fsdp_module())]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block every weight of a sharded `model` is whole on every process (its modules read plain tensors);
    sharded again after it. Every process must enter it (the gather is collective). Unsharded models: nothing."""
    if not is_sharded(model) or getattr(model, _GATHERED, False):
        yield
        return
    modules = _fsdp_modules(model)
    for module in modules:
        module.unshard()
    layers = [m for m in decoder_layers(model) if isinstance(m, _fsdp_module())]
    for layer in layers:  # the layers' own forward (transformers' sampling path) keeps them whole too
        layer.set_reshard_after_forward(False, recurse=False)
    setattr(model, _GATHERED, True)
    try:
        yield
    finally:
        setattr(model, _GATHERED, False)
        for layer in layers:
            layer.set_reshard_after_forward(True, recurse=False)
        for module in modules:
            module.reshard()


def last_hidden_state(hf: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T, h): the decoder's output after its final norm, through the model's own forward (FSDP2 gathers each
    layer for it and for its backward, and reduce-scatters the gradients). The LM head runs on the last position only
    and is not used: the caller applies it to the positions it needs, with the head's weight still whole after the
    forward (FSDP2 keeps the outermost module's weights gathered until its backward)."""
    seen: list[torch.Tensor] = []
    hook = hf.model.register_forward_hook(lambda _m, _args, out: seen.append(out.last_hidden_state))
    try:
        hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
           logits_to_keep=1)
    finally:
        hook.remove()
    return seen[0]


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight, whole, on the main process's host (an empty dict on the others). Every process must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))


def load_full_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Whole weights (every process holds them: each keeps its shard). Returns (missing, unexpected) names."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    result = set_model_state_dict(model, weights, options=_options(full_state_dict=True, strict=False))
    return list(result.missing_keys), list(result.unexpected_keys)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state, whole, on the main process's host in `optimizer.state_dict()`'s layout (parameters
    numbered in the optimizer's order), as an unsharded run saves it. Every process must call it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer, options=_options(full_state_dict=True, cpu_offload=True))
    if not state:
        return {}
    numbered, groups, start = {}, [], 0
    for group in state["param_groups"]:
        names = group["params"]
        numbered.update({start + i: state["state"][name] for i, name in enumerate(names) if name in state["state"]})
        groups.append({**group, "params": list(range(start, start + len(names)))})
        start += len(names)
    return {"state": numbered, "param_groups": groups}


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
    """Load an optimizer state in `optimizer.state_dict()`'s layout (whole, on every process) into the optimizer of
    the sharded `model`."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    names = [group["params"] for group in get_optimizer_state_dict(model, optimizer)["param_groups"]]
    keyed = {"state": {}, "param_groups": []}
    for group, saved in zip(names, state["param_groups"], strict=True):
        keyed["state"].update({name: state["state"][i] for name, i in zip(group, saved["params"], strict=True)
                               if i in state["state"]})
        keyed["param_groups"].append({**saved, "params": group})
    set_optimizer_state_dict(model, optimizer, keyed, options=_options(full_state_dict=True))


def frozen_copy(hf: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the sharded `hf`, sharded the same way (FSDP2 modules cannot be deep-copied): the same class
    built on the meta device, sharded along the same mesh, given memory, then this process's shards and the buffers
    copied in. No communication."""
    cls = next(c for c in type(hf).__mro__ if not issubclass(c, _fsdp_module()))
    first = next(hf.parameters())
    with torch.device("meta"):
        copy = cls(hf.config).to(first.dtype)
    shard(copy, first.device_mesh)
    copy.to_empty(device=first.device)
    with torch.no_grad():
        for mine, theirs in zip(copy.parameters(), hf.parameters(), strict=True):
            mine.to_local().copy_(theirs.to_local())
            mine.requires_grad_(False)
        theirs_buffers = dict(hf.named_buffers())
        for name, buffer in copy.named_buffers():
            buffer.copy_(theirs_buffers[name])
    return copy.eval()


@torch.no_grad()
def lerp_shards(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """target ← (1 − α)·target + α·source for two models sharded alike, shard by shard (no communication). Both are
    resharded first: a model whose forward ran without a backward (a reference) still holds its outermost weights
    whole, and the next forward gathers the updated shards."""
    for module in _fsdp_modules(target) + _fsdp_modules(source):
        module.reshard()
    for mine, theirs in zip(target.parameters(), source.parameters(), strict=True):
        mine.to_local().lerp_(theirs.detach().to_local(), alpha)
