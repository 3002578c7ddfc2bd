"""Several processes, one run: data parallelism under PyTorch's own launcher, `torchrun`.

`torchrun --nproc-per-node N <command>` starts N copies of the command with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`MASTER_ADDR` and `MASTER_PORT` set. `world()` joins them into one process group the first time it is asked (nccl
between GPUs, gloo on CPUs); without torchrun the world is this one process and nothing here communicates.

How the trainers use it (`train.grpo`): every process draws the same prompts and the same sampling noise, samples
and rewards its own block of the step's groups, and the blocks are gathered, so every process holds the step's whole
batch and computes the advantages, dynamic sampling and metrics one process would. Each process then runs the
update's forward and backward on its block of the rows, the loss normalised by the whole batch, and the gradients are
summed over the processes (`sum_gradients`) before each optimizer step: every process applies the same update to the
same weights, so weights and optimizer state stay replicated and a checkpoint is one process's copy. The gradients are
summed by hand rather than by `DistributedDataParallel`, because the kit's forward (`decoder.forward`) runs the
model's modules without calling the model's `forward`, which DDP's gradient hooks are armed from; the sum is one
all-reduce of one flat buffer per optimizer step, as DDP does under `no_sync` over micro-batches, without overlapping
it with the backward. Only the main process (rank 0) writes: the run directory's claim, metrics, checkpoints,
exports. The live controls are rank 0's, broadcast at each step (`broadcast`).

XLA runs the devices of one host through SPMD within one process (`device.enable_spmd`). A TPU pod slice of several
hosts runs one process per host, all in one SPMD program over the slice's devices: there every process runs the
whole batch's program (the program splits it over the devices), so the processes split nothing here
(`World.splits_batch` False) and differ only in who writes (process 0; with full fine-tuning every host also writes
its chips' shards of each checkpoint, `train.checkpoint`) and whose controls and decisions count (broadcast, as
above). `SPMD_HOSTS_VARIABLE` makes torchrun's processes stand in for such hosts on one machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ..validation import ConfigError

SPMD_HOSTS_VARIABLE = "GRPO_KIT_SPMD_HOSTS"
"""Set to 1 under torchrun with an XLA device: the processes are taken as the hosts of one SPMD program (each runs the
whole batch; only rank 0 writes), the way a pod slice's hosts are. A stand-in for a pod where torch_xla cannot join
the processes into one runtime (its CPU client has no coordinator), so each computes the same program alone."""
GROUP_TIMEOUT = timedelta(hours=2)
"""How long a collective waits for the other processes: long, because rank 0 may be paused by its controls while
the others wait at the next step's broadcast."""


@dataclass(frozen=True)
class World:
    """The processes of this run: `size` of them, this one `rank` (0 is the main process, which writes)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    """This process's number on its machine: which GPU it uses."""
    splits_batch: bool = True
    """The processes split each batch between them (torchrun's data parallelism). False: the hosts of one SPMD
    program, each of which runs the whole batch."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def batch_world(self) -> World:
        """The processes a batch is split over: this world, or this process alone where one SPMD program spans the
        processes."""
        return self if self.splits_batch else World()

    def block(self, count: int) -> slice:
        """This process's contiguous block of `count` items split over the processes as evenly as they go (the
        first `count % size` blocks one longer)."""
        return slice(self.rank * count // self.size, (self.rank + 1) * count // self.size)


def check_whole_groups(prompts_per_step: int, world: World, *, setting: str) -> None:
    """Refuse (ConfigError naming `setting`) a step's `prompts_per_step` prompts that do not split into equal blocks
    over `world`'s processes: each samples whole groups of its block."""
    if prompts_per_step % world.size:
        raise ConfigError(f"{setting}={prompts_per_step} does not split over {world.size} processes (torchrun "
                          f"--nproc-per-node): make it a multiple of {world.size}, so that each samples whole groups")


def launched_size() -> int:
    """The number of processes torchrun started (its `WORLD_SIZE`), 1 without torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's `RANK` under torchrun (0 is the main process), 0 without torchrun: known before the process
    group starts."""
    return int(os.environ.get("RANK", "0"))


def process_rank(device: torch.device) -> int:
    """This process's number in its run (0 writes), known before the trainer joins the processes: torchrun's `RANK`,
    else, on XLA, this host's index in the runtime (a pod slice's hosts; 0 on one host)."""
    if launched_size() > 1 or torch.device(device).type != "xla":
        return launched_rank()
    import torch_xla.runtime as xr

    return xr.process_index()


def local_rank() -> int:
    """This process's `LOCAL_RANK` under torchrun (which GPU it takes), 0 without torchrun."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def world(device: torch.device | None = None) -> World:
    """This run's processes. Under torchrun the first call starts the process group: nccl when `device` is a CUDA
    device, gloo otherwise. Without torchrun: `World()`, one process."""
    import torch.distributed as dist

    hosts = _spmd_hosts(device)
    if hosts is not None:
        return hosts
    if launched_size() <= 1:
        return World()
    if not dist.is_initialized():
        backend = "nccl" if device is not None and torch.device(device).type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=GROUP_TIMEOUT)
    return World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=local_rank())


def _spmd_hosts(device: torch.device | None) -> World | None:
    """The hosts of one SPMD program over several of them (a pod slice's, or torchrun's processes standing in for
    them), joined for the collectives of picklable values (gloo); None where this process's SPMD program is its own."""
    import torch.distributed as dist

    if device is None or torch.device(device).type != "xla":
        return None
    import torch_xla.runtime as xr

    if xr.process_count() > 1:  # a pod slice: torch_xla's rendezvous finds the other hosts
        if not dist.is_initialized():
            import torch_xla.distributed.xla_backend  # noqa: F401 - registers the xla:// rendezvous

            dist.init_process_group("gloo", init_method="xla://", timeout=GROUP_TIMEOUT)
        return World(rank=xr.process_index(), size=xr.process_count(), splits_batch=False)
    if launched_size() > 1 and os.environ.get(SPMD_HOSTS_VARIABLE) == "1":
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
        return World(rank=dist.get_rank(), size=dist.get_world_size(), splits_batch=False)
    if launched_size() > 1:
        raise RuntimeError(f"torchrun started {launched_size()} processes on an XLA device: a TPU host's chips are one "
                         "SPMD program in one process (run the command without torchrun); torchrun is for GPUs")
    return None


def _device() -> torch.device:
    """Where collectives' tensors live: this process's GPU under nccl, else the CPU."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather(value: Any, world: World) -> list[Any]:
    """Every process's `value` (any picklable object; tensors are sent as they are, so move them to the CPU
    first), in rank order. One process: `[value]`."""
    if world.size == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out


def broadcast(value: Any, world: World) -> Any:
    """Rank 0's `value` (any picklable object), on every process."""
    if world.size == 1:
        return value
    import torch.distributed as dist

    box = [value if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_tensors(tensors: list[torch.Tensor], world: World) -> list[torch.Tensor]:
    """Each tensor summed over the processes (one all-reduce of one flat float32 buffer), in its own shape,
    dtype and device."""
    if world.size == 1 or not tensors:
        return tensors
    import torch.distributed as dist

    flat = torch.cat([t.detach().reshape(-1).to(_device(), torch.float32) for t in tensors])
    dist.all_reduce(flat)
    out, start = [], 0
    for t in tensors:
        out.append(flat[start:start + t.numel()].view(t.shape).to(t.device, t.dtype))
        start += t.numel()
    return out


def sum_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """Set each parameter's `.grad` to its sum over the processes. A parameter without a gradient here but with one
    on another process gets that sum; one without a gradient anywhere keeps None, as it would in one process (the
    optimizer then leaves it alone)."""
    if world.size == 1:
        return
    has = sum_tensors([torch.tensor([float(p.grad is not None) for p in params])], world)[0]
    summed = [p for p, n in zip(params, has.tolist(), strict=True) if n > 0]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in summed]
    for p, g in zip(summed, sum_tensors(grads, world), strict=True):
        p.grad = g


def finish() -> None:
    """Leave the process group (at the end of a command run under torchrun); nothing without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
