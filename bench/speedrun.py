"""The CPU speedrun: train a stated recipe until its validation loss reaches a target, or its
time runs out, and keep a record that anyone can verify.

``python bench/speedrun.py run [--recipe course] [--threads 2] [--no-save]`` trains the
recipe, printing its progress, appends its record to ``data/speedrun.json`` (the
leaderboard; ``--out FILE`` writes elsewhere) and writes its model to
``build/speedrun-RECIPE.pt`` (``--model``): the shipped model stays as it is. ``python bench/speedrun.py verify N`` reruns
record ``N`` on this machine and says whether it holds (exit status 1 when it does not;
``--board FILE`` reads a submitted file, ``--out FILE`` appends a rerun that holds).
``python bench/speedrun.py [board]`` prints the leaderboard.

The clock runs while the recipe learns its tokenizer, builds its model and trains. It stops
for each evaluation, which is ``python -m minillm evaluate``'s loss (nats per character of
the validation text, the model's own context), taken every ``check_every`` steps: the run
ends at the first evaluation at or below ``target``, or the first after ``budget_minutes``.

A record holds the recipe, the code version (a hash of the package's source, this script
and the recipe's settings), torch's version, the machine, the thread count, the times, and a
calibration taken in the same run, before training and after it (a change between the two
says the machine's load moved): a fixed matmul workload and bench/train.py's nanoGPT
baseline for a fixed number of steps. The leaderboard sorts by *normalized* time: a record's
training seconds times its machine's nanoGPT tokens per second (the mean of the two) over the
reference speed :data:`REFERENCE_TOKENS_PER_SECOND`, that is, the seconds it would have taken
on a machine where that baseline runs at the reference speed.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import minillm
from minillm import data
from minillm.batches import BatchSampler
from minillm.loss import nats_per_char
from minillm.model import GPT
from minillm.recipe import DEFAULT_RECIPE, recipe_config, recipe_train_config, tokenizer_path_for
from minillm.tokenizer import BPETokenizer
from minillm.train import TrainState, save_model, train

HERE = Path(__file__).resolve().parent
BOARD = HERE.parent / "data" / "speedrun.json"
REFERENCE_TOKENS_PER_SECOND = 20_000.0  # nanoGPT's baseline on the course's 2-core machine, 2 threads
# How far a rerun may be from its record and still verify it: the loss (the same code and
# seed give the same model up to float rounding across machines) and the normalized time
# (these machines are noisy: calibration and training move with the load, not always alike).
LOSS_TOLERANCE = 0.01
TIME_TOLERANCE = 1.5
# What a recipe may set of the optimizer and its schedule besides steps and lr (TrainConfig's names).
TRAIN_OPTIONS = ("weight_decay", "min_lr_ratio", "warmup_steps", "beta2", "grad_clip")
_SHAPE = ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "dropout", "positions", "norm", "ffn")
RECIPES = {
    # The shipped model's recipe, stopped at the target or at 10 minutes.
    "course": dict(DEFAULT_RECIPE, target=1.40, budget_minutes=10.0, check_every=250, eval_chars=None),
    # The same, trained twice as long: the budget, not the step count, ends it.
    "course-6000": dict(DEFAULT_RECIPE, steps=6000, target=1.40, budget_minutes=10.0, check_every=250, eval_chars=None),
    # A seconds-long recipe for the tests and for trying the tools.
    "tiny": dict(vocab_size=300, context_length=32, d_model=32, n_layers=1, n_heads=2, dropout=0.0,
                 positions="rope", norm="rmsnorm", ffn="swiglu", steps=40, batch_size=4, lr=3e-3, seed=0,
                 target=0.0, budget_minutes=2.0, check_every=20, eval_chars=20_000, corpus_chars=200_000),
}


def code_version(settings: dict) -> str:
    """A hash of what decides the run: the package's source, this script (its training loop)
    and the recipe's settings."""
    digest = hashlib.sha256()
    package = Path(minillm.__file__).resolve().parent
    for path in sorted(package.glob("*.py")) + [Path(__file__).resolve()]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    return {"system": platform.system(), "machine": platform.machine(), "cpu": model or platform.processor(),
            "cores": os.cpu_count(), "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _bench_train():
    spec = importlib.util.spec_from_file_location("bench_train", HERE / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calibrate(steps: int = 10) -> dict:
    """This machine's speed, now: a 512×512 float32 matmul (GFLOP/s, best of 3 rounds of 50)
    and bench/train.py's nanoGPT at its shape (tokens per second over ``steps`` steps)."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    best = min(_timed(lambda: [a @ b for _ in range(50)]) for _ in range(3))
    baseline = _bench_train()
    shape = baseline.SHAPE
    torch.manual_seed(0)
    model = baseline.NanoGPT(shape["vocab_size"], shape["context_length"], shape["d_model"], shape["n_layers"],
                             shape["n_heads"])
    batch = torch.randint(0, shape["vocab_size"], (baseline.BATCH_SIZE, shape["context_length"] + 1))
    seconds = baseline.Runner(model, batch).seconds(steps)
    return {"matmul_gflops": 50 * 2 * 512**3 / best / 1e9,
            "nanogpt_tokens_per_second": baseline.BATCH_SIZE * shape["context_length"] / seconds,
            "nanogpt_steps": steps}


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def run(name: str, *, threads: int = 2, model_out: Path | None = None, say=print, settings: dict | None = None) -> dict:
    """Train recipe ``name`` as the module docstring says; its record. ``model_out``: where
    the trained model goes (its tokenizer beside it), never over the shipped model.
    ``settings``: the recipe's settings when they are not ``RECIPES[name]`` (an ablation's);
    besides the shape and the data they may set the optimizer's ``TRAIN_OPTIONS``."""
    settings = RECIPES[name] if settings is None else settings
    torch.set_num_threads(threads)
    before = calibrate()
    clock = 0.0
    started = time.perf_counter()
    text = data.corpus_text()[: settings.get("corpus_chars")]
    train_text, val_text = data.split_corpus(text)
    val_text = val_text[: settings["eval_chars"]]
    tokenizer = BPETokenizer.train(train_text, settings["vocab_size"], progress=False)
    train_ids, val_ids = torch.tensor(tokenizer.encode(train_text)), torch.tensor(tokenizer.encode(val_text))
    torch.manual_seed(settings["seed"])
    model = GPT(recipe_config(len(tokenizer), **{k: settings[k] for k in _SHAPE if k != "vocab_size"}))
    batches = BatchSampler(train_ids, settings["batch_size"], settings["context_length"], seed=settings["seed"])
    config = recipe_train_config(steps=settings["steps"], lr=settings["lr"],
                                 **{key: settings[key] for key in TRAIN_OPTIONS if key in settings})
    state = TrainState.new(model, config)
    clock += time.perf_counter() - started
    evaluations, loss = [], float("inf")
    while state.step < config.steps:
        started = time.perf_counter()
        state = train(model, batches, config, state=state, progress=False,
                      stop_after=min(state.step + settings["check_every"], config.steps))
        clock += time.perf_counter() - started
        started = time.perf_counter()
        loss = nats_per_char(model, val_ids, len(val_text))
        evaluations.append({"step": state.step, "seconds": round(clock, 2), "nats_per_char": round(loss, 4),
                            "eval_seconds": round(time.perf_counter() - started, 2)})
        say(f"step {state.step:5d} · {clock / 60:5.2f} min of training · {loss:.4f} nats per character")
        if loss <= settings["target"] or clock >= 60 * settings["budget_minutes"]:
            break
    if model_out is not None:
        model_out.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(tokenizer_path_for(model_out))
        save_model(model_out, model, tokenizer=tokenizer_path_for(model_out).name, val_nats_per_char=loss)
    tokens = state.step * settings["batch_size"] * settings["context_length"]
    after = calibrate()
    calibration = {"before": before, "after": after, "nanogpt_tokens_per_second":
                   (before["nanogpt_tokens_per_second"] + after["nanogpt_tokens_per_second"]) / 2}
    return {"recipe": name, "settings": settings, "code_version": code_version(settings),
            "torch": torch.__version__, "machine": machine(), "threads": torch.get_num_threads(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "calibration": calibration,
            "steps": state.step, "train_seconds": round(clock, 2), "tokens_per_second": round(tokens / clock),
            "nats_per_char": round(loss, 4), "reached_target": loss <= settings["target"],
            "evaluations": evaluations,
            "clock": "tokenizer, model and training; evaluations excluded"}


def normalized_seconds(record: dict) -> float:
    """The record's training time on a machine whose nanoGPT baseline runs at the reference speed."""
    speed = record["calibration"]["nanogpt_tokens_per_second"]
    return record["train_seconds"] * speed / REFERENCE_TOKENS_PER_SECOND


def verify(record: dict, rerun: dict, time_tolerance: float = TIME_TOLERANCE) -> list[str]:
    """What keeps ``rerun`` (this machine's run of ``record``'s recipe) from confirming it;
    empty when it holds."""
    problems = []
    if rerun["code_version"] != record["code_version"]:
        problems.append(f"code version {rerun['code_version']} is not the record's {record['code_version']}: "
                        "the package, the bench or the recipe changed")
    if abs(rerun["nats_per_char"] - record["nats_per_char"]) > LOSS_TOLERANCE:
        problems.append(f"the loss {rerun['nats_per_char']:.4f} is not the record's {record['nats_per_char']:.4f} "
                        f"(within {LOSS_TOLERANCE})")
    if rerun["steps"] > record["steps"]:
        problems.append(f"it took {rerun['steps']} steps to the record's {record['steps']}")
    if normalized_seconds(rerun) > time_tolerance * normalized_seconds(record):
        problems.append(f"normalized time {normalized_seconds(rerun):.0f} s is more than {time_tolerance:g}× "
                        f"the record's {normalized_seconds(record):.0f} s")
    return problems


def load_board(path: Path = BOARD) -> list[dict]:
    return json.loads(path.read_text())["records"] if path.exists() else []


def save_board(records: list[dict], path: Path = BOARD) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"records": records}, indent=1) + "\n")
    partial.replace(path)


def board_lines(records: list[dict]) -> list[str]:
    lines = [f"{'#':>3s} {'recipe':10s} {'nats/char':>9s} {'steps':>6s} {'train min':>9s} {'normalized min':>14s} "
             f"{'threads':>7s}  machine"]
    order = sorted(range(len(records)), key=lambda i: (not records[i]["reached_target"], normalized_seconds(records[i])))
    for i in order:
        r = records[i]
        lines.append(f"{i:3d} {r['recipe']:10s} {r['nats_per_char']:9.4f} {r['steps']:6d} {r['train_seconds'] / 60:9.2f} "
                     f"{normalized_seconds(r) / 60:14.2f} {r['threads']:7d}  {r['machine']['cpu']}"
                     + ("" if r["reached_target"] else "  (target not reached)"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command")  # none: the leaderboard (so `make bench` only shows it)
    ran = commands.add_parser("run", help="train a recipe and record it")
    ran.add_argument("--recipe", choices=sorted(RECIPES), default="course")
    ran.add_argument("--threads", type=int, default=2)
    ran.add_argument("--out", type=Path, default=BOARD, help="the leaderboard file (default: data/speedrun.json)")
    ran.add_argument("--model", type=Path, help="where the model goes (default: build/speedrun-RECIPE.pt)")
    ran.add_argument("--no-save", action="store_true", help="print the record, write nothing")
    checked = commands.add_parser("verify", help="rerun record N here and check it")
    checked.add_argument("record", type=int)
    checked.add_argument("--board", type=Path, default=BOARD)
    checked.add_argument("--time-tolerance", type=float, default=TIME_TOLERANCE,
                         help="how many times the record's normalized time a rerun may take (default: %(default)s)")
    checked.add_argument("--out", type=Path, help="append the rerun to this leaderboard when it verifies")
    shown = commands.add_parser("board", help="print the leaderboard")
    shown.add_argument("--board", type=Path, default=BOARD)
    args = parser.parse_args(argv)
    if args.command == "run":
        model_out = None if args.no_save else args.model or HERE.parent / "build" / f"speedrun-{args.recipe}.pt"
        record = run(args.recipe, threads=args.threads, model_out=model_out)
        print(json.dumps({k: v for k, v in record.items() if k != "evaluations"}, indent=1))
        if not args.no_save:
            records = load_board(args.out) + [record]
            save_board(records, args.out)
            print(f"record {len(records) - 1} written to {args.out}; the model to {model_out}")
        return 0
    records = load_board(getattr(args, "board", BOARD))
    if args.command in (None, "board"):
        print("\n".join(board_lines(records)))
        return 0
    if not 0 <= args.record < len(records):
        parser.error(f"record must be 0 to {len(records) - 1} ({len(records)} records in {args.board}), got {args.record}")
    record = records[args.record]
    rerun = run(record["recipe"], threads=record["threads"])
    problems = verify(record, rerun, args.time_tolerance)
    for problem in problems:
        print(f"does not hold: {problem}")
    print(f"record {args.record}: " + ("verified" if not problems else "NOT verified"))
    if args.out is not None and not problems:
        board = load_board(args.out) + [rerun]
        save_board(board, args.out)
        print(f"the rerun is record {len(board) - 1} of {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
