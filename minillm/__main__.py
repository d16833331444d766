"""``python -m minillm train | generate | evaluate``: the command line (infrastructure; no chapter teaches this module).

- ``train``: learn a BPE tokenizer on the first 90% of the corpus, train the default GPT
  on it, report the validation loss in nats per character, print a sample, and write the
  model and its tokenizer (by default into ``build/``, so the shipped model in ``data/``
  stays as it is; ``make train`` writes into ``data/`` on purpose).
  ``--resume`` continues an interrupted run from its training checkpoint, exactly.
  Data-parallel: ``torchrun --nproc_per_node=2 -m minillm train ...`` trains with
  ``DistributedDataParallel`` (gloo on CPU, nccl on GPUs; ``minillm.distributed``):
  ``--batch-size`` is the global batch, each process reads its share of every batch, and
  only rank 0 writes files and prints. The training checkpoint's flag is ``--checkpoint``,
  not ``--run``: torchrun would take ``--run`` for its own ``--run-path``.
- ``generate``: continue a prompt with a trained model (by default the shipped one in
  ``data/``; ``--model build/minillm-shakespeare.pt`` uses the one you trained), decoding
  with chapter 09's KV cache.
- ``evaluate``: the validation loss of a trained model in nats per character.

Run any of them with ``--help`` for the options.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict
import sys
import time
from pathlib import Path

DEFAULT_NAME = "minillm-shakespeare"
DEFAULT_OUT = Path("build") / f"{DEFAULT_NAME}.pt"  # where `train` writes; the shipped model in data/ is not touched
DEFAULT_TOP_P = 0.95  # generate's nucleus, unless --top-k is given alone


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text}")
    return value


def _registered(component: str) -> tuple[str, ...]:
    """The names registered for a model component ("positions", "norm", "ffn"): what a config accepts."""
    from minillm.ffn import FFNS
    from minillm.norm import NORMS
    from minillm.positional import POSITIONS

    return {"positions": POSITIONS, "norm": NORMS, "ffn": FFNS}[component].names()


def _parser() -> argparse.ArgumentParser:
    from minillm.recipe import DEFAULT_RECIPE as recipe

    parser = argparse.ArgumentParser(prog="python -m minillm", description=__doc__.split("\n\n")[1].strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,generate,evaluate}")

    t = commands.add_parser("train", help="train the default model on the bundled corpus",
                            description="Train a GPT on the bundled corpus (tiny Shakespeare by default). The "
                                        "tokenizer is trained on the first 90% of the text; the last 10% "
                                        "validates. Defaults are the recipe of `make train`, which also passes "
                                        "--out data/minillm-shakespeare.pt to replace the shipped model.")
    t.add_argument("--corpus", type=Path, help="a UTF-8 text file to train on (default: the bundled corpus)")
    t.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="where the model goes (default: %(default)s, leaving the shipped model in data/ as it "
                        "is); its tokenizer is written beside it as *-tokenizer.json")
    t.add_argument("--checkpoint", type=Path, default=Path("build") / "minillm-train.pt",
                   help="the training checkpoint, written as training goes (default: %(default)s)")
    t.add_argument("--resume", action="store_true", help="continue the run saved in --checkpoint")
    t.add_argument("--steps", type=_positive_int, default=recipe["steps"], help="optimizer steps (default: %(default)s)")
    t.add_argument("--batch-size", type=_positive_int, default=recipe["batch_size"],
                   help="the global batch: under torchrun each process takes an equal share (default: %(default)s)")
    t.add_argument("--grad-accum", type=_positive_int, default=1,
                   help="batches whose gradients one optimizer step averages (default: %(default)s)")
    t.add_argument("--lr", type=float, default=recipe["lr"], help="peak learning rate (default: %(default)s)")
    t.add_argument("--vocab-size", type=_positive_int, default=recipe["vocab_size"], help="(default: %(default)s)")
    t.add_argument("--context", type=_positive_int, default=recipe["context_length"], help="(default: %(default)s)")
    t.add_argument("--d-model", type=_positive_int, default=recipe["d_model"], help="(default: %(default)s)")
    t.add_argument("--layers", type=_positive_int, default=recipe["n_layers"], help="(default: %(default)s)")
    t.add_argument("--heads", type=_positive_int, default=recipe["n_heads"], help="(default: %(default)s)")
    t.add_argument("--dropout", type=float, default=recipe["dropout"], help="(default: %(default)s)")
    t.add_argument("--positions", choices=_registered("positions"), default=recipe["positions"],
                   help="(default: %(default)s)")
    t.add_argument("--norm", choices=_registered("norm"), default=recipe["norm"], help="(default: %(default)s)")
    t.add_argument("--ffn", choices=_registered("ffn"), default=recipe["ffn"],
                   help="(default: %(default)s; gelu_tanh is GPT-2's approximation)")
    t.add_argument("--seed", type=int, default=recipe["seed"],
                   help="the initialization and the order of the batches (default: %(default)s)")
    t.add_argument("--threads", type=_positive_int, default=None,
                   help="CPU threads for torch (default: torch's choice, all cores); results are bit-identical "
                        "only for the same thread count, machine and torch version")
    t.add_argument("--figure", type=Path, help="also save the loss curves as an image here")
    t.add_argument("--quiet", action="store_true", help="no progress bars")

    g = commands.add_parser("generate", help="continue a prompt with a trained model",
                            description="Continue a prompt with a trained model (default: the shipped one).")
    g.add_argument("--prompt", default="ROMEO:", help="the text to continue (default: %(default)r)")
    g.add_argument("--model", type=Path, help=f"a model file (default: data/{DEFAULT_NAME}.pt)")
    g.add_argument("--tokenizer", type=Path, help="its tokenizer (default: beside the model, *-tokenizer.json)")
    g.add_argument("--max-new-tokens", type=int, default=200, help="(default: %(default)s)")
    g.add_argument("--temperature", type=float, default=0.8, help="0 is greedy (default: %(default)s)")
    g.add_argument("--top-k", type=int, default=None,
                   help="sample from the k most likely tokens only; given without --top-p, it replaces the "
                        "default nucleus instead of combining with it")
    g.add_argument("--top-p", type=float, default=None,
                   help=f"nucleus sampling threshold (default: {DEFAULT_TOP_P}, or none when --top-k is given; "
                        "give both to apply top-k, then top-p)")
    g.add_argument("--seed", type=int, default=0, help="the same seed gives the same text (default: %(default)s)")
    g.add_argument("--threads", type=_positive_int, default=1,
                   help="CPU threads for torch (default: %(default)s: a decoding step of a small model is too small "
                        "to share, and extra threads only wait for each other on a busy machine)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    e = commands.add_parser("evaluate", help="validation loss of a trained model, in nats per character",
                            description="The summed token loss over the validation text (the last 10% of the "
                                        "corpus) divided by its number of characters.")
    e.add_argument("--model", type=Path, help=f"a model file (default: data/{DEFAULT_NAME}.pt)")
    e.add_argument("--tokenizer", type=Path, help="its tokenizer (default: beside the model)")
    e.add_argument("--corpus", type=Path, help="the corpus whose last 10%% validates (default: the bundled one)")
    e.add_argument("--max-chars", type=int, default=None, help="evaluate only the first N validation characters")
    return parser


def _corpus(path: Path | None) -> str:
    from minillm import data

    if path is None:
        return data.corpus_text()
    if not path.is_file():
        raise SystemExit(f"error: corpus file {str(path)!r} does not exist")
    return path.read_text(encoding="utf-8")


def _model_paths(model: Path | None, tokenizer: Path | None) -> tuple[Path, Path]:
    from minillm.recipe import pretrained_paths, tokenizer_path_for

    if model is None:
        return pretrained_paths()
    return model, tokenizer or tokenizer_path_for(model)


def cmd_train(args) -> None:
    from minillm import distributed

    launch, device = distributed.init()  # one process, or the group torchrun describes
    try:
        distributed.local_batch_size(args.batch_size, launch.world_size)  # refuse a bad launch before any work
        _train(args, launch, device)
    finally:
        distributed.shutdown()


def _train(args, launch, device) -> None:
    import torch

    from minillm import data, distributed, recipe, train as training
    from minillm.batches import BatchSampler
    from minillm.curves import plot_history
    from minillm.generate import generate_text
    from minillm.loss import token_nll
    from minillm.model import GPT
    from minillm.tokenizer import BPETokenizer

    main = launch.rank == 0  # only rank 0 prints and writes
    say = print if main else (lambda *_, **__: None)
    started = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    train_text, val_text = data.split_corpus(_corpus(args.corpus))
    say(f"corpus: {len(train_text):,d} training and {len(val_text):,d} validation characters", flush=True)
    # every rank learns the same tokenizer (deterministic), so none waits for a file of another
    tokenizer = BPETokenizer.train(train_text, args.vocab_size, progress=main and not args.quiet)
    train_ids = torch.tensor(tokenizer.encode(train_text))
    val_ids = torch.tensor(tokenizer.encode(val_text))
    say(f"tokenizer: {len(tokenizer)} tokens, {len(train_text) / len(train_ids):.2f} characters per token "
        f"({len(train_ids):,d} training tokens)", flush=True)
    config = recipe.recipe_config(len(tokenizer), context_length=args.context, d_model=args.d_model,
                                  n_layers=args.layers, n_heads=args.heads, dropout=args.dropout,
                                  positions=args.positions, norm=args.norm, ffn=args.ffn)
    train_config = recipe.recipe_train_config(steps=args.steps, lr=args.lr, grad_accum_steps=args.grad_accum)
    torch.manual_seed(args.seed)  # the same initialization on every rank
    model = GPT(config)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: {n_params:,d} parameters, {config.n_layers} layers, d_model {config.d_model}, "
        f"{config.positions}, {config.norm}, {config.ffn}, context {config.context_length} tokens; {train_config.steps} steps of "
        f"{args.batch_size * args.grad_accum} x {config.context_length} tokens"
        + (f" ({args.grad_accum} batches of {args.batch_size} a step)" if args.grad_accum > 1 else "")
        + (f", data-parallel over {launch.world_size} processes ({launch.world_size} x "
           f"{args.batch_size // launch.world_size} rows a batch)" if launch.distributed else ""), flush=True)
    model = distributed.wrap(model, device)
    if launch.distributed:
        torch.manual_seed(args.seed + 1 + launch.rank)  # each rank its own dropout draws
    batches = BatchSampler(train_ids, args.batch_size, config.context_length, seed=args.seed,
                                    rank=launch.rank, world_size=launch.world_size)
    evaluate = training.held_out_loss(val_ids, max_windows=recipe.DEFAULT_RECIPE["eval_windows"],
                                      batch_size=args.batch_size)
    state = training.TrainState.load(args.checkpoint, model, train_config) if args.resume else None
    history = training.train(model, batches, train_config, evaluate=evaluate, state=state,
                             checkpoint_path=args.checkpoint, progress=main and not args.quiet).history
    if not main:
        return
    model = training.unwrap(model)
    total, count = token_nll(model, val_ids)
    loss = total / len(val_text)
    minutes = (time.time() - started) / 60
    print(f"validation loss: {loss:.4f} nats per character ({loss / math.log(2):.3f} bits per character; "
          f"{total / count:.3f} nats per token) on the last 10% of the corpus; {minutes:.1f} minutes in all",
          flush=True)
    out, tokenizer_out = args.out, recipe.tokenizer_path_for(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(tokenizer_out)
    training.save_model(out, model, tokenizer=tokenizer_out.name, val_nats_per_char=loss,
                        train_loss=history["train_loss"], val_step=history["val_step"],
                        val_loss=history["val_loss"], lr=history["lr"], train_config=asdict(train_config),
                        batch_size=args.batch_size, seed=args.seed, chars_per_token=len(val_text) / len(val_ids),
                        world_size=launch.world_size, torch_version=str(torch.__version__),
                        torch_threads=torch.get_num_threads(), minutes=minutes)
    print(f"wrote the model to {out} and its tokenizer to {tokenizer_out}")
    if args.figure:
        plot_history(history).savefig(args.figure, dpi=120)
        print(f"wrote {args.figure}")
    sample = generate_text(model.cpu(), tokenizer, "ROMEO:", 120, temperature=0.8, top_p=0.95,
                           generator=torch.Generator().manual_seed(0))
    print("\nsample (prompt 'ROMEO:', temperature 0.8, top-p 0.95, seed 0):\n" + sample)
    print(f"\nto talk to this model: python -m minillm generate --model {out} --prompt \"ROMEO:\"")


def sampling_settings(top_k: int | None, top_p: float | None) -> tuple[int | None, float | None]:
    """generate's (top_k, top_p): the default nucleus applies only when neither is given, so
    ``--top-k 40`` alone means top-k sampling, not top-k and then a nucleus of 0.95."""
    if top_p is None and top_k is None:
        top_p = DEFAULT_TOP_P
    return top_k, top_p


def cmd_generate(args) -> None:
    import torch

    from minillm import train as training
    from minillm.generate import generate_text
    from minillm.tokenizer import BPETokenizer

    model_path, tokenizer_path = _model_paths(args.model, args.tokenizer)
    model = training.load_model(model_path)
    tokenizer = BPETokenizer.load(tokenizer_path)
    top_k, top_p = sampling_settings(args.top_k, args.top_p)
    saved = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:  # restored afterwards: main() also runs inside other programs (the tests)
        text = generate_text(model, tokenizer, args.prompt, args.max_new_tokens, temperature=args.temperature,
                             top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(args.seed),
                             progress=not args.quiet, **cache_options(model))
    finally:
        torch.set_num_threads(saved)
    print(text)


def cache_options(model) -> dict:
    """generate's cache for one prompt: chapter 09's preallocated ``KVCache`` (it rolls past the
    context for RoPE and ALiBi) where this installation has that chapter complete, else chapter
    07's ``ConcatModelCache`` (``use_cache``): a student bundle may lack chapter 09, or hold its
    exercises as stubs."""
    from minillm.markers import LEARNER_EXERCISES

    try:
        from minillm import kvcache
    except ModuleNotFoundError as error:
        if error.name != "minillm.kvcache":
            raise
        return {"use_cache": True}
    if getattr(kvcache, LEARNER_EXERCISES, ()):
        return {"use_cache": True}
    return {"kv_cache": kvcache.KVCache.for_model(model, batch_size=1)}


def cmd_evaluate(args) -> None:
    import torch

    from minillm import data, train as training
    from minillm.loss import nats_per_char
    from minillm.tokenizer import BPETokenizer

    model_path, tokenizer_path = _model_paths(args.model, args.tokenizer)
    model = training.load_model(model_path)
    tokenizer = BPETokenizer.load(tokenizer_path)
    _, val_text = data.split_corpus(_corpus(args.corpus))
    if args.max_chars is not None:
        val_text = val_text[: args.max_chars]
    ids = torch.tensor(tokenizer.encode(val_text))
    loss = nats_per_char(model, ids, len(val_text))
    print(f"{model_path}: {loss:.4f} nats per character on {len(val_text):,d} validation characters")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from minillm.checkpoint import CheckpointError

    try:
        {"train": cmd_train, "generate": cmd_generate, "evaluate": cmd_evaluate}[args.command](args)
    except (CheckpointError, FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
