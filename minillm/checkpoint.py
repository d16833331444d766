"""Checkpoint files (infrastructure; no chapter teaches this module).

A checkpoint is a dict of tensors, numbers, strings, lists and dicts: model and optimizer
state, the scheduler, every random generator's state and the data cursor, so that training
resumes exactly. Saving writes a temporary file beside the target and renames it, so a
crash mid-write leaves the previous checkpoint intact. Loading uses
``torch.load(weights_only=True)``: a checkpoint cannot run code.

In data-parallel training (a ``torch.distributed`` process group) each process, a *rank*,
has random generators of its own: ``rng_states`` gathers every rank's, ``set_rng_states``
gives each rank its own back, and ``is_main_process`` says which one writes files.
"""
from __future__ import annotations

import dataclasses
import os
import random
import tempfile
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or not what the caller expected."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` to ``path`` atomically; returns the path."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a saved file is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = (), map_location="cpu") -> dict:
    """Read a checkpoint; ``CheckpointError`` naming the path when it is missing or corrupt.

    ``required``: keys the checkpoint must hold (for example ``("model", "config")``).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint path {str(path)!r} does not exist or is not a file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or not a checkpoint: {error}") from error
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, expected a dict")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}; it holds {sorted(state)}")
    return state


def config_from_dict(cls: type, values: dict):
    """The dataclass ``cls`` built from the dict ``dataclasses.asdict`` wrote into a checkpoint.

    ``ValueError`` naming the keys that are not fields of ``cls`` (a checkpoint of another
    version, or of something else); a missing key takes the field's default.
    """
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}")
    return cls(**values)


def rng_state() -> dict:
    """The state of every random generator training uses (Python, torch CPU and CUDA)."""
    version, internal, gauss = random.getstate()
    state = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore generators saved by ``rng_state`` (its tensors may have been loaded onto
    another device: generator states are set from CPU tensors)."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([cuda.cpu() for cuda in state["cuda"]])


def rank_and_world_size() -> tuple[int, int]:
    """(this process's rank, the number of processes) in the default ``torch.distributed``
    process group; (0, 1) when there is none."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """True on rank 0 (and without a process group): the one process that writes files and logs."""
    return rank_and_world_size()[0] == 0


def rng_states() -> list[dict]:
    """``rng_state()`` of every rank, in rank order (one entry without a process group).

    With a process group it is a collective: every rank must call it, and every rank
    gets the whole list.
    """
    rank, world_size = rank_and_world_size()
    if world_size == 1:
        return [rng_state()]
    gathered = [None] * world_size
    torch.distributed.all_gather_object(gathered, rng_state())
    return gathered


def set_rng_states(states: list[dict]) -> None:
    """Restore this rank's entry of ``rng_states()``; ``ValueError`` when the list was
    gathered from another number of processes (each rank's generators belong to it)."""
    rank, world_size = rank_and_world_size()
    if not isinstance(states, (list, tuple)) or len(states) != world_size:
        count = len(states) if isinstance(states, (list, tuple)) else type(states).__name__
        raise ValueError(f"states must hold the random generators of {world_size} process(es), got {count}")
    set_rng_state(states[rank])
