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
  times four sizes (about 3k to 107k non-embedding parameters); each run gets the tokens its
  budget buys (``tokens_for_compute``);
- ``lr``: the learning-rate rule checked: the smallest and the largest size at three
  learning rates (the rule's 3e-3 among them) on a quarter of the fixed budget.

Writes a JSON (default data/scaling_sweep.json) with the command, the settings, every run
(its size, tokens, FLOPs, learning rate, loss and seconds) and the sweep's time; it is
rewritten after every run, so an interrupted sweep keeps what it finished, and ``--resume``
reuses the runs of an earlier --out with the same settings (a run is deterministic: same
seed, same data) and trains only the missing ones. Usage:
python bench/scaling_sweep.py [--tokens 400000] [--budgets 1e11 3e11 1e12] [--threads 1]
    [--out data/scaling_sweep.json] [--resume] [--quick]
``--quick`` runs a tiny version (two sizes, a few steps) to check the script itself.
``--report`` trains nothing: it prints the fits of the cached --out (the power law of loss
against size, the prediction of the largest size from the others, the IsoFLOP optimum per
budget and N_opt ~ C^a, the learning-rate check), and ``--figure PATH`` also draws them.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

from minillm import data, scaling, train as training
from minillm.batches import BatchSampler
from minillm.loss import token_nll
from minillm.model import GPT, count_parameters
from minillm.recipe import recipe_config

CONTEXT, BATCH, VOCAB, EVAL_BYTES = 64, 16, 256, 32_768
# (d_model, n_layers): head_dim 16 throughout; non-embedding parameters about 12 n_layers d_model^2
SIZES = ((32, 1), (48, 2), (64, 2), (96, 3), (128, 4), (160, 4))
# at these budgets (seconds to a minute of CPU) the optimum is among the smallest models: the grid
# reaches below the size sweep's smallest so that every budget's losses curve up around a minimum
ISOFLOP_SIZES = ((16, 1), (32, 1), (48, 2), (64, 2))
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
    batches = BatchSampler(train_ids, BATCH, CONTEXT, seed=0)
    train_config = training.TrainConfig(steps=steps, lr=lr, warmup_steps=max(1, steps // 10), eval_every=steps,
                                        checkpoint_every=steps)
    started = time.perf_counter()
    history = training.train(model, batches, train_config, progress=False).history
    seconds = time.perf_counter() - started
    total, count = token_nll(model, val_ids, context=CONTEXT)
    used = steps * BATCH * CONTEXT
    return dict(kind=kind, d_model=d_model, n_layers=n_layers, n_heads=config.n_heads, lr=lr, steps=steps,
                tokens=used, non_embedding=count_parameters(config, non_embedding=True),
                parameters=count_parameters(config), flops=scaling.training_flops(config, used),
                budget=compute, val_loss=total / count, final_train_loss=sum(history["train_loss"][-10:]) / len(
                    history["train_loss"][-10:]), seconds=round(seconds, 2))


def plan(args) -> list[tuple]:
    """Every run as (kind, d_model, n_layers, tokens, lr, budget)."""
    sizes, isoflop_sizes = (SIZES[:2], ISOFLOP_SIZES[:3]) if args.quick else (SIZES, ISOFLOP_SIZES)
    runs = [("size", d, l, args.tokens, DEFAULT_LR, None) for d, l in sizes]
    for budget in args.budgets:
        for d, l in isoflop_sizes:
            runs.append(("isoflop", d, l, scaling.tokens_for_compute(config_for(d, l), budget, CONTEXT), DEFAULT_LR,
                         budget))
    for d, l in (sizes[0], sizes[-1]):
        runs.extend(("lr", d, l, args.tokens // 4, lr, None) for lr in LEARNING_RATES)
    return runs


def _key(entry: dict) -> tuple:
    """What makes two runs the same run (so a run in two experiments is trained once)."""
    return entry["d_model"], entry["n_layers"], entry["steps"], entry["lr"]


def report(sweep: dict, figure: Path | None = None) -> None:
    """Print the fits of a finished sweep (and draw them into ``figure``)."""
    size = sorted((r for r in sweep["runs"] if r["kind"] == "size"), key=lambda r: r["non_embedding"])
    n = [r["non_embedding"] for r in size]
    loss = [r["val_loss"] for r in size]
    print(f"{sweep['command']}: {len(sweep['runs'])} runs, {sweep['minutes']:.1f} minutes "
          f"({sweep.get('training_minutes', sweep['minutes']):.1f} of training), torch {sweep['torch']}")
    for r in size:
        print(f"  size {r['non_embedding']:>9,d} non-embedding, {r['tokens']:,d} tokens: loss {r['val_loss']:.4f}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = scaling.fit_power_law(n, loss)
        ahead = scaling.fit_power_law(n[:-1], loss[:-1])
    print(f"L(N) = {fit.a:.3g} N^-{fit.alpha:.3f} + {fit.c:.3f} (alpha +- {fit.alpha_std:.3f}, c +- {fit.c_std:.3f}, "
          f"c pinned: {fit.c_pinned}; {n[-1] / n[0]:.0f}x in N)")
    print(f"fitted on the {len(n) - 1} smaller sizes: predicts {ahead(n[-1]):.4f} for N = {n[-1]:,d}, measured "
          f"{loss[-1]:.4f} ({(ahead(n[-1]) - loss[-1]) / loss[-1]:+.1%})")
    iso_runs = [r for r in sweep["runs"] if r["kind"] == "isoflop"]
    with warnings.catch_warnings(record=True) as iso_caught:
        warnings.simplefilter("always")
        iso = scaling.fit_isoflop([r["budget"] for r in iso_runs], [r["non_embedding"] for r in iso_runs],
                                  [r["val_loss"] for r in iso_runs])
    for budget, optimum in zip(iso.budgets, iso.n_opt):
        row = sorted((r for r in iso_runs if r["budget"] == budget), key=lambda r: r["non_embedding"])
        print(f"  C = {budget:.0e}: " + ", ".join(f"{r['non_embedding']:,d} -> {r['val_loss']:.3f}" for r in row)
              + f"; N_opt = {optimum:,.0f}")
    print(f"N_opt ~ C^{iso.exponent:.2f} +- {iso.exponent_std:.2f} (Chinchilla 0.46-0.50, Kaplan 0.73)")
    for r in sorted((r for r in sweep["runs"] if r["kind"] in ("lr", "size")), key=lambda r: (r["non_embedding"],
                                                                                          r["lr"])):
        if r["kind"] == "lr":
            print(f"  lr check: N = {r['non_embedding']:,d}, lr {r['lr']:g}, {r['tokens']:,d} tokens: "
                  f"loss {r['val_loss']:.4f}")
    for warning in caught + iso_caught:
        print("warning:", warning.message)
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        grid = np.logspace(math.log10(n[0]) - 0.2, math.log10(n[-1]) + 0.3, 100)
        axes[0].loglog(n, loss, "o", label="measured")
        axes[0].loglog(grid, fit(grid), "-", label=f"$aN^{{-\\alpha}}+c$, $\\alpha$ = {fit.alpha:.2f}")
        axes[0].set(xlabel="non-embedding parameters", ylabel="validation loss (nats per byte)",
                    title=f"{sweep['settings']['tokens']:,d} tokens each")
        axes[0].legend()
        for budget, optimum in zip(iso.budgets, iso.n_opt):
            row = sorted((r for r in iso_runs if r["budget"] == budget), key=lambda r: r["non_embedding"])
            (line,) = axes[1].semilogx([r["non_embedding"] for r in row], [r["val_loss"] for r in row], "o-",
                                       label=f"C = {budget:.0e}")
            axes[1].axvline(optimum, color=line.get_color(), ls=":")
        axes[1].set(xlabel="non-embedding parameters", ylabel="validation loss (nats per byte)",
                    title=f"IsoFLOP: N_opt ~ C^{iso.exponent:.2f}")
        axes[1].legend()
        fig.tight_layout()
        fig.savefig(figure, dpi=110)
        print(f"wrote {figure}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=400_000, help="the size sweep's fixed budget of tokens")
    parser.add_argument("--budgets", type=float, nargs="+", default=[1e11, 3e11, 1e12], help="IsoFLOP budgets")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default: %(default)s; these models are too small to share a step)")
    parser.add_argument("--out", type=Path, default=Path("data") / "scaling_sweep.json")
    parser.add_argument("--resume", action="store_true", help="reuse the finished runs of --out (same settings)")
    parser.add_argument("--quick", action="store_true", help="a tiny sweep that checks the script")
    parser.add_argument("--report", action="store_true", help="train nothing: print the fits of the cached --out")
    parser.add_argument("--figure", type=Path, help="with --report: also draw the fits into this image")
    args = parser.parse_args(argv)
    if args.report:
        report(json.loads(args.out.read_text()), args.figure)
        return
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
    earlier_minutes = 0.0
    if args.resume and args.out.exists():
        earlier = json.loads(args.out.read_text())
        if earlier["settings"] != json.loads(json.dumps(result["settings"])):
            raise SystemExit(f"--resume: {args.out} was made with other settings: {earlier['settings']}")
        done = {_key(entry): entry for entry in earlier["runs"]}
        result["command"] = f"{earlier['command']}, then {result['command']}"  # what made the runs it keeps
        earlier_minutes = earlier["minutes"]
        print(f"--resume: {len(done)} finished runs in {args.out}", flush=True)
    for number, (kind, d, l, tokens, lr, budget) in enumerate(runs, 1):
        key = _key(dict(d_model=d, n_layers=l, steps=max(1, tokens // (BATCH * CONTEXT)), lr=lr))
        entry = dict(done[key], kind=kind, budget=budget) if key in done else run(kind, d, l, tokens, lr, train_ids,
                                                                                    val_ids, budget)
        done[key] = entry
        result["runs"].append(entry)
        result["minutes"] = round(earlier_minutes + (time.time() - started) / 60, 2)  # wall clock, all parts
        result["training_minutes"] = round(sum(entry["seconds"] for entry in done.values()) / 60, 2)
        result["complete"] = number == len(runs)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[{number}/{len(runs)}] {kind:7s} d_model {d:3d} x {l} layers, {entry['non_embedding']:>9,d} "
              f"non-embedding, {entry['tokens']:>10,d} tokens, lr {lr:g}: loss {entry['val_loss']:.4f} "
              f"({entry['seconds']:.0f} s)", flush=True)
    print(f"wrote {args.out}: {len(runs)} runs in {result['minutes']:.1f} minutes "
          f"({result['training_minutes']:.1f} minutes of training in all)")


if __name__ == "__main__":
    main()
