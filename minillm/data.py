"""Where the bundled data lives (infrastructure; no chapter teaches this module).

Notebooks find data through these functions, never through a path relative to the
notebook, so a grader's temporary directory works. ``MINILLM_DATA`` overrides the folder.
"""
from __future__ import annotations

import os
from pathlib import Path

CORPUS = "tinyshakespeare.txt"


def data_dir() -> Path:
    """The folder of bundled data: ``$MINILLM_DATA`` or the repository's ``data/``."""
    override = os.environ.get("MINILLM_DATA")
    return Path(override) if override else Path(__file__).resolve().parent.parent / "data"


def path(name: str) -> Path:
    """The path of a bundled file; ``FileNotFoundError`` naming it when it is absent."""
    found = data_dir() / name
    if not found.exists():
        raise FileNotFoundError(
            f"bundled data file {name!r} not found in {data_dir()} "
            "(set MINILLM_DATA to the course's data/ folder)"
        )
    return found


def corpus_text() -> str:
    """The course's training corpus (tiny Shakespeare, about 1.1 MB of text)."""
    return path(CORPUS).read_text(encoding="utf-8")


def gpt2_files() -> tuple[Path, Path]:
    """GPT-2's released ``vocab.json`` and ``merges.txt``."""
    return path("gpt2/vocab.json"), path("gpt2/merges.txt")


def split_corpus(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """Split ``text`` by characters: the first part trains, the last ``val_fraction`` validates.

    The course defines validation once: the last 10% of the corpus, split before any
    tokenizer sees it, so tokenizers are trained on the first part only.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    cut = int(len(text) * (1.0 - val_fraction))
    return text[:cut], text[cut:]
