"""Data-parallel set-up: the ``torch.distributed`` process group that ``torchrun`` describes
(infrastructure; chapter 08 explains it).

``torchrun --nproc_per_node=N -m minillm train ...`` starts N processes and gives each, in
its environment, ``RANK`` (0..WORLD_SIZE-1 over every machine), ``LOCAL_RANK`` (on this
machine), ``WORLD_SIZE``, and the rendezvous address ``MASTER_ADDR``:``MASTER_PORT``
where the processes find each other. This module reads them:

- ``environment()``: a ``Launch`` (rank, local_rank, world_size) from those variables, or
  the single process of a plain ``python -m minillm``; a ``ValueError`` naming what is
  missing or wrong when only some of them are set;
- ``init(backend=None)``: joins the process group (gloo on CPU, nccl on GPUs, one GPU a
  process, chosen by ``LOCAL_RANK``), and returns the ``Launch`` and the device;
- ``local_batch_size(batch_size, world_size)``: each rank's share of the global batch, a
  ``ValueError`` when the world size does not divide it;
- ``wrap(model, device)``: ``DistributedDataParallel`` around a model (the model itself
  in a single process), ``shutdown()`` to leave the group.

Every rank then calls ``minillm.train.train`` with its own shard of each batch
(``BatchSampler(..., rank=, world_size=)``); DDP all-reduces (averages) the gradients
during the backward pass, so every rank takes the same optimizer step.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import nn

from minillm.checks import one_of, positive_int

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")
RANKS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
BACKENDS = ("gloo", "nccl")


class Launch(NamedTuple):
    rank: int
    local_rank: int
    world_size: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _integer_variable(env, name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"the environment variable {name} must be an integer, got {text!r}") from None


def environment(env=None) -> Launch:
    """The launch that the environment ``env`` (default: ``os.environ``) describes.

    None of RANK, LOCAL_RANK, WORLD_SIZE set: one process (0, 0, 1). All three set: the
    launch ``torchrun`` made; with WORLD_SIZE > 1 the rendezvous variables MASTER_ADDR and
    MASTER_PORT must be set too. Anything in between is a ``ValueError`` naming the
    missing variable (a process started by hand, not by torchrun).
    """
    env = os.environ if env is None else env
    present = [name for name in RANKS if name in env]
    if not present:
        return Launch(0, 0, 1)
    missing = [name for name in RANKS if name not in env]
    if missing:
        raise ValueError(f"the environment sets {', '.join(present)} but not {', '.join(missing)}: start data-parallel "
                         "training with torchrun (torchrun --nproc_per_node=2 -m minillm train ...), which sets them all")
    rank, local_rank, world_size = (_integer_variable(env, name) for name in RANKS)
    if world_size < 1 or not 0 <= rank < world_size or not 0 <= local_rank <= rank:
        raise ValueError(f"the environment describes no valid launch: RANK={rank}, LOCAL_RANK={local_rank}, "
                         f"WORLD_SIZE={world_size} (need 0 <= LOCAL_RANK <= RANK < WORLD_SIZE)")
    if world_size > 1:
        missing = [name for name in RENDEZVOUS if not env.get(name)]
        if missing:
            raise ValueError(f"WORLD_SIZE={world_size} but the rendezvous variable {', '.join(missing)} is not set: "
                             "the processes cannot find each other (torchrun sets it; by hand, set MASTER_ADDR to "
                             "rank 0's host and MASTER_PORT to a free port)")
    return Launch(rank, local_rank, world_size)


def default_backend() -> str:
    """nccl when this machine has a CUDA GPU (and torch was built with nccl), else gloo."""
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        return "nccl"
    return "gloo"


def init(backend: str | None = None, env=None) -> tuple[Launch, torch.device]:
    """Join the process group the environment describes; return the launch and this
    process's device (``cuda:LOCAL_RANK`` with nccl, the CPU with gloo, or the best device
    of a single process). A single process joins no group."""
    launch = environment(env)
    if not launch.distributed:
        return launch, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.distributed.is_available():
        raise RuntimeError("this torch build has no torch.distributed: data-parallel training needs it")
    backend = default_backend() if backend is None else one_of("backend", backend, BACKENDS)
    if backend == "nccl":
        if launch.local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK={launch.local_rank} but this machine has {torch.cuda.device_count()} GPU(s): "
                             "start at most one process a GPU (--nproc_per_node)")
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, rank=launch.rank, world_size=launch.world_size)
    return launch, device


def local_batch_size(batch_size: int, world_size: int) -> int:
    """Each rank's rows of a global batch of ``batch_size``; ``ValueError`` unless
    ``world_size`` divides it (every process takes an equal share)."""
    positive_int("batch_size", batch_size)
    positive_int("world_size", world_size)
    if batch_size % world_size:
        raise ValueError(f"--batch-size is the global batch ({batch_size}) and must be divisible by the number of "
                         f"processes ({world_size}): every process takes an equal share; try "
                         f"{max(world_size, batch_size // world_size * world_size)}")
    return batch_size // world_size


def wrap(model: nn.Module, device: torch.device, **options) -> nn.Module:
    """``model`` on ``device``, in ``DistributedDataParallel`` when a process group is up
    (``options`` go to it, e.g. ``bucket_cap_mb``); the model itself otherwise."""
    model = model.to(device)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **options)


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
