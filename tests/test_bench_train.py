"""The package's GPT trains on the same kernels as the nanoGPT baseline of bench/train.py.

The bench times the two side by side; this test shows why their ratio is 1 within the
noise: one training step of each dispatches the same ATen operators on tensors of the same
shapes and strides, the same number of times. The package's only extra work is the check
of its input at the entry (the ids' and positions' range, read in eager mode).
"""
import collections
import importlib.util

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from coursebuild import paths

# Operators the package adds: GPT.forward reads the ids' range, the positions layer its
# positions' range (a scalar each, brought to Python).
ENTRY_CHECKS = {"aten.min.default", "aten.max.default", "aten._local_scalar_dense.default"}
# The same kernel under two names: split into equal parts or into listed sizes; arange from 0
# or from a start.
SAME = {"aten.split.Tensor": "split", "aten.split_with_sizes.default": "split",
        "aten.arange.default": "arange", "aten.arange.start": "arange"}


def _bench():
    spec = importlib.util.spec_from_file_location("bench_train", paths.ROOT / "bench" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Dispatched(TorchDispatchMode):
    """Counts (operator, shapes and strides of its tensor arguments) as they are dispatched."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = tuple((tuple(t.shape), t.stride()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        self.calls[(SAME.get(str(func), str(func)), tensors)] += 1
        return func(*args, **(kwargs or {}))


def _step_calls(runner) -> collections.Counter:
    with Dispatched() as mode:
        runner.step()
    return mode.calls


def test_one_training_step_dispatches_the_baselines_kernels():
    bench = _bench()
    torch.manual_seed(0)
    config = bench.GPTConfig(**bench.SHAPE)
    batch = torch.randint(0, config.vocab_size, (bench.BATCH_SIZE, config.context_length + 1))
    package = bench.Runner(bench.GPT(config), batch)
    baseline = bench.Runner(bench.NanoGPT(config.vocab_size, config.context_length, config.d_model,
                                          config.n_layers, config.n_heads), batch)
    ours, theirs = _step_calls(package), _step_calls(baseline)
    assert sum(theirs.values()) > 500, "the trace sees the whole step (forward, backward, AdamW)"
    extra = ours - theirs
    assert {op for op, _ in extra} <= ENTRY_CHECKS, sorted(extra)
    assert sum(extra.values()) <= 8, extra  # a few scalars a step, not a check per layer
    assert not theirs - ours, sorted(theirs - ours)
    matmuls = [key for key in ours if key[0] in ("aten.mm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default")]
    assert len(matmuls) >= 10, "the step's matrix products and attention are in the comparison"
