"""Training the mini-LLM: batches, AdamW, a learning-rate schedule, evaluation, checkpoints (chapter 07).

- ``lr_schedule``: linear warmup, then cosine decay to ``min_lr``.
- ``param_groups`` / ``build_optimizer``: AdamW with weight decay on the matrices only.
- ``BatchSampler``: context windows of a token stream in a seeded order, with a cursor.
- ``evaluate`` and ``nats_per_char``: the held-out loss, per token and per character.
- ``train``: the loop (gradient clipping, periodic evaluation, a ``tqdm`` bar) with
  checkpoints that carry the model, optimizer, scheduler, every random generator and the
  data cursor, so that a resumed run repeats the uninterrupted one exactly.
"""
import math
from dataclasses import asdict, dataclass, fields
from functools import partial

import torch
from torch import nn
from tqdm.auto import tqdm

from minillm.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from minillm.model import GPT, GPTConfig


def lr_schedule(step: int, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """The learning rate at ``step`` (0-based): linear warmup, then cosine decay.

    step < warmup_steps: max_lr * (step + 1) / warmup_steps, rising to max_lr.
    warmup_steps <= step <= total_steps: min_lr + (max_lr - min_lr) * (1 + cos(pi * t)) / 2
    with t = (step - warmup_steps) / (total_steps - warmup_steps), falling from max_lr to
    min_lr. After total_steps: min_lr.
    """
    for name, value in (("step", step), ("warmup_steps", warmup_steps), ("total_steps", total_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps ({warmup_steps}) must be <= total_steps ({total_steps})")
    if not 0 <= min_lr <= max_lr:
        raise ValueError(f"need 0 <= min_lr <= max_lr, got min_lr={min_lr!r}, max_lr={max_lr!r}")
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    t = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: matrices (linear weights, embeddings) decay; vectors
    (biases, norm scales and shifts) do not. A tied weight appears once."""
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1,
                    betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW over ``param_groups(model, weight_decay)``."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas)


def _lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    return lr_schedule(step, 1.0, warmup_steps, total_steps, min_ratio)


def build_scheduler(optimizer, warmup_steps: int, total_steps: int, min_ratio: float = 0.1):
    """A ``LambdaLR`` that multiplies each group's lr by ``lr_schedule(step, 1, ...)``."""
    factor = partial(_lr_factor, warmup_steps=warmup_steps, total_steps=total_steps, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class BatchSampler:
    """Training windows from a 1-D token stream, in a seeded order, resumable.

    Each epoch cuts ``ids`` into windows of ``context + 1`` tokens starting at a random
    offset below ``context``, shuffles them, and yields batches: x (batch, context) and
    y = x shifted by one (the next tokens). The cursor (epoch, position) is the whole
    state: ``state_dict`` / ``load_state_dict`` resume exactly where it stopped.
    """

    def __init__(self, ids: torch.Tensor, batch_size: int, context: int, seed: int = 0):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point:
            raise TypeError(f"ids must be a 1-D integer tensor, got {getattr(ids, 'shape', type(ids).__name__)}")
        for name, value in (("batch_size", batch_size), ("context", context)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if len(ids) < 2 * context + 1:
            raise ValueError(f"ids holds {len(ids)} tokens, too few for windows of context {context} "
                             f"(need at least {2 * context + 1})")
        self.ids, self.batch_size, self.context, self.seed = ids.long(), batch_size, context, seed
        self.epoch, self.position = 0, 0
        self._starts = self._epoch_starts(0)

    def _epoch_starts(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        offset = int(torch.randint(self.context, (1,), generator=generator))
        starts = torch.arange(offset, len(self.ids) - self.context, self.context + 1)
        return starts[torch.randperm(len(starts), generator=generator)]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        while len(rows) < self.batch_size:
            if self.position == len(self._starts):
                self.epoch, self.position = self.epoch + 1, 0
                self._starts = self._epoch_starts(self.epoch)
            rows.append(self._starts[self.position])
            self.position += 1
        windows = torch.stack([self.ids[s: s + self.context + 1] for s in rows])
        return windows[:, :-1], windows[:, 1:]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._starts = self._epoch_starts(self.epoch)


@torch.no_grad()
def token_nll(model: nn.Module, ids: torch.Tensor, context: int | None = None, batch_size: int = 32,
              max_windows: int | None = None) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of a 1-D token stream, and how many tokens it covers.

    The stream is cut into non-overlapping windows of ``context`` inputs (default: the
    model's context length); each window predicts its next ``context`` tokens, so every
    token but the first is predicted once, from the tokens of its own window.
    ``max_windows`` stops early (a quick estimate). Runs in eval mode.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or len(ids) < 2:
        raise ValueError(f"ids must be a 1-D tensor of at least 2 tokens, got {getattr(ids, 'shape', ids)}")
    context = model.config.context_length if context is None else context
    device = next(model.parameters()).device
    starts = list(range(0, len(ids) - 1, context))[:max_windows]
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(starts), batch_size):
            chunk = starts[i: i + batch_size]
            full = [s for s in chunk if s + context + 1 <= len(ids)]
            groups = [full] + [[s] for s in chunk if s + context + 1 > len(ids)]  # the short last window alone
            for group in groups:
                if not group:
                    continue
                width = min(context, len(ids) - 1 - group[0])
                windows = torch.stack([ids[s: s + width + 1] for s in group]).long().to(device)
                logits, _ = model(windows[:, :-1])
                nll = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                        windows[:, 1:].reshape(-1), reduction="sum")
                total += nll.item()
                count += windows[:, 1:].numel()
    finally:
        model.train(was_training)
    return total, count


def nats_per_char(model: nn.Module, ids: torch.Tensor, n_chars: int, **kwargs) -> float:
    """Summed token NLL of ``ids`` (``token_nll``) divided by ``n_chars``, the length of the
    text ids encodes: a loss that does not depend on the tokenizer. (A character-level
    model's nats per token are its nats per character.)"""
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 1:
        raise ValueError(f"n_chars must be a positive int, got {n_chars!r}")
    total, _ = token_nll(model, ids, **kwargs)
    return total / n_chars


@dataclass(frozen=True)
class TrainConfig:
    """How to train: steps, batch, AdamW, schedule, clipping, evaluation, checkpoints.

    lr decays from ``lr`` to ``lr * min_lr_ratio`` by a cosine after ``warmup_steps``.
    ``eval_every`` steps (and at the end) the loss is measured on ``eval_windows`` windows
    of the validation tokens; ``checkpoint_every`` steps a checkpoint is written (when
    ``train`` has a path).
    """

    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_windows: int = 64
    checkpoint_every: int = 500
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_windows", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must be an int in [0, steps={self.steps}], got {self.warmup_steps!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip!r}")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**values)


def save_model(path, model: GPT, **extra) -> None:
    """A weights-only checkpoint: {"config", "model"} and any ``extra`` entries (plain data)."""
    save_checkpoint(path, {"config": model.config.to_dict(), "model": model.state_dict(), **extra})


def load_model(path, map_location="cpu") -> GPT:
    """The ``GPT`` a checkpoint holds (one written by ``save_model`` or ``train``), in eval mode.

    A missing or corrupt file is a ``CheckpointError`` (a ``ValueError``) naming it.
    """
    state = load_checkpoint(path, required=("config", "model"), map_location=map_location)
    model = GPT(GPTConfig.from_dict(state["config"]))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit its own config: {error}") from error
    return model.eval()


def train(model: GPT, train_ids: torch.Tensor, val_ids: torch.Tensor, config: TrainConfig = TrainConfig(),
          checkpoint_path=None, resume: bool = False, stop_after: int | None = None,
          progress: bool = True, extra: dict | None = None) -> dict:
    """Train ``model`` on the 1-D token stream ``train_ids``; evaluate on ``val_ids``.

    checkpoint_path: where checkpoints go (every ``config.checkpoint_every`` steps and at
    the end). resume: load ``checkpoint_path`` first and continue from its step; the
    result equals an uninterrupted run. stop_after: stop after this many steps in all
    (as if interrupted; the schedule still spans ``config.steps``). extra: plain data
    stored in every checkpoint (for example the tokenizer's file name).

    Returns the history: {"train_loss": tensor (steps done,), float32, one per step;
    "lr": list; "val_step": list; "val_loss": list (nats per token)}, covering the
    whole run, the steps before a resume included.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a GPT, got {type(model).__name__}")
    device = next(model.parameters()).device
    context = model.config.context_length
    optimizer = build_optimizer(model, config.lr, config.weight_decay, (config.beta1, config.beta2))
    scheduler = build_scheduler(optimizer, config.warmup_steps, config.steps, config.min_lr_ratio)
    sampler = BatchSampler(train_ids, config.batch_size, context, seed=config.seed)
    history = {"train_loss": [], "lr": [], "val_step": [], "val_loss": []}
    step = 0
    if resume:
        if checkpoint_path is None:
            raise ValueError("resume=True needs a checkpoint_path")
        state = load_checkpoint(checkpoint_path, required=("model", "optimizer", "scheduler", "rng", "sampler", "step"),
                                map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        if state.get("train_config") != asdict(config):
            raise CheckpointError(f"checkpoint {str(checkpoint_path)!r} was written with another TrainConfig: "
                                  f"{state.get('train_config')} (this run: {asdict(config)})")
        step = int(state["step"])
        history = {key: list(value) for key, value in state["history"].items()}
    last = config.steps if stop_after is None else min(stop_after, config.steps)

    def evaluate_now():
        total, count = token_nll(model, val_ids, context, config.batch_size, max_windows=config.eval_windows)
        history["val_step"].append(step)
        history["val_loss"].append(total / count)

    def checkpoint():
        save_checkpoint(checkpoint_path, {
            "format": "minillm training checkpoint", "config": model.config.to_dict(), "train_config": asdict(config),
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": rng_state(), "sampler": sampler.state_dict(), "step": step, "history": history, **(extra or {}),
        })

    model.train()
    bar = tqdm(total=last, initial=step, desc="training", disable=not progress)
    while step < last:
        x, y = next(sampler)
        _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        history["lr"].append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        step += 1
        history["train_loss"].append(loss.item())  # a float32 value, exactly
        if step % config.eval_every == 0 or step == config.steps:
            evaluate_now()
            model.train()
        if checkpoint_path is not None and (step % config.checkpoint_every == 0 or step == last):
            checkpoint()
        bar.update(1)
        if step % 10 == 0 or step == last:
            postfix = {"loss": f"{loss.item():.3f}"}
            if history["val_loss"]:
                postfix["val"] = f"{history['val_loss'][-1]:.3f}"
            bar.set_postfix(postfix)
    bar.close()
    model.eval()
    return {**history, "train_loss": torch.tensor(history["train_loss"], dtype=torch.float32)}
