"""Byte-level BPE: training time and encoding throughput, measured side by side in one run.

Training (same text, same vocabulary size, timed end to end from the raw text):
  - minillm's trainer (incremental pair counts and a heap);
  - a naive trainer written here: the same regex pre-token counts, but every pair
    recounted after each merge;
  - Hugging Face `tokenizers` (Rust, byte-level BPE trainer).
Encoding (GPT-2's tokenizer, the whole corpus): minillm against tiktoken, which reads the
bundled GPT-2 files from an offline cache built here.

    python bench/bpe.py [--kb 200] [--vocab 512] [--repeats 3]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path

import regex

from minillm import data
from minillm.tokenizer import GPT2_PATTERN, BPETokenizer, train_bpe

TIKTOKEN_URLS = {
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
}


def naive_train(text: str, vocab_size: int) -> list[tuple[bytes, bytes]]:
    """BPE with every pair recounted after each merge (ties: the smallest pair of ids)."""
    words = Counter(regex.findall(GPT2_PATTERN, text))
    table = {tuple(word.encode("utf-8")): n for word, n in words.items()}
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    for new_id in range(256, vocab_size):
        counts: Counter = Counter()
        for word, n in table.items():
            for pair in zip(word, word[1:]):
                counts[pair] += n
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merged = {}
        for word, n in table.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == best[0] and word[i + 1] == best[1]:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = n
        table = merged
        merges.append((vocab[best[0]], vocab[best[1]]))
        vocab[new_id] = vocab[best[0]] + vocab[best[1]]
    return merges


def hf_train(text: str, vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=[])
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def best_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def tiktoken_gpt2(folder: Path):
    import tiktoken

    vocab_json, merges_txt = data.gpt2_files()
    (folder / hashlib.sha1(TIKTOKEN_URLS["encoder.json"].encode()).hexdigest()).write_bytes(vocab_json.read_bytes())
    (folder / hashlib.sha1(TIKTOKEN_URLS["vocab.bpe"].encode()).hexdigest()).write_bytes(
        b"#version: 0.2\n" + merges_txt.read_bytes())
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    return tiktoken.get_encoding("gpt2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kb", type=int, default=200, help="training text: the corpus's first KB (default 200)")
    parser.add_argument("--vocab", type=int, default=512, help="vocabulary size (default 512)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the fast ones; best kept (default 3)")
    args = parser.parse_args()

    corpus = data.corpus_text()
    text = corpus[: args.kb * 1000]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"training text: the first {len(text.encode('utf-8')):,} bytes of the corpus, vocabulary {args.vocab}\n")

    ours, (_, our_merges) = best_time(lambda: train_bpe(text, args.vocab), args.repeats)
    naive, naive_merges = best_time(lambda: naive_train(text, args.vocab), 1)
    rows = [("minillm train_bpe (incremental)", ours), ("naive trainer (recount every merge)", naive)]
    try:
        hf, _ = best_time(lambda: hf_train(text, args.vocab), args.repeats)
        threads = os.environ.get("RAYON_NUM_THREADS", f"{os.cpu_count()} (all)")
        rows.append((f"HF tokenizers (Rust, threads: {threads})", hf))
    except ImportError:
        hf = None
    print(f"{'training':50} {'seconds':>9} {'time / minillm':>15}")
    for name, seconds in rows:
        print(f"{name:50} {seconds:9.3f} {seconds / ours:14.2f}x")
    print(f"minillm is {naive / ours:.1f}x faster than the naive trainer"
          + (f"; HF tokenizers is {ours / hf:.1f}x faster than minillm" if hf else ""))
    print(f"same merges as the naive trainer: {our_merges == naive_merges}\n")

    gpt2 = BPETokenizer.from_gpt2_files(*data.gpt2_files())
    n_bytes = len(corpus.encode("utf-8"))
    cold, our_ids = best_time(lambda: BPETokenizer.from_gpt2_files(*data.gpt2_files()).encode(corpus), 1)
    cold -= best_time(lambda: BPETokenizer.from_gpt2_files(*data.gpt2_files()), 1)[0]  # loading is not encoding
    gpt2.encode(corpus)
    warm, _ = best_time(lambda: gpt2.encode(corpus), args.repeats)
    rows = [("minillm, empty cache", cold), ("minillm, warm cache", warm)]
    same = None
    try:
        with tempfile.TemporaryDirectory() as folder:
            encoding = tiktoken_gpt2(Path(folder))
            tik, tik_ids = best_time(lambda: encoding.encode(corpus), args.repeats)
        rows.append(("tiktoken (Rust)", tik))
        same = tik_ids == our_ids
    except ImportError:
        tik = None
    print(f"{'encoding the corpus (' + format(n_bytes, ',') + ' bytes) with GPT-2':50} {'MB/s':>9} {'time / tiktoken':>15}")
    for name, seconds in rows:
        print(f"{name:50} {n_bytes / seconds / 1e6:9.2f} " + (f"{seconds / tik:14.2f}x" if tik else f"{'':>15}"))
    if same is not None:
        print(f"same ids as tiktoken on {len(our_ids):,} tokens: {same}")


if __name__ == "__main__":
    main()
