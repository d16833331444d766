"""Cached decoding against recomputing: what the KV cache buys, measured (chapter 09).

    python bench/kvcache.py [--threads 1] [--prompt 256] [--new 256] [--repeats 3]

A randomly initialized model of the shipped shape (4 layers, d_model 128, 4 heads, a
2,048-token vocabulary; RoPE, RMSNorm, SwiGLU) with a context of 1,024 tokens: greedy
generation of --new tokens after a --prompt-token prompt, with ``minillm.kvcache.KVCache``
and without a cache (every step reruns the whole context), side by side in one run, the
two ways alternating. Prints the best time of each, the ratio, whether the tokens agree,
the prefill and decode throughput with the cache, what a roll of the full cache (past
the context) costs against the decode step that follows it, and the load average the run
saw.
The weights do not change the cost, so a random model stands in for a trained one with a
longer context. One torch thread by default, as ``python -m minillm generate`` and chapter 09
run this model: a cached step's operations are too small to share between threads, while
the recompute's matrix products gain from a second one, so ``--threads 2`` gives a smaller
ratio on an idle machine. Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from minillm.generate import generate  # noqa: E402
from minillm.kvcache import KVCache  # noqa: E402
from minillm.model import GPT  # noqa: E402
from minillm.recipe import recipe_config  # noqa: E402


def seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


@torch.no_grad()
def roll_and_step_seconds(model, steps: int) -> tuple[float, float]:
    """The best time of ``KVCache.roll(1)`` on a full cache of the model's context, and of the
    one-token decode step that fills it again, over ``steps`` of each, alternating."""
    context = model.config.context_length
    cache = KVCache.for_model(model, 1)
    model(torch.randint(0, model.config.vocab_size, (1, context)), kv_cache=cache)
    token = torch.zeros(1, 1, dtype=torch.long)
    roll, step = float("inf"), float("inf")
    for _ in range(steps):
        roll = min(roll, seconds(lambda: cache.roll(1)))
        step = min(step, seconds(lambda: model(token, kv_cache=cache)))
    return roll, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--new", type=int, default=256, help="new tokens (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way; the best counts (default: %(default)s)")
    args = parser.parse_args()
    if args.prompt < 1 or args.new < 1 or args.prompt + args.new > 1024 or args.repeats < 1:
        parser.error("need --prompt >= 1, --new >= 1, --prompt + --new <= 1024 and --repeats >= 1")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(recipe_config(2048, context_length=1024)).eval()
    prompt = torch.randint(0, 2048, (1, args.prompt), generator=torch.Generator().manual_seed(1))

    outputs, best = {}, {"KV cache": float("inf"), "recompute": float("inf")}
    runs = {"KV cache": lambda: generate(model, prompt, args.new, temperature=0, kv_cache=KVCache.for_model(model, 1)),
            "recompute": lambda: generate(model, prompt, args.new, temperature=0)}
    for name in runs:  # warm up: the first call of each way pays one-time set-up costs
        generate(model, prompt[:, :8], 2, temperature=0, **({"use_cache": True} if name == "KV cache" else {}))
    for _ in range(args.repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            outputs[name] = run()
            best[name] = min(best[name], time.perf_counter() - started)

    with torch.no_grad():
        prefill = min(seconds(lambda: model(prompt, kv_cache=KVCache.for_model(model, 1))) for _ in range(args.repeats))
    decode = (best["KV cache"] - prefill) / (args.new - 1) if args.new > 1 else float("nan")

    print(f"model: the shipped shape, randomly initialized, context 1024; {args.prompt}-token prompt, "
          f"{args.new} new tokens, greedy; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"best of {args.repeats}")
    for name, value in best.items():
        print(f"{name:>10s}: {value:6.2f} s  ({args.new / value:6.1f} tokens/s)")
    print(f"ratio: the KV cache is {best['recompute'] / best['KV cache']:.1f}x faster; "
          f"same tokens: {torch.equal(outputs['KV cache'], outputs['recompute'])}")
    print(f"with the cache: prefill {args.prompt / prefill:,.0f} tokens/s, decode {1 / decode:,.0f} tokens/s")
    roll, step = roll_and_step_seconds(model, steps=20)
    print(f"past the context: a roll of the full cache (1 of {model.config.context_length} positions) "
          f"{roll * 1e3:.2f} ms, the decode step after it {step * 1e3:.2f} ms: the roll is {roll / step:.0%} of a step")
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
