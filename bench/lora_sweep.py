"""LoRA against full fine-tuning of the shipped model, on pig latin (chapter 12's sweep).

Every run starts from the shipped model (``minillm.recipe.load_pretrained``) with its Q/K/V
projection unfused, trains on the pig latin of the first part of the training text with
the same batches (``BatchSampler``, seed 0), steps and schedule, and is measured on:
- ``held_out``: nats per character on the pig latin of the first 8,000 characters of the
  validation text (the task's held-out loss);
- ``score``: ``pig_latin_score`` of sampled continuations of held-out prompts (the share
  of generated words that are the pig latin of a word of the training text);
- ``shakespeare``: nats per character on the next 8,000 characters of the validation text,
  as written (what the fine-tune forgot);
- ``trainable`` (and its share of the model), ``optimizer_bytes`` (AdamW's state after the
  run), ``seconds_per_step`` (the run's training time over its steps, measured in this
  process, so compare runs of one sweep only) and ``file_bytes`` (the adapters' file for
  LoRA, the whole model's for full fine-tuning).

The runs: full fine-tuning, and LoRA with r in 1, 2, 4, 8, 16 on q, v and on every linear
map. Writes a JSON (default data/lora_sweep.json) with the command, the settings, the
base model's numbers, every run and the sweep's time. Usage:
python bench/lora_sweep.py [--steps 60] [--ranks 1 2 4 8 16] [--threads 1] [--out data/lora_sweep.json]

Every run starts from the same seed and the same data, so the numbers do not depend on
which runs share a process: ``--only full q,v:1 all:4`` makes some of them (into --out),
and ``--merge A.json B.json ...`` writes the sweep of the parts, in the usual order, with
the time of the longest part (they ran side by side).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from minillm import data, lora, tasks
from minillm.generate import generate
from minillm.recipe import load_pretrained
from minillm.batches import BatchSampler
from minillm.loss import token_nll
from minillm.train import TrainConfig, TrainState, save_model, train

SETTINGS = dict(train_chars=120_000, held_out_chars=8_000, batch_size=8, context=128, alpha=8.0, lr_full=2e-3,
                lr_lora=2e-2, weight_decay=0.1, prompts=8, prompt_tokens=24, new_tokens=48, temperature=0.8, seed=0)
TARGETS = {"q,v": ("q", "v"), "all": ("all",)}


def task_data(tokenizer, settings: dict) -> dict:
    """The token ids and texts every run uses: training stream, held-out texts, prompts, vocabulary."""
    train_text, val_text = data.split_corpus(data.corpus_text())
    n = settings["held_out_chars"]
    held_out, shakespeare = tasks.pig_latin(val_text[:n]), val_text[n: 2 * n]
    stream = tokenizer.encode(held_out)
    gap = len(stream) // settings["prompts"]
    prompts = [stream[i * gap: i * gap + settings["prompt_tokens"]] for i in range(settings["prompts"])]
    return {"train": torch.tensor(tokenizer.encode(tasks.pig_latin(train_text[: settings["train_chars"]]))),
            "held_out": (torch.tensor(tokenizer.encode(held_out)), len(held_out)),
            "shakespeare": (torch.tensor(tokenizer.encode(shakespeare)), len(shakespeare)),
            "prompts": torch.tensor(prompts),
            "vocabulary": set(tasks.words(train_text))}


def nats_per_char(model, stream: tuple[torch.Tensor, int]) -> float:
    ids, n_chars = stream
    return token_nll(model, ids)[0] / n_chars


def task_score(model, tokenizer, task: dict, settings: dict) -> float:
    """``pig_latin_score`` of the continuations of the held-out prompts (equal-length stretches of
    the held-out stream's tokens, as one batch), sampled with a seeded generator."""
    prompts = task["prompts"]
    out = generate(model, prompts, settings["new_tokens"], temperature=settings["temperature"], use_cache=True,
                   generator=torch.Generator().manual_seed(settings["seed"]))
    texts = [tokenizer.decode(row[prompts.shape[1]:].tolist()) for row in out]
    return tasks.pig_latin_score("\n".join(texts), task["vocabulary"])


def measure(model, tokenizer, task: dict, settings: dict) -> dict:
    return {"held_out": nats_per_char(model, task["held_out"]), "shakespeare": nats_per_char(model, task["shakespeare"]),
            "score": task_score(model, tokenizer, task, settings)}


def run(base, tokenizer, task: dict, settings: dict, steps: int, method: str, r: int | None = None,
        targets: str | None = None) -> dict:
    """One fine-tune from the shipped model and its measurements."""
    torch.manual_seed(settings["seed"])
    model = lora.unfuse_qkv(base)
    if method == "lora":
        lora.apply_lora(model, r, settings["alpha"], TARGETS[targets])
    lr = settings["lr_full"] if method == "full" else settings["lr_lora"]
    config = TrainConfig(steps=steps, lr=lr, warmup_steps=max(1, steps // 10), weight_decay=settings["weight_decay"],
                         eval_every=steps, checkpoint_every=steps)
    state = TrainState.new(model, config)
    batches = BatchSampler(task["train"], settings["batch_size"], settings["context"], seed=settings["seed"])
    start = time.perf_counter()
    train(model, batches, config, state=state, progress=False)
    seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.pt"
        if method == "lora":
            lora.save_lora(path, model, TARGETS[targets])
        else:
            save_model(path, model)
        file_bytes = path.stat().st_size
    trainable = lora.trainable_parameters(model)
    total = sum(p.numel() for p in model.parameters())
    return {"method": method, "r": r, "targets": targets, "lr": lr, "trainable": trainable,
            "trainable_share": trainable / total, "optimizer_bytes": lora.optimizer_state_bytes(state.optimizer),
            "seconds_per_step": seconds / steps, "file_bytes": file_bytes, "final_train_loss": state.history["train_loss"][-1],
            **measure(model, tokenizer, task, settings)}


def _name(method: str, r: int | None, targets: str | None) -> str:
    return "full" if method == "full" else f"{targets}:{r}"


def merge(parts: list[str], out: str) -> None:
    """One sweep document from the parts: their runs in the usual order, the commands that made them."""
    documents = [json.loads(Path(part).read_text()) for part in parts]
    runs = [run for document in documents for run in document["runs"]]
    runs.sort(key=lambda run: (run["method"] != "full", list(TARGETS).index(run["targets"]) if run["targets"] else 0,
                               run["r"] or 0))
    first = documents[0]
    for document in documents[1:]:
        if document["settings"] != first["settings"] or document["steps"] != first["steps"]:
            raise ValueError(f"the parts were made with other settings: {parts}")
    document = {**first, "command": "python bench/lora_sweep.py" + (f" --steps {first['steps']}" if first["steps"] != 60 else ""),
                "made_by": [document["command"] for document in documents] + ["python bench/lora_sweep.py --merge " + " ".join(parts)],
                "runs": runs, "seconds": max(document["seconds"] for document in documents)}
    Path(out).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {out} ({len(runs)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--out", default=str(data.data_dir() / "lora_sweep.json"))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: as fast for this model, and robust on a busy machine)")
    parser.add_argument("--only", nargs="+", help="runs to make: full, q,v:R or all:R")
    parser.add_argument("--merge", nargs="+", help="parts written with --only, to merge into --out")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    began = time.perf_counter()
    torch.set_num_threads(args.threads)
    settings = dict(SETTINGS)
    base, tokenizer = load_pretrained()
    task = task_data(tokenizer, settings)
    before = measure(base, tokenizer, task, settings)
    print(f"base: held-out {before['held_out']:.3f} nats/char, score {before['score']:.2f}, "
          f"Shakespeare {before['shakespeare']:.3f}", flush=True)
    specs = [("full", None, None)] + [("lora", r, targets) for targets in TARGETS for r in args.ranks]
    if args.only:
        specs = [spec for spec in specs if _name(*spec) in args.only]
    runs = []
    for method, r, targets in specs:
        result = run(base, tokenizer, task, settings, args.steps, method, r, targets)
        runs.append(result)
        print(f"{method:4s} r={r!s:4s} {targets!s:4s} trainable {100 * result['trainable_share']:6.2f}%  "
              f"held-out {result['held_out']:.3f}  score {result['score']:.2f}  Shakespeare {result['shakespeare']:.3f}  "
              f"{result['seconds_per_step']:.2f} s/step", flush=True)
    document = {"command": " ".join(["python bench/lora_sweep.py", *sys.argv[1:]]), "steps": args.steps,
                "settings": settings, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "machine": platform.machine(), "base": before, "runs": runs,
                "seconds": round(time.perf_counter() - began, 1)}
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out} ({document['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
