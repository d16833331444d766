"""Chapter 08's scaling-law lab: GPTs of six sizes on the bundled corpus, on a CPU.

Every model is the course's recipe shape (RoPE, RMSNorm, SwiGLU, no biases, tied
embeddings; ``minillm.recipe.recipe_config``) on the corpus's bytes (a vocabulary of 256,
one token a character), windows of 64 tokens, batches of 16, AdamW with the recipe's
schedule (warmup over 10% of the steps, cosine to a tenth). The first 90% of the corpus
trains, the loss is measured on the first 32,768 bytes of the last 10%, in nats per byte.

Three experiments, every run starting from seed 0:
- ``size``: the six sizes (non-embedding parameters from about 12k to 1.2M, a factor near
  100), each on the same fixed budget of tokens (--tokens);
- ``isoflop``: three compute budgets (--budgets, in FLOPs of ``minillm.scaling.training_flops``)
  times four sizes; each run gets the tokens its budget buys (``tokens_for_compute``);
- ``lr``: the learning-rate rule checked: the smallest and the largest size at three
  learning rates on a quarter of the fixed budget.

Writes a JSON (default data/scaling_sweep.json) with the command, the settings, every run
(its size, tokens, FLOPs, learning rate, loss and seconds) and the sweep's time; it is
rewritten after every run, so an interrupted sweep keeps what it finished. Usage:
python bench/scaling_sweep.py [--tokens 400000] [--budgets 1e11 3e11 1e12] [--threads 1]
    [--out data/scaling_sweep.json] [--quick]
``--quick`` runs a tiny version (two sizes, a few steps) to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from minillm import data, scaling, train as training
from minillm.model import GPT, count_parameters
from minillm.recipe import recipe_config

CONTEXT, BATCH, VOCAB, EVAL_BYTES = 64, 16, 256, 32_768
# (d_model, n_layers): head_dim 16 throughout; non-embedding parameters about 12 n_layers d_model^2
SIZES = ((32, 1), (48, 2), (64, 2), (96, 3), (128, 4), (160, 4))
ISOFLOP_SIZES = SIZES[:4]
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
DEFAULT_LR = 3e-3  # the recipe's; the lr runs check it at both ends of the sizes


def config_for(d_model: int, n_layers: int):
    return recipe_config(VOCAB, context_length=CONTEXT, d_model=d_model, n_layers=n_layers, n_heads=d_model // 16)


def byte_ids(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def run(kind: str, d_model: int, n_layers: int, tokens: int, lr: float, train_ids, val_ids, compute=None) -> dict:
    """Train one model on ``tokens`` tokens (rounded down to whole steps) and measure it."""
    config = config_for(d_model, n_layers)
    steps = max(1, tokens // (BATCH * CONTEXT))
    torch.manual_seed(0)
    model = GPT(config)
    batches = training.BatchSampler(train_ids, BATCH, CONTEXT, seed=0)
    train_config = training.TrainConfig(steps=steps, lr=lr, warmup_steps=max(1, steps // 10), eval_every=steps,
                                        checkpoint_every=steps)
    started = time.perf_counter()
    history = training.train(model, batches, train_config, progress=False).history
    seconds = time.perf_counter() - started
    total, count = training.token_nll(model, val_ids, context=CONTEXT)
    used = steps * BATCH * CONTEXT
    return dict(kind=kind, d_model=d_model, n_layers=n_layers, n_heads=config.n_heads, lr=lr, steps=steps,
                tokens=used, non_embedding=count_parameters(config, non_embedding=True),
                parameters=count_parameters(config), flops=scaling.training_flops(config, used),
                budget=compute, val_loss=total / count, final_train_loss=sum(history["train_loss"][-10:]) / len(
                    history["train_loss"][-10:]), seconds=round(seconds, 2))


def plan(args) -> list[tuple]:
    """Every run as (kind, d_model, n_layers, tokens, lr, budget)."""
    sizes, isoflop_sizes = (SIZES[:2], SIZES[:2]) if args.quick else (SIZES, ISOFLOP_SIZES)
    runs = [("size", d, l, args.tokens, DEFAULT_LR, None) for d, l in sizes]
    for budget in args.budgets:
        for d, l in isoflop_sizes:
            runs.append(("isoflop", d, l, scaling.tokens_for_compute(config_for(d, l), budget, CONTEXT), DEFAULT_LR,
                         budget))
    for d, l in (sizes[0], sizes[-1]):
        runs.extend(("lr", d, l, args.tokens // 4, lr, None) for lr in LEARNING_RATES if lr != DEFAULT_LR)
    return runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=400_000, help="the size sweep's fixed budget of tokens")
    parser.add_argument("--budgets", type=float, nargs="+", default=[1e11, 3e11, 1e12], help="IsoFLOP budgets")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default: %(default)s; these models are too small to share a step)")
    parser.add_argument("--out", type=Path, default=Path("data") / "scaling_sweep.json")
    parser.add_argument("--quick", action="store_true", help="a tiny sweep that checks the script")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.budgets = 8 * BATCH * CONTEXT, [2e8, 6e8]
    torch.set_num_threads(args.threads)
    train_text, val_text = data.split_corpus(data.corpus_text())
    train_ids, val_ids = byte_ids(train_text), byte_ids(val_text)[: EVAL_BYTES if not args.quick else 4096]
    runs = plan(args)
    started = time.time()
    result = dict(command="python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                  settings=dict(context=CONTEXT, batch_size=BATCH, vocab_size=VOCAB, eval_bytes=len(val_ids),
                                train_bytes=len(train_ids), tokens=args.tokens, budgets=args.budgets,
                                default_lr=DEFAULT_LR, learning_rates=LEARNING_RATES, threads=args.threads,
                                shape="recipe_config: rope, rmsnorm, swiglu, no bias, tied; head_dim 16"),
                  torch=str(torch.__version__), python=platform.python_version(), runs=[])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done: dict[tuple, dict] = {}
    for number, (kind, d, l, tokens, lr, budget) in enumerate(runs, 1):
        key = (d, l, tokens // (BATCH * CONTEXT), lr)  # the same run in two experiments is trained once
        entry = dict(done[key], kind=kind, budget=budget) if key in done else run(kind, d, l, tokens, lr, train_ids,
                                                                                    val_ids, budget)
        done[key] = entry
        result["runs"].append(entry)
        result["minutes"] = round((time.time() - started) / 60, 2)
        result["complete"] = number == len(runs)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[{number}/{len(runs)}] {kind:7s} d_model {d:3d} x {l} layers, {entry['non_embedding']:>9,d} "
              f"non-embedding, {entry['tokens']:>10,d} tokens, lr {lr:g}: loss {entry['val_loss']:.4f} "
              f"({entry['seconds']:.0f} s)", flush=True)
    print(f"wrote {args.out}: {len(runs)} runs in {result['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()
