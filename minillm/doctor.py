"""``python -m minillm.doctor`` (``make doctor``): one OK/FAIL line per check of the environment.

Infrastructure, taught by no chapter. Exits 1 when a check fails. A missing GPU is not a
failure: every chapter runs on the CPU.
"""
from __future__ import annotations

import hashlib
import importlib
import platform
import sys

CORPUS_MD5 = "6fb458f1232090904fb40fe944165e91"
# pyproject.toml's requires-python, >=3.11,<3.15 (a test keeps them equal): torch 2.13.0 has
# wheels up to Python 3.14.
MIN_PYTHON = (3, 11)
MAX_PYTHON = (3, 14)


def _version(module: str) -> str:
    return getattr(importlib.import_module(module), "__version__", "?")


def checks():
    """Yield (ok, label, detail) for each check."""
    supported = f"{'.'.join(map(str, MIN_PYTHON))} to {'.'.join(map(str, MAX_PYTHON))}"
    yield MIN_PYTHON <= sys.version_info[:2] <= MAX_PYTHON, "python", f"{platform.python_version()} (needs {supported})"
    try:
        import torch

        yield torch.__version__.split("+")[0] == "2.13.0", "torch", f"{torch.__version__} (pinned 2.13.0)"
        yield True, "threads", f"torch uses {torch.get_num_threads()} threads"
        if torch.cuda.is_available():
            yield True, "GPU", torch.cuda.get_device_name(0)
        else:
            yield True, "GPU", "none: CPU only (the GPU parts of chapter 10 are skipped)"
    except ImportError as error:
        yield False, "torch", str(error)
    if sys.platform == "linux":  # torch 2.13.0 requires triton 3.7.1 on Linux (x86_64 and aarch64)
        try:
            yield True, "triton", _version("triton")
        except ImportError as error:
            yield False, "triton", str(error)
    else:
        yield True, "triton", f"not available on {sys.platform}/{platform.machine()}; chapter 10 uses its PyTorch version"
    for module in ("jupyterlab", "nbgrader", "nbformat", "nbclient", "matplotlib", "tqdm", "jupytext"):
        try:
            yield True, module, _version(module)
        except ImportError as error:
            yield False, module, str(error)
    try:
        from minillm import data

        digest = hashlib.md5(data.path(data.CORPUS).read_bytes()).hexdigest()
        yield digest == CORPUS_MD5, "corpus", f"{data.path(data.CORPUS)} md5 {digest}"
        vocab, merges = data.gpt2_files()
        yield True, "gpt2 files", f"{vocab.name}, {merges.name}"
    except (FileNotFoundError, ImportError) as error:
        yield False, "data", str(error)


def main() -> int:
    failed = 0
    for ok, label, detail in checks():
        failed += not ok
        print(f"{'OK  ' if ok else 'FAIL'} {label:12s} {detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
