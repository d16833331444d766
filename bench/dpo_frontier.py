"""DPO's frontier on the shipped model: the preferred attribute against the KL to the reference (chapter 13).

The pairs: the shipped model (``minillm.recipe.load_pretrained``) writes ``samples``
continuations of ``response_tokens`` tokens for each of ``train_prompts`` prompts of the
training text; ``minillm.dpo.preference_pairs`` pairs a continuation that uses "love"
(``uses_target``) with one that does not. Held-out pairs are made the same way on
prompts of the validation text.

The runs: DPO at each beta and supervised fine-tuning on the chosen responses (the
baseline), every one from the shipped model with the same pairs, batches, steps and
learning rate (full fine-tuning, AdamW through ``minillm.train.train``, constant rate
after a short warmup, no weight decay), against a frozen copy of the shipped model.
Every ``eval_every`` steps, and before the first, each run is measured on the held-out
prompts (``evaluate_policy``: one sample per prompt from the policy; the attribute rate and
the KL estimate in nats per response), on the held-out pairs (``pair_metrics``: reward
accuracy, margins, chosen and rejected log-probabilities; SFT's with the beta of
``--sft-beta``, which scales its margins only) and on Shakespeare's validation text
(nats per character). The history of every training step (loss, logged log-probabilities
and rewards) is kept too.

Writes a JSON (default data/dpo_frontier.json) with the command, the settings, the pairs'
numbers, every run and the time, and the figure data/dpo-frontier.png. Usage:
python bench/dpo_frontier.py [--betas 0.1 0.3 1 3] [--steps 150] [--lr 3e-4] [--threads 1]

Every run starts from the same seeds and the same pairs, so the numbers do not depend on
which runs share a process: ``--only dpo:0.1 sft`` makes some of them (into --out), and
``--merge A.json B.json ...`` writes the document of the parts, in the usual order, with
the sum of their times, and its figure; ``--pairs FILE`` lets the parts sample the pairs once. ``--plot`` redraws
the figure from --out.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from minillm import curves, data, dpo
from minillm.recipe import load_pretrained
from minillm.loss import nats_per_char
from minillm.train import TrainConfig, train

SETTINGS = dict(train_prompts=1024, held_prompts=512, held_pair_prompts=256, samples=8, prompt_tokens=32,
                response_tokens=32, held_chars=100_000, shakespeare_chars=8_000, batch_size=16, warmup_steps=10,
                weight_decay=0.0, eval_every=25, seed=0)


def task_data(tokenizer, settings: dict) -> dict:
    """Prompts, held-out texts and the Shakespeare validation stream every run uses."""
    train_text, val_text = data.split_corpus(data.corpus_text())
    n = settings["held_chars"]
    shakespeare = val_text[n: n + settings["shakespeare_chars"]]
    held = dpo.prompt_windows(tokenizer, val_text[:n], settings["held_prompts"], settings["prompt_tokens"])
    return {"train_prompts": dpo.prompt_windows(tokenizer, train_text, settings["train_prompts"], settings["prompt_tokens"]),
            "held_prompts": held, "held_pair_prompts": held[::settings["held_prompts"] // settings["held_pair_prompts"]],
            "shakespeare": (torch.tensor(tokenizer.encode(shakespeare)), len(shakespeare))}


def make_pairs(shipped, tokenizer, task: dict, settings: dict):
    """The training and held-out pairs, sampled from the shipped model with seeded generators."""
    pairs = dpo.preference_pairs(shipped, tokenizer, task["train_prompts"], settings["samples"],
                                 settings["response_tokens"], generator=torch.Generator().manual_seed(settings["seed"]))
    held_pairs = dpo.preference_pairs(shipped, tokenizer, task["held_pair_prompts"], settings["samples"],
                                      settings["response_tokens"],
                                      generator=torch.Generator().manual_seed(settings["seed"] + 2))
    return pairs, held_pairs


def measure(policy, reference, tokenizer, task: dict, held_pairs, beta: float, settings: dict) -> dict:
    """The held-out numbers of a policy (its samples drawn with a seeded generator, the same for every run)."""
    sampled = dpo.evaluate_policy(policy, reference, tokenizer, task["held_prompts"], settings["response_tokens"],
                                  generator=torch.Generator().manual_seed(settings["seed"] + 1))
    ids, n_chars = task["shakespeare"]
    return {**sampled, **{f"held_{key}": value for key, value in dpo.pair_metrics(policy, reference, held_pairs, beta).items()},
            "shakespeare": nats_per_char(policy, ids, n_chars)}


def run(shipped, tokenizer, task: dict, pairs, held_pairs, settings: dict, steps: int, lr: float, method: str,
        beta: float) -> dict:
    """One run from the shipped model: its measurements every eval_every steps, and its step history."""
    torch.manual_seed(settings["seed"])
    reference = dpo.frozen_reference(shipped)
    policy = dpo.frozen_reference(shipped).train().requires_grad_(True)
    objective = dpo.dpo_objective(reference, beta) if method == "dpo" else dpo.sft_objective
    config = TrainConfig(steps=steps, lr=lr, warmup_steps=settings["warmup_steps"], min_lr_ratio=1.0,
                         weight_decay=settings["weight_decay"], eval_every=settings["eval_every"], checkpoint_every=steps)
    points = [{"step": 0, **measure(policy, reference, tokenizer, task, held_pairs, beta, settings)}]
    trained = {"seconds": 0.0}

    def evaluate(model):
        trained["seconds"] += time.perf_counter() - trained.pop("since")
        step = min(len(points) * settings["eval_every"], steps)  # train evaluates every eval_every steps and at the end
        points.append({"step": step, **measure(model, reference, tokenizer, task, held_pairs, beta, settings)})
        trained["since"] = time.perf_counter()
        return {}

    trained["since"] = time.perf_counter()
    state = train(policy, dpo.PairBatches(pairs, settings["batch_size"], seed=settings["seed"]), config, loss_fn=objective,
                  evaluate=evaluate, progress=False)
    trained["seconds"] += time.perf_counter() - trained.pop("since")
    history = {key: [round(value, 5) for value in values] for key, values in state.history.items()
               if key not in ("lr", "val_step")}
    return {"method": method, "beta": beta, "lr": lr, "steps": steps, "points": points, "history": history,
            "seconds_per_step": trained["seconds"] / steps}


def _name(method: str, beta: float) -> str:
    return "sft" if method == "sft" else f"dpo:{beta:g}"


def _order(run_: dict) -> tuple:
    return (run_["method"] == "sft", run_["beta"])


def plot(document: dict, path: Path) -> None:
    """The chapter's figure of the sweep (``minillm.curves.plot_frontier``), written to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    curves.plot_frontier(document).savefig(path, dpi=110)


def merge(parts: list[str], out: str) -> None:
    documents = [json.loads(Path(part).read_text()) for part in parts]
    first = documents[0]
    for document in documents[1:]:
        if document["settings"] != first["settings"] or document["steps"] != first["steps"] or document["lr"] != first["lr"]:
            raise ValueError(f"the parts were made with other settings: {parts}")
    runs = sorted((run_ for document in documents for run_ in document["runs"]), key=_order)
    document = {**first, "command": "python bench/dpo_frontier.py" + "".join(
                    f" --{key} {first[key]}" for key in ("steps", "lr") if first[key] != DEFAULTS[key]),
                "made_by": [document["command"] for document in documents] + ["python bench/dpo_frontier.py --merge " + " ".join(parts)],
                "runs": runs, "seconds": round(sum(document["seconds"] for document in documents), 1),
                "seconds_of_parts": [document["seconds"] for document in documents]}
    Path(out).write_text(json.dumps(document, indent=1) + "\n")
    plot(document, Path(out).with_name("dpo-frontier.png"))
    print(f"wrote {out} ({len(runs)} runs) and its figure")


DEFAULTS = {"steps": 150, "lr": 3e-4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    parser.add_argument("--sft-beta", type=float, default=0.3, help="the beta that scales SFT's reward margins")
    parser.add_argument("--out", default=str(data.data_dir() / "dpo_frontier.json"))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: as fast for this model, and robust on a busy machine)")
    parser.add_argument("--only", nargs="+", help="runs to make: sft or dpo:BETA")
    parser.add_argument("--merge", nargs="+", help="parts written with --only, to merge into --out")
    parser.add_argument("--plot", action="store_true", help="redraw the figure from --out")
    parser.add_argument("--pairs", help="a file to keep the sampled pairs in: read when it exists (the parts of a "
                        "sweep then sample them once), else written")
    parser.add_argument("--quick", action="store_true", help="a smoke test: few prompts and steps (not for the cache)")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    if args.plot:
        return plot(json.loads(Path(args.out).read_text()), Path(args.out).with_name("dpo-frontier.png"))
    began = time.perf_counter()
    torch.set_num_threads(args.threads)
    settings = dict(SETTINGS)
    if args.quick:
        settings.update(train_prompts=32, held_prompts=16, held_pair_prompts=16, batch_size=4, warmup_steps=1, eval_every=2)
    shipped, tokenizer = load_pretrained()
    task = task_data(tokenizer, settings)
    if args.pairs and Path(args.pairs).is_file():  # the pairs an earlier part made with these settings
        saved = torch.load(args.pairs, weights_only=True)
        if saved["settings"] != settings:
            raise ValueError(f"{args.pairs} holds pairs made with other settings")
        pairs, held_pairs = dpo.PreferencePairs(**saved["train"]), dpo.PreferencePairs(**saved["held_out"])
    else:
        pairs, held_pairs = make_pairs(shipped, tokenizer, task, settings)
        if args.pairs:
            torch.save({"settings": settings, "train": vars(pairs), "held_out": vars(held_pairs)}, args.pairs)
    print(f"{len(pairs)} training pairs (attribute rate {pairs.attribute_rate:.3f} in their samples), "
          f"{len(held_pairs)} held-out pairs, {time.perf_counter() - began:.0f} s", flush=True)
    specs = [("dpo", beta) for beta in args.betas] + [("sft", args.sft_beta)]
    if args.only:
        specs = [spec for spec in specs if _name(*spec) in args.only]
    runs = []
    for method, beta in specs:
        result = run(shipped, tokenizer, task, pairs, held_pairs, settings, args.steps, args.lr, method, beta)
        runs.append(result)
        last = result["points"][-1]
        print(f"{_name(method, beta):8s} attribute {last['attribute_rate']:.3f}  KL {last['kl']:6.2f} ± {last['kl_stderr']:.2f}"
              f"  held-out reward accuracy {last['held_reward_accuracy']:.2f}  Shakespeare {last['shakespeare']:.3f}"
              f"  {result['seconds_per_step']:.2f} s/step", flush=True)
    document = {"command": " ".join(["python bench/dpo_frontier.py", *sys.argv[1:]]), "steps": args.steps, "lr": args.lr,
                "settings": settings, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "machine": platform.machine(),
                "pairs": {"train": len(pairs), "train_prompts_with_pairs": len(pairs.prompt.unique()),
                          "train_attribute_rate": pairs.attribute_rate, "held_out": len(held_pairs),
                          "held_out_attribute_rate": held_pairs.attribute_rate},
                "runs": runs, "seconds": round(time.perf_counter() - began, 1)}
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    if not args.only:
        plot(document, Path(args.out).with_name("dpo-frontier.png"))
    print(f"wrote {args.out} ({document['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
