"""The speedrun's ablation table: one change at a time against the base recipe, paired by seed.

Each ablation is the course's recipe (``bench/speedrun.py``'s "course") with one setting
changed, trained for the same number of steps (:data:`STEPS`, a shorter run than the
recipe's, its schedule fitted to it) and evaluated once at the end on the whole validation
text (nats per character). A run of seed s of an ablation is compared with the base run of
the same seed, which shares its batches and, where the shapes agree, its initial weights: the
paired difference is far less noisy than either loss (chapter 05 measures the same way).
Training time is reported beside the loss: a change that costs time per step (a longer
context) shows it there, and a table at equal steps is not a table at equal time.

Runs are cached in ``data/speedrun_ablations.json`` as each one ends, under the code version
of its settings: a rerun skips what is there, so the table can be built over several
sessions, and a change of the package or of the scripts starts it anew.

``python bench/speedrun_ablations.py [--only NAME ...] [--seeds 0 1 2] [--threads 2]``
runs what is missing, then prints the table; ``--table`` prints it without running.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import speedrun  # noqa: E402  (bench/ is not a package)

CACHE = HERE.parent / "data" / "speedrun_ablations.json"
STEPS = 1000
BASE = dict(speedrun.RECIPES["course"], steps=STEPS, target=0.0, budget_minutes=600.0, check_every=STEPS)
# name: (the one change, why it might matter)
ABLATIONS = {
    "base": ({}, "the course's recipe: RoPE, RMSNorm, SwiGLU, AdamW at 3e-3, cosine to 10%"),
    "lr 6e-3": ({"lr": 6e-3}, "twice the peak learning rate"),
    "lr 1.5e-3": ({"lr": 1.5e-3}, "half the peak learning rate"),
    "min lr 0": ({"min_lr_ratio": 0.0}, "cosine all the way to zero"),
    "no weight decay": ({"weight_decay": 0.0}, "AdamW without decay"),
    "GELU FFN": ({"ffn": "gelu"}, "GPT-2's feed-forward network"),
    "learned positions": ({"positions": "learned"}, "GPT-2's positions"),
    "LayerNorm": ({"norm": "layernorm"}, "GPT-2's norm"),
    "batch 16": ({"batch_size": 16}, "twice the tokens per step"),
    "context 64": ({"context_length": 64}, "half the context, same sequences per step"),
    "vocab 1024": ({"vocab_size": 1024}, "a smaller tokenizer"),
}


def settings_of(name: str) -> dict:
    return {**BASE, **ABLATIONS[name][0]}


def load(path: Path = CACHE) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["runs"] if path.exists() else []


def save(runs: list[dict], path: Path = CACHE) -> None:
    path.write_text(json.dumps({"command": "python bench/speedrun_ablations.py", "steps": STEPS, "runs": runs},
                               indent=1) + "\n", encoding="utf-8")


def cached(runs: list[dict], name: str, seed: int) -> dict | None:
    """The run of ``name`` at ``seed`` made by this code, if the cache holds it."""
    version = speedrun.code_version({**settings_of(name), "seed": seed})
    return next((r for r in runs if r["ablation"] == name and r["seed"] == seed and r["code_version"] == version), None)


def run_missing(names, seeds, threads: int, path: Path = CACHE, say=print) -> list[dict]:
    """Run every (ablation, seed) the cache lacks, saving after each; the cache's runs."""
    runs = load(path)
    for seed in seeds:
        for name in names:
            if cached(runs, name, seed) is not None:
                continue
            settings = {**settings_of(name), "seed": seed}
            say(f"{name}, seed {seed}:")
            record = speedrun.run(name, threads=threads, settings=settings, say=lambda line: say("  " + line))
            runs = [r for r in runs if not (r["ablation"] == name and r["seed"] == seed)] + [{
                "ablation": name, "seed": seed, "code_version": record["code_version"],
                "nats_per_char": record["nats_per_char"], "train_seconds": record["train_seconds"],
                "tokens_per_second": record["tokens_per_second"], "threads": record["threads"],
                "nanogpt_tokens_per_second": round(record["calibration"]["nanogpt_tokens_per_second"]),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}]
            save(runs, path)
    return runs


def table(runs: list[dict]) -> list[str]:
    """The Markdown table: each ablation's median loss and time, and its differences from the
    base run of the same seed (median, and the range over seeds)."""
    current = {(r["ablation"], r["seed"]): r for r in runs if cached(runs, r["ablation"], r["seed"]) is r}
    base = {seed: r for (name, seed), r in current.items() if name == "base"}
    lines = [f"{STEPS} steps of the course's recipe, one change at a time; the whole validation text.",
             "", "| change | seeds | nats/char (median) | − base, same seed: median (range) | train s (median) | why |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, (_, why) in ABLATIONS.items():
        mine = {seed: r for (n, seed), r in current.items() if n == name}
        if not mine:
            continue
        paired = [mine[s]["nats_per_char"] - base[s]["nats_per_char"] for s in sorted(mine) if s in base]
        diff = (f"{statistics.median(paired):+.3f} ({min(paired):+.3f} to {max(paired):+.3f})"
                if paired and name != "base" else "")
        lines.append(f"| {name} | {len(mine)} | {statistics.median(r['nats_per_char'] for r in mine.values()):.3f} | "
                     f"{diff} | {statistics.median(r['train_seconds'] for r in mine.values()):.0f} | {why} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(ABLATIONS), help="these ablations (the base is always run)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--table", action="store_true", help="print the cached table, run nothing")
    args = parser.parse_args(argv)
    if args.table:
        runs = load(args.cache)
    else:
        names = ["base"] + [n for n in (args.only or ABLATIONS) if n != "base"]
        runs = run_missing(names, args.seeds, args.threads, args.cache)
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
