"""Checkpoint files (infrastructure; no chapter teaches this module).

A checkpoint is a dict of tensors, numbers, strings, lists and dicts: model and optimizer
state, the scheduler, every random generator's state and the data cursor, so that training
resumes exactly. Saving writes a temporary file beside the target and renames it, so a
crash mid-write leaves the previous checkpoint intact. Loading uses
``torch.load(weights_only=True)``: a checkpoint cannot run code.
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
    """Restore generators saved by ``rng_state``."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
