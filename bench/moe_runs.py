"""Chapter 11's experiments: a mixture of experts against a dense model of equal active size.

    python bench/moe_runs.py                 # the full runs; writes data/moe_runs.json and data/moe-vs-dense.png
    python bench/moe_runs.py --figure-only   # only the figure, from the cache
    python bench/moe_runs.py --recount-flops  # flops_per_token of every cached run, from its config; then the figure
    python bench/moe_runs.py --steps 20 --seeds 1 --out /tmp/moe_runs.json --figure /tmp/moe.png   # a quick check

On the bundled corpus and the course's model shape (``minillm.recipe``: 4 layers, d_model
128, RoPE, RMSNorm, SwiGLU, the shipped 2048-token tokenizer), it trains, each with the
same data order for a given seed:

- "dense-s{seed}": the recipe's dense SwiGLU FFN (d_ff 352), seeds 0, 1, 2;
- "moe-s{seed}": 8 SwiGLU experts of d_ff 176, top-2, capacity factor 1.25, the
  load-balancing loss (0.01) and the z-loss (1e-3): the same active FFN parameters as the
  dense model (2 x 176 = 352) plus a 1,024-weight router per layer; seeds 0, 1, 2;
- "moe-nobalance": seed 0 without the load-balancing loss;
- "moe-noz": seed 0 without the z-loss.

It logs the held-out loss (dropless evaluation), the language-model and auxiliary losses,
and the routing of every MoE layer (share of each expert, drop rate, router entropy, logit
size) over training, and the training FLOPs per token by chapter 08's formula
(``minillm.scaling.training_flops``: 6 N plus attention's 12 L T d_attn); then, on the
trained seed-0 models, the drop rate at capacity factors 1.0, 1.25 and 2.0, and which
tokens each expert of the seed-0 model takes. Runs go to
``--workers`` processes of one thread each; the JSON records the command and its time.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from minillm import data
from minillm.model import GPT, GPTConfig, count_parameters
from minillm.moe import MoEFeedForward, routing_metrics
from minillm.recipe import load_pretrained, recipe_config, recipe_train_config
from minillm.scaling import training_flops
from minillm.batches import BatchSampler
from minillm.train import held_out_loss, train

MOE_OPTIONS = {"n_experts": 8, "top_k": 2, "expert": "swiglu", "capacity_factor": 1.25}
CAPACITY_FACTORS = (1.0, 1.25, 2.0)
LOG_EVERY = 20  # routing and losses are averaged over blocks of this many steps


def run_configs(vocab_size: int, seeds) -> dict:
    """Every run's model config, by run name."""
    configs = {f"dense-s{s}": recipe_config(vocab_size) for s in seeds}
    moe = dict(ffn="moe", d_ff=176)
    configs.update({f"moe-s{s}": recipe_config(vocab_size, **moe, ffn_options=MOE_OPTIONS) for s in seeds})
    configs["moe-nobalance"] = recipe_config(vocab_size, **moe, ffn_options={**MOE_OPTIONS, "balance_coef": 0.0})
    configs["moe-noz"] = recipe_config(vocab_size, **moe, ffn_options={**MOE_OPTIONS, "z_coef": 0.0})
    return configs


def flops_per_token(config) -> int:
    """Training FLOPs per token in full windows: chapter 08's ``training_flops(config, 1)``, whose
    N counts a mixture's active parameters (the router and top_k experts)."""
    return training_flops(config, 1)


def recount_flops(cache: dict) -> dict:
    """``cache`` with every run's ``flops_per_token`` recounted from the run's stored config
    (no training: the count depends on the config alone)."""
    runs = {name: {**run, "flops_per_token": flops_per_token(GPTConfig.from_dict(run["config"]))}
            for name, run in cache["runs"].items()}
    return {**cache, "runs": runs}


def loss_with_routing(model, batch):
    """``train``'s loss: the model's loss (cross-entropy plus auxiliary losses), logging the
    cross-entropy alone ("lm_loss"), the auxiliary parts and the routing of every MoE layer."""
    x, y = batch
    _, loss = model(x, y)
    parts = model.last_aux_losses
    metrics = {"lm_loss": float(loss.detach()) - parts.get("aux_loss", 0.0), **parts, **routing_metrics(model)}
    return loss, metrics


def block_means(values, every: int = LOG_EVERY) -> list[float]:
    return [round(sum(values[i:i + every]) / len(values[i:i + every]), 5) for i in range(0, len(values), every)]


def one_run(job) -> dict:
    name, config, seed, steps, batch_size, train_ids, val_ids = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = GPT(config)
    train_config = recipe_train_config(steps=steps, eval_every=max(1, steps // 12))
    batches = BatchSampler(train_ids, batch_size, config.context_length, seed=seed)
    start = time.perf_counter()
    state = train(model, batches, train_config, loss_fn=loss_with_routing,
                  evaluate=held_out_loss(val_ids, max_windows=32), progress=False)
    seconds = time.perf_counter() - start
    history = state.history
    record = {"config": config.to_dict(), "seed": seed, "seconds": round(seconds, 1),
              "tokens_per_second": round(steps * batch_size * config.context_length / seconds),
              "params_total": count_parameters(config), "params_active": count_parameters(config, active=True),
              "flops_per_token": flops_per_token(config), "val_step": history["val_step"],
              "val_loss": [round(v, 5) for v in history["val_loss"]],
              "log_step": list(range(LOG_EVERY, steps + 1, LOG_EVERY))[: len(block_means(history["lm_loss"]))],
              "lm_loss": block_means(history["lm_loss"])}
    if config.ffn == "moe":  # the auxiliary losses ("moe_balance", "moe_z") and each layer's routing ("moe0/...")
        record["log"] = {key: block_means(history[key]) for key in sorted(history) if key.startswith("moe")}
        record["drop_rate_eval"] = drop_rates(model, val_ids)
        if name == "moe-s0":
            record["experts"] = expert_tokens(model, val_ids)
    print(f"{name}: {seconds:.0f} s, final val loss {history['val_loss'][-1]:.4f}", flush=True)
    return {name: record}


@torch.no_grad()
def drop_rates(model: GPT, val_ids: torch.Tensor, windows: int = 32) -> dict[str, list[float]]:
    """The fraction of assignments dropped in each MoE layer at each capacity factor, on
    ``windows`` held-out windows in batches of 8 (the training batch), the router as trained."""
    model.eval()
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    context = model.config.context_length
    starts = torch.linspace(0, len(val_ids) - context - 1, windows).long()
    result = {}
    for factor in CAPACITY_FACTORS:
        for layer in layers:
            layer.eval_capacity_factor = factor
        dropped = torch.zeros(len(layers))
        for i in range(0, windows, 8):
            batch = torch.stack([val_ids[s:s + context] for s in starts[i:i + 8]])
            model(batch)
            dropped += torch.tensor([float(layer.last_stats["dropped"]) for layer in layers])
        result[str(factor)] = [round(v, 4) for v in (dropped / (windows // 8)).tolist()]
    for layer in layers:
        layer.eval_capacity_factor = None
    return result


@torch.no_grad()
def expert_tokens(model: GPT, val_ids: torch.Tensor, windows: int = 128, top: int = 8) -> dict:
    """Which tokens each expert of each MoE layer takes as a first choice, on held-out text.

    For each (layer, expert): its share of first choices, and the tokens (seen at least 20
    times) with the largest fraction of their occurrences sent to it, with that fraction.
    """
    _, tokenizer = load_pretrained()
    model.eval()
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    first: list[list[torch.Tensor]] = [[] for _ in layers]
    context = model.config.context_length
    starts = torch.linspace(0, len(val_ids) - context - 1, windows).long()
    seen = []
    for i in range(0, windows, 16):
        batch = torch.stack([val_ids[s:s + context] for s in starts[i:i + 16]])
        captured = []  # each layer's first choice per token, read off its input by a hook
        handles = [layer.register_forward_hook(lambda mod, inp, out: captured.append(
            mod.router(inp[0].reshape(-1, mod.d_model).float()).argmax(-1))) for layer in layers]
        model(batch)
        for handle in handles:
            handle.remove()
        for layer_index, choice in enumerate(captured):
            first[layer_index].append(choice)
        seen.append(batch.reshape(-1))
    ids = torch.cat(seen)
    counts = Counter(ids.tolist())
    frequent = [t for t, c in counts.items() if c >= 20]
    result = {"windows": windows, "tokens": len(ids), "layers": []}
    for layer_index, layer in enumerate(layers):
        choice = torch.cat(first[layer_index])
        table = torch.zeros(layer.n_experts, model.config.vocab_size)
        table.index_put_((choice, ids), torch.ones(len(ids)), accumulate=True)
        per_token = table / table.sum(0, keepdim=True).clamp_min(1)
        experts = []
        for e in range(layer.n_experts):
            ranked = sorted(frequent, key=lambda t: (-float(per_token[e, t]), -counts[t]))[:top]
            experts.append({"share": round(float(table[e].sum() / len(ids)), 4),
                            "tokens": [[tokenizer.decode([t]), round(float(per_token[e, t]), 3), counts[t]]
                                       for t in ranked]})
        result["layers"].append(experts)
    return result


def draw(cache_path: Path, figure_path: Path) -> None:
    """The held-out loss of every dense and MoE seed against steps and against training FLOPs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cache = json.loads(Path(cache_path).read_text())
    runs = cache["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True, layout="constrained")
    for kind, color, label in (("dense", "tab:blue", "dense, d_ff 352"), ("moe", "tab:orange", "MoE, 8 × d_ff 176, top-2")):
        names = sorted(name for name in runs if name.startswith(f"{kind}-s"))
        for i, name in enumerate(names):
            run = runs[name]
            tokens = [step * cache["batch_size"] * run["config"]["context_length"] for step in run["val_step"]]
            shown = label if i == 0 else None
            axes[0].plot(run["val_step"], run["val_loss"], color=color, alpha=0.8, label=shown)
            axes[1].plot([t * run["flops_per_token"] / 1e12 for t in tokens], run["val_loss"], color=color, alpha=0.8)
    axes[0].set_xlabel("optimizer step (batch 8 × 128 tokens)")
    axes[1].set_xlabel("training compute (TFLOPs)")
    axes[0].set_ylabel("held-out loss (nats per token)")
    axes[0].set_ylim(top=7.0)
    axes[0].legend()
    fig.suptitle(f"MoE against dense at equal active parameters, {len(names)} seeds each ({cache['command']})",
                 fontsize=10)
    fig.savefig(figure_path, dpi=110)
    print(f"wrote {figure_path}")


def write_cache(path: Path, cache: dict) -> None:
    path.write_text(json.dumps(cache, indent=1) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(data.data_dir() / "moe_runs.json"))
    parser.add_argument("--figure", default=str(data.data_dir() / "moe-vs-dense.png"),
                        help="where the loss figure goes (default: %(default)s)")
    parser.add_argument("--figure-only", action="store_true", help="only draw the figure from the cache in --out")
    parser.add_argument("--recount-flops", action="store_true",
                        help="recount flops_per_token in the cache in --out from its configs, then draw the figure")
    args = parser.parse_args(argv)
    if args.recount_flops:
        write_cache(Path(args.out), recount_flops(json.loads(Path(args.out).read_text())))
    if args.figure_only or args.recount_flops:
        draw(Path(args.out), Path(args.figure))
        return
    start = time.perf_counter()
    _, tokenizer = load_pretrained()
    train_text, val_text = data.split_corpus(data.corpus_text())
    train_ids = torch.tensor(tokenizer.encode(train_text))
    val_ids = torch.tensor(tokenizer.encode(val_text))
    configs = run_configs(len(tokenizer.vocab), range(args.seeds))
    jobs = [(name, config, int(name.split("-s")[-1]) if "-s" in name else 0, args.steps, args.batch_size,
             train_ids, val_ids) for name, config in configs.items()]
    jobs.sort(key=lambda job: job[1].ffn != "moe")  # the slower MoE runs first, so the workers finish together
    runs = {}
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for result in pool.imap_unordered(one_run, jobs):
            runs.update(result)
    seconds = time.perf_counter() - start
    command = "python bench/moe_runs.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    out = {"command": command.strip(), "seconds": round(seconds), "workers": args.workers,
           "threads_per_worker": 1, "torch": torch.__version__, "python": platform.python_version(),
           "steps": args.steps, "batch_size": args.batch_size, "moe_options": MOE_OPTIONS,
           "runs": {name: runs[name] for name in configs}}
    write_cache(Path(args.out), out)
    print(f"trained in {seconds:.0f} s")
    draw(Path(args.out), Path(args.figure))


if __name__ == "__main__":
    main()
