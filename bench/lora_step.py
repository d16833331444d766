"""Time per training step of LoRA against full fine-tuning of the shipped model (chapter 12).

Every model is the shipped model with its Q/K/V projection unfused; each step is forward,
backward and an AdamW step (``minillm.optim.build_optimizer``) on one fixed batch of 8
windows of 128 tokens. The models are timed in short interleaved rounds (each round
starting with the next model), so that a change in the machine's load hits all alike;
the table gives, for each, the median over the rounds of its time divided by full
fine-tuning's time in the same round, and the range.
A second copy of the full fine-tune is timed too: the spread of its ratio around 1 is the
noise floor. Usage: python bench/lora_step.py [--rounds 5] [--steps 2] [--threads 1]
"""
import argparse
import statistics
import time

import torch

from minillm import lora
from minillm.recipe import load_pretrained
from minillm.optim import build_optimizer

RUNS = {"full fine-tune": None, "full fine-tune (again)": None, "LoRA r=1 q,v": (1, ("q", "v")),
        "LoRA r=2 all": (2, ("all",)), "LoRA r=16 all": (16, ("all",))}


def step(model, optimizer, x, y) -> None:
    _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shipped, _ = load_pretrained()
    torch.manual_seed(0)
    windows = torch.randint(0, shipped.config.vocab_size, (8, 129))
    x, y = windows[:, :-1], windows[:, 1:]
    runs = {}
    for name, spec in RUNS.items():
        model = lora.unfuse_qkv(shipped).train()
        if spec is not None:
            lora.apply_lora(model, spec[0], 8.0, spec[1])
        optimizer = build_optimizer(model, lr=1e-4)
        step(model, optimizer, x, y)  # warm-up: the optimizer's state is allocated here
        runs[name] = (model, optimizer, [])
    order = list(runs.values())
    for round_ in range(args.rounds):
        for model, optimizer, times in order[round_ % len(order):] + order[: round_ % len(order)]:  # rotate who goes first
            start = time.perf_counter()
            for _ in range(args.steps):
                step(model, optimizer, x, y)
            times.append((time.perf_counter() - start) / args.steps)
    baseline = runs["full fine-tune"][2]
    print(f"{'run':24s} {'trainable':>10s} {'s/step (median)':>16s} {'ratio to full':>14s} {'range':>13s}")
    for name, (model, _, times) in runs.items():
        ratios = [t / b for t, b in zip(times, baseline)]
        print(f"{name:24s} {lora.trainable_parameters(model):10,d} {statistics.median(times):16.3f} "
              f"{statistics.median(ratios):14.2f} {min(ratios):6.2f}–{max(ratios):.2f}")
    print(f"{args.rounds} rounds of {args.steps} steps each, {torch.get_num_threads()} threads, torch {torch.__version__}")


if __name__ == "__main__":
    main()
