"""Training throughput of minillm's GPT against nanoGPT's model of the same shape.

The baseline is nanoGPT's model (Karpathy, 2022) written out below: one fused ``c_attn``
Linear, ``F.scaled_dot_product_attention(..., is_causal=True)``, ``F.layer_norm``,
``nn.GELU``, learned positions, tied embeddings, no biases, d_ff = 4 d_model. The package's
GPT is ``GPTConfig``'s defaults with only the shape set (no biases included), so both
have the same 935,040 parameters (asserted). Each step is forward, backward and an AdamW
step on a fixed batch.

The models are timed in short interleaved rounds, so that a change in the machine's load
hits both alike; the table gives the median over the rounds of each round's ratio, and
its range. The baseline is also timed against a second copy of itself: the spread of that
ratio around 1 is the noise floor of the measurement. The two models dispatch the same
kernels on the same shapes and strides (tests/test_bench_train.py), so a ratio away from 1
beyond that floor would point at the machine, not the model. Usage:
python bench/train.py [--rounds 9] [--steps 5] [--threads 2] [--profile]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from minillm.model import GPT, GPTConfig

SHAPE = dict(vocab_size=1024, context_length=128, d_model=128, n_layers=4, n_heads=4, bias=False)
BATCH_SIZE = 16
PARAMETERS = 935_040


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias (here none)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class Block(nn.Module):
    def __init__(self, d, n_heads):
        super().__init__()
        self.ln_1, self.ln_2 = LayerNorm(d), LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT's GPT, bias=False, dropout 0: the baseline."""

    def __init__(self, vocab, context, d, n_layers, n_heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, n_heads) for _ in range(n_layers))
        self.ln_f = LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("c_proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids, targets):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class Runner:
    """A model, its AdamW and a fixed batch; ``seconds(steps)`` times that many training steps."""

    def __init__(self, model, batch):
        self.model, self.x, self.y = model, batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        self.seconds(2)  # the first steps allocate (and create AdamW's state)

    def step(self):
        _, loss = self.model(self.x, self.y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def seconds(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - start) / steps


def profile(runner, steps: int, rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per model per round (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--profile", action="store_true", help="also profile the package's step (torch.profiler)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPTConfig(**SHAPE)
    models = {"minillm GPT": GPT(config),
              "nanoGPT": NanoGPT(config.vocab_size, config.context_length, config.d_model, config.n_layers,
                                 config.n_heads),
              "nanoGPT, again": NanoGPT(config.vocab_size, config.context_length, config.d_model, config.n_layers,
                                        config.n_heads)}
    counts = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    assert set(counts.values()) == {PARAMETERS}, f"the models must have {PARAMETERS:,d} parameters each, got {counts}"
    batch = torch.randint(0, config.vocab_size, (BATCH_SIZE, config.context_length + 1))
    runners = {name: Runner(model, batch) for name, model in models.items()}
    times = {name: [] for name in runners}
    for round_ in range(args.rounds):
        order = list(runners) if round_ % 2 == 0 else list(reversed(runners))  # no model always goes first
        for name in order:
            times[name].append(runners[name].seconds(args.steps))
    tokens = BATCH_SIZE * config.context_length
    base = times["nanoGPT"]
    print(f"threads {torch.get_num_threads()} · {PARAMETERS:,d} parameters each · {config.n_layers} layers, "
          f"d {config.d_model}, {config.n_heads} heads, context {config.context_length}, vocab {config.vocab_size}, "
          f"batch {BATCH_SIZE} · {args.rounds} rounds of {args.steps} steps · minillm: {config.positions}, "
          f"{config.norm}, {config.ffn}, attention {config.attention_backend!r}")
    print(f"{'model':16s} {'tokens/s':>10s} {'vs nanoGPT (median)':>20s} {'range over rounds':>19s}")
    for name, values in times.items():
        ratios = [b / t for b, t in zip(base, values)]  # above 1: faster than the baseline in that round
        spread = "" if name == "nanoGPT" else f"{min(ratios):.2f}–{max(ratios):.2f}"
        print(f"{name:16s} {tokens / statistics.median(values):10,.0f} {statistics.median(ratios):20.2f} {spread:>19s}")
    print("ratio: nanoGPT's step time over the model's, per round; 'nanoGPT, again' is the noise floor")
    if args.profile:
        profile(runners["minillm GPT"], steps=3, rows=25)


if __name__ == "__main__":
    main()
