"""The course's shipped model: the recipe ``make train`` runs, and where its files are (infrastructure; chapter 07 explains it).

- ``DEFAULT_RECIPE``: the numbers of the recipe, the defaults of ``python -m minillm train``.
- ``recipe_config(vocab_size, **overrides)``: the model's ``GPTConfig``, a Llama-style GPT
  (RoPE, RMSNorm, SwiGLU with the 2/3 rule, no biases, tied embeddings).
- ``recipe_train_config(**overrides)``: its ``TrainConfig``.
- ``pretrained_paths``, ``tokenizer_path_for``, ``load_pretrained``: the trained model and
  its tokenizer, as ``make train`` wrote them into the data folder (``minillm.data``).
"""
from __future__ import annotations

from pathlib import Path

from minillm import data
from minillm.checkpoint import CheckpointError
from minillm.model import GPT, GPTConfig
from minillm.tokenizer import BPETokenizer
from minillm.train import TrainConfig, load_model

# The data order of the shipped run follows from batch_size and seed (BatchSampler), its
# initialization from seed (torch.manual_seed before GPT(config)); eval_windows is how many
# validation windows each evaluation reads.
DEFAULT_RECIPE = dict(vocab_size=2048, context_length=128, d_model=128, n_layers=4, n_heads=4, dropout=0.0,
                      positions="rope", norm="rmsnorm", ffn="swiglu", steps=3000, batch_size=8, lr=3e-3,
                      eval_windows=64, seed=0)
PRETRAINED = "minillm-shakespeare.pt"
_SHAPE = ("context_length", "d_model", "n_layers", "n_heads", "dropout", "positions", "norm", "ffn")


def recipe_config(vocab_size: int, **overrides) -> GPTConfig:
    """The default model's config for a tokenizer of ``vocab_size`` tokens (``overrides`` win).

    d_ff follows d_model by the FFN's own rule (``minillm.ffn.default_d_ff``: 4 d_model for
    GELU/ReLU, the 2/3 rule rounded to a multiple of 32 for SwiGLU), unless given. The attention
    backend is pinned to "sdpa", the one the shipped model was trained with.
    """
    shape = {**{key: DEFAULT_RECIPE[key] for key in _SHAPE}, **overrides}
    return GPTConfig(**{"name": "minillm-shakespeare", "vocab_size": vocab_size, "bias": False,
                        "attention_backend": "sdpa", **shape})


def recipe_train_config(**overrides) -> TrainConfig:
    """The default training config (``overrides`` win): warmup over 3% of the steps, 20
    evaluations and 10 checkpoints in a run."""
    steps = overrides.pop("steps", DEFAULT_RECIPE["steps"])
    values = dict(steps=steps, lr=DEFAULT_RECIPE["lr"], warmup_steps=max(1, steps * 3 // 100),
                  eval_every=max(1, steps // 20), checkpoint_every=max(1, steps // 10))
    return TrainConfig(**{**values, **overrides})


def tokenizer_path_for(model_path) -> Path:
    """Where the tokenizer of a model file lives: beside it, ``NAME-tokenizer.json``."""
    model_path = Path(model_path)
    return model_path.with_name(model_path.stem + "-tokenizer.json")


def pretrained_paths() -> tuple[Path, Path]:
    """The shipped model and its tokenizer, in the course's data folder (``minillm.data``)."""
    model_path = data.data_dir() / PRETRAINED
    return model_path, tokenizer_path_for(model_path)


def load_pretrained() -> tuple[GPT, BPETokenizer]:
    """The shipped model (eval mode, CPU) and its ``BPETokenizer``: what ``make train`` wrote.

    ``CheckpointError`` naming the file when it is missing or corrupt.
    """
    model_path, tokenizer_path = pretrained_paths()
    model = load_model(model_path)
    if not tokenizer_path.is_file():
        raise CheckpointError(f"tokenizer file {str(tokenizer_path)!r} does not exist (run make train)")
    return model, BPETokenizer.load(tokenizer_path)
