"""Training throughput of minillm's GPT against a plain PyTorch GPT of the same shape.

Prints training tokens per second (forward, backward and AdamW step) for the package's
model (the recipe of `make train`) and for a plain, nanoGPT-style model written below, the
ratio of the two (measured side by side, interleaved, in this run), and the model FLOPs
utilization (MFU): model FLOPs per second over the machine's own float32 matmul rate,
also measured in this run. Usage: python bench/train.py [--steps N] [--batch-size B]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from minillm.model import GPT
from minillm.recipe import DEFAULT_RECIPE, recipe_config
from minillm.train import build_optimizer


def rotate(x, theta=10000.0):
    """RoPE, split-half pairing: x (batch, heads, seq, head_dim)."""
    seq, head_dim = x.shape[-2:]
    angles = torch.arange(seq)[:, None] * theta ** (-torch.arange(0, head_dim, 2) / head_dim)[None, :]
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class PlainBlock(nn.Module):
    def __init__(self, d, n_heads, d_ff):
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, d_ff, bias=False), nn.Linear(d, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class PlainGPT(nn.Module):
    """The recipe's shape written plainly: RoPE, pre-norm RMSNorm, SwiGLU, no biases, tied head."""

    def __init__(self, vocab, d, n_layers, n_heads, d_ff):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(PlainBlock(d, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.RMSNorm(d, eps=1e-5)

    def forward(self, ids, targets):
        x = self.wte(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.wte.weight.T
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def matmul_flops_per_second(n=1024, repeats=20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def step_seconds(model, batch, steps) -> float:
    optimizer = build_optimizer(model, 1e-3)
    vocab = model.wte.num_embeddings if isinstance(model, PlainGPT) else model.config.vocab_size
    x = torch.randint(0, vocab, batch)
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        _, loss = model(x, x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i >= 2:  # the first steps allocate
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_RECIPE["batch_size"])
    args = parser.parse_args()
    config = recipe_config(DEFAULT_RECIPE["vocab_size"])
    batch = (args.batch_size, config.context_length)
    torch.manual_seed(0)
    ours = GPT(config)
    plain = PlainGPT(config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.d_ff)
    n_ours, n_plain = (sum(p.numel() for p in m.parameters()) for m in (ours, plain))
    assert n_ours == n_plain, f"the two models must have the same parameters, got {n_ours} and {n_plain}"
    non_embedding = n_ours - config.vocab_size * config.d_model
    # 6 FLOPs per parameter per token (forward + backward), plus attention's scores and mixing,
    # plus the output head (tied to the embedding, so not in non_embedding).
    assert config.positions == "rope" and config.ffn == "swiglu" and config.norm == "rmsnorm" and not config.bias
    flops_per_token = (6 * (non_embedding + config.vocab_size * config.d_model)
                       + 12 * config.n_layers * config.context_length * config.d_model)
    timings = {"minillm GPT": [], "plain PyTorch GPT": []}
    rates = []
    for _ in range(args.rounds):
        rates.append(matmul_flops_per_second())
        timings["minillm GPT"].append(step_seconds(ours, batch, args.steps))
        timings["plain PyTorch GPT"].append(step_seconds(plain, batch, args.steps))
    rate = statistics.median(rates)
    tokens = batch[0] * batch[1]
    print(f"threads {torch.get_num_threads()} · model {n_ours:,d} parameters, {config.n_layers} layers, d {config.d_model}, "
          f"batch {batch[0]} x {batch[1]} tokens · float32 matmul {rate / 1e9:.1f} GFLOP/s (measured)")
    print(f"{'model':20s} {'tokens/s':>10s} {'MFU':>7s} {'ratio':>7s}")
    base = statistics.median(timings["plain PyTorch GPT"])
    for name, values in timings.items():
        seconds = statistics.median(values)
        print(f"{name:20s} {tokens / seconds:10,.0f} {tokens / seconds * flops_per_token / rate:7.1%} "
              f"{base / seconds:7.2f}")
    print("ratio: the plain model's step time over this model's (above 1: faster than the plain model)")


if __name__ == "__main__":
    main()
