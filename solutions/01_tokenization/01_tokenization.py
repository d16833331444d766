# %% [markdown]
# # Chapter 01 · Byte-level BPE tokenization
#
# **Where this sits on the tee:** the right sleeve's first arrow. The sleeve feeds the text
# "Code is art..." in and gets token ids (TKN_IDs) out, on their way to the embeddings.
# This chapter builds the machine behind that arrow, and the Tech Band's **BPE**.
#
# **You will be able to**
# - explain why language models read *tokens*, neither characters nor words, and why
#   GPT-2's tokens are built from bytes;
# - train a byte-level BPE tokenizer from scratch: count pairs, merge the most frequent,
#   repeat; and make training fast by updating the counts instead of recounting them;
# - encode text by applying merges in the order they were learned, and decode ids back to
#   text without crashing on a character cut in half;
# - load GPT-2's real tokenizer and reproduce its ids exactly;
# - measure what a bigger vocabulary buys, and say why the sleeve's ids are only an
#   illustration.
#
# **Prerequisites:** Python dictionaries, lists and `bytes`. Chapter 00 helps with the big
# picture but is not needed. No PyTorch in this chapter: a tokenizer is plain Python.
#
# **Time:** about 30 minutes of reading, 60 minutes of exercises.
#
# **How the exercises work.** Each exercise has an answer cell (replace
# `raise NotImplementedError()` with your code), a *visible test* that explains what is
# wrong when it fails, and a *hidden test* that runs only when the notebook is graded.
# Each exercise is graded on its own: where one builds on another, its tests use the
# course's reference for the other. A cell after the tests binds a new name to your
# function when it passes the visible test, or else to the course's reference, so you can
# always read on; in a student bundle where that reference is not released yet, the cells
# that need your answer wait for it and say so.

# %%
import itertools
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

import course_runtime as course
from minillm import data

device = course.setup(seed=0)

# %% [markdown]
# ## Why tokenize, and why bytes
#
# A language model computes with numbers: its first layer looks up one row of a matrix per
# input symbol (chapter 02). So text must become a sequence of integers from a fixed
# set, the **vocabulary**. Three obvious choices, and what is wrong with each:
#
# - **Words.** Short sequences, but the vocabulary never ends: every name, typo, number
#   and inflection is a new word, and a word missing from the vocabulary cannot be read
#   at all.
# - **Characters.** Unicode has about 150,000 of them, most seen rarely or never in
#   training, and sequences get long.
# - **Bytes.** Every text in any language is a sequence of UTF-8 bytes: a vocabulary of
#   256 covers everything and nothing is ever unknown. But sequences are long (an accented
#   letter is 2 bytes, an emoji 4), and a Transformer's attention costs grow with the
#   square of the length (chapter 04).
#
# **Byte-pair encoding** (BPE) starts from bytes and *learns* longer tokens: it merges the
# most frequent pair of adjacent tokens into a new token, again and again. Frequent words
# become single tokens, rare words stay split into pieces, and nothing is ever unknown.
# Here are the bytes of a few strings:

# %%
#| stable
for text in ["Code is art...", "café", "naïve 🤖", "日本語"]:
    raw = text.encode("utf-8")
    print(f"{text!r:18} {len(text):2d} characters, {len(raw):2d} bytes: {list(raw)}")

# %% [markdown]
# ## Byte-level BPE
#
# **Training.** Cut the training text into words, and write each word as a sequence of
# byte ids $0, \dots, 255$. Let $n_w$ be how often word $w$ occurs. Then repeat, once per
# merge:
#
# 1. count every pair of adjacent tokens, each word weighted by its count:
#    $$c(a, b) = \sum_{w} n_w \cdot \#\{\, i : w_i = a,\ w_{i+1} = b \,\};$$
# 2. take the most frequent pair $(a^*, b^*) = \arg\max_{(a,b)} c(a, b)$ (ties go to the
#    smallest pair, compared as tuples of ids, so that training is deterministic);
# 3. give it a new id, $256 + r$ for merge number $r$, whose bytes are the bytes of $a^*$
#    followed by those of $b^*$, and replace every occurrence of $a^*, b^*$ in every
#    word by that id.
#
# The vocabulary then has $256 + R$ tokens after $R$ merges (plus any special tokens):
# the vocabulary size is a choice, made before training. Each merge shortens the training
# text by $c(a^*, b^*)$ tokens (exactly, unless both halves are the same token, as in
# "ee", whose occurrences can overlap), the most any single merge could: BPE is a greedy
# compressor (Gage, 1994, invented it to compress files; Sennrich et al., 2016,
# brought it to translation).
#
# **Encoding** a new text replays the merges: a word starts as its bytes, and the merges
# apply in the order they were learned, each everywhere it can.
#
# **Pre-tokenization.** Which "words"? GPT-2 (Radford et al., 2019) cuts text with a
# regular expression before BPE sees it: contractions (`'s`, `'t`, `'ll`, ...), runs of
# letters, runs of digits and runs of other symbols, each with at most one leading space,
# and runs of whitespace. Merges never cross these cuts, so no token glues the end of one
# word to the start of the next, and `dog`, `dog.` and `dog!` do not waste three
# vocabulary entries. The space travels with the word that follows it: " world" is one
# pre-token.
#
# The cell below starts the module `minillm/tokenizer.py`; your answers to the exercises
# become the next parts of it.

# %%
#| export minillm/tokenizer.py
"""Byte-level BPE tokenization, as GPT-2 does it (chapter 01).

Text becomes token ids in three steps: GPT-2's regular expression cuts it into
pre-tokens (words, numbers, punctuation, runs of whitespace); each pre-token becomes its
UTF-8 bytes, ids 0-255; learned merges then join adjacent tokens, in the order they were
learned, until none applies. ``BPETokenizer.train`` learns merges from a text;
``BPETokenizer.from_gpt2_files`` loads GPT-2's and reproduces its ids exactly.
"""
from __future__ import annotations

import heapq
import json
import operator
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Iterator

import regex
from tqdm.auto import tqdm

# GPT-2's pre-tokenizer: contractions; letters, digits or other symbols, each run with
# at most one leading space; then whitespace. A run of spaces before a word leaves its
# last space to the word, so "  hello" is " " and " hello".
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PRETOKENIZER = regex.compile(GPT2_PATTERN)


def pretokenize(text: str) -> list[str]:
    """Cut ``text`` into GPT-2's pre-tokens; joined, they give back ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _PRETOKENIZER.findall(text)

# %%
#| stable
from minillm.tokenizer import pretokenize as reference_pretokenize

print(reference_pretokenize("Hello world!  It's 2026, don't panic:\n    x = 42\n"))

# %% [markdown]
# Notice `' 2026'` and `' panic'` (the space belongs to the next word), `"'s"` and `"'t"`
# cut off as contractions, the two spaces before "It" split into `' '` and `' It'`, and the
# newline with the indentation after it kept together up to the last space, which goes to
# `' x'`.
#
# ### Exercise 1 · Count the pairs
#
# Training works on a table of words and their counts, `word_counts`, mapping a word (a
# tuple of token ids) to how often it occurs. Return how often each pair of adjacent ids
# occurs, as a dict `{(a, b): count}`, each word weighted by its count. A pair that
# occurs twice inside one word counts twice: `(4, 4, 4)` holds the pair `(4, 4)` twice.
#
# Difficulty ●○○ · Importance ●●● · about 8 minutes
#
# <details><summary>Hint 1</summary><code>zip(word, word[1:])</code> gives the adjacent pairs of a tuple.</details>
# <details><summary>Hint 2</summary>Add <code>n</code>, the word's count, not 1, for each pair: <code>counts[pair] = counts.get(pair, 0) + n</code>.</details>

# %%
#| answer count_pairs
#| export minillm/tokenizer.py
def count_pairs(word_counts: dict[tuple[int, ...], int]) -> dict[tuple[int, int], int]:
    """How often each pair of adjacent ids occurs, each word weighted by its count.

    word_counts maps a word (a tuple of token ids) to how often it occurs.
    Returns {(a, b): count}; a pair repeated inside a word counts each time.
    """
    ### BEGIN SOLUTION
    counts: dict[tuple[int, int], int] = {}
    for word, n in word_counts.items():
        for pair in zip(word, word[1:]):
            counts[pair] = counts.get(pair, 0) + n
    return counts
    ### END SOLUTION

# %%
#| test count_pairs_visible points=1
def _pairs_case():
    return {(1, 2, 3): 2, (2, 3): 5, (4, 4, 4): 1, (9,): 7}


@course.visible_check("count_pairs")
def check_count_pairs(count_pairs):
    case = _pairs_case()
    got = count_pairs(case)
    assert case == _pairs_case(), "count_pairs modified its word_counts argument: only read it"
    course.expect_equal(
        got, {(1, 2): 2, (2, 3): 7, (4, 4): 2}, "count_pairs",
        mistakes={
            "each word counted once: the word counts n_w are ignored": {(1, 2): 1, (2, 3): 2, (4, 4): 2},
            "a pair counted once per word although (4, 4, 4) holds (4, 4) twice": {(1, 2): 2, (2, 3): 7, (4, 4): 1},
            "the last pair of each word is missed (the loop stops one position early)": {(1, 2): 2, (4, 4): 1},
        },
        hint="return a dict {(a, b): count}; a one-token word like (9,) has no pair",
    )


check_count_pairs(count_pairs)
print("count_pairs: visible test passed")

# %%
#| test count_pairs_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
import random as _random

def _naive_pairs(word_counts):
    out = {}
    for word, n in word_counts.items():
        for i in range(len(word) - 1):
            out[(word[i], word[i + 1])] = out.get((word[i], word[i + 1]), 0) + n
    return out

for n_words, alphabet, longest in [(40, 3, 9), (200, 20, 6), (5, 300, 12)]:
    case = {tuple(_random.randrange(alphabet) for _ in range(_random.randint(1, longest))): _random.randint(1, 50) for _ in range(n_words)}
    got = count_pairs(case)
    course.expect_equal(dict(got), _naive_pairs(case), "count_pairs on random words")
    # the defining total: a word of length L holds L - 1 pairs
    assert sum(got.values()) == sum(n * (len(w) - 1) for w, n in case.items()), "pair counts do not add up"
course.expect_equal(dict(count_pairs({})), {}, "count_pairs of no words")
course.expect_equal(dict(count_pairs({(5,): 3, (6,): 1})), {}, "count_pairs of one-token words")
course.expect_equal(dict(count_pairs({(7, 7, 7, 7): 10})), {(7, 7): 30}, "count_pairs of a run of one id")
before = dict(case)
count_pairs(case)
assert case == before, "count_pairs modified its word_counts argument"
### END HIDDEN TESTS

# %%
from minillm import tokenizer as reference_tokenizer

pairs_of = course.keep_going("count_pairs", count_pairs, reference_tokenizer.count_pairs, check_count_pairs)

# %% [markdown]
# ### Exercise 2 · Merge a pair
#
# Return a new list in which every occurrence of `pair` in `ids` is replaced by `new_id`.
# Scan from left to right; occurrences do not overlap, so merging `(7, 7)` in
# `[7, 7, 7]` gives `[new_id, 7]`. Do not modify `ids`.
#
# Difficulty ●○○ · Importance ●●● · about 10 minutes
#
# <details><summary>Hint 1</summary>A <code>while</code> loop with an index <code>i</code> lets you step by 2 after a merge and by 1 otherwise.</details>
# <details><summary>Hint 2</summary>At position <code>i</code>: if <code>i + 1 &lt; len(ids)</code> and <code>(ids[i], ids[i + 1]) == pair</code>, append <code>new_id</code> and skip two; else append <code>ids[i]</code> and skip one.</details>

# %%
#| answer merge_pair
#| export minillm/tokenizer.py
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """A new list with each occurrence of ``pair`` in ``ids`` replaced by ``new_id``.

    Scans left to right; occurrences do not overlap, so (7, 7) in [7, 7, 7] gives
    [new_id, 7]. ``ids`` is not modified.
    """
    ### BEGIN SOLUTION
    first, second = pair
    merged, i, n = [], 0, len(ids)
    while i < n:
        if ids[i] == first and i + 1 < n and ids[i + 1] == second:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged
    ### END SOLUTION

# %%
#| test merge_pair_visible points=1
def _merge_case():
    return [5, 6, 5, 6, 7, 5], (5, 6), 9


@course.visible_check("merge_pair")
def check_merge_pair(merge_pair):
    ids, pair, new_id = _merge_case()
    course.expect_equal(
        merge_pair(ids, pair, new_id), [9, 9, 7, 5], "merge_pair([5, 6, 5, 6, 7, 5], (5, 6), 9)",
        mistakes={
            "only the first occurrence is merged": [9, 5, 6, 7, 5],
            "the last id is dropped (the loop stops before the end)": [9, 9, 7],
        },
    )
    assert ids == [5, 6, 5, 6, 7, 5], "merge_pair modified its input list: build a new one"
    course.expect_equal(
        merge_pair([3, 3, 3], (3, 3), 8), [8, 3], "merge_pair([3, 3, 3], (3, 3), 8)",
        mistakes={
            "overlapping occurrences merged: each id can take part in one merge only": [8, 8],
            "scanned from the right: scan from the left, so the first two 3s merge": [3, 8],
        },
    )


check_merge_pair(merge_pair)
print("merge_pair: visible test passed")

# %%
#| test merge_pair_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
import random as _random

def _naive_merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if tuple(ids[i:i + 2]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out

for length, alphabet in [(50, 2), (300, 4), (17, 3)]:
    seq = [_random.randrange(alphabet) for _ in range(length)]
    for pair in [(0, 1), (1, 1), (2, 0)]:
        before = list(seq)
        got = merge_pair(seq, pair, 1000)
        assert seq == before, "merge_pair modified its input"
        course.expect_equal(list(got), _naive_merge(seq, pair, 1000), "merge_pair in a random list")
        # expanding the new id gives back the input
        expanded = [x for y in got for x in (pair if y == 1000 else (y,))]
        course.expect_equal(expanded, seq, "merge_pair loses or invents ids")
course.expect_equal(list(merge_pair([], (1, 2), 3)), [], "merge_pair of an empty list")
course.expect_equal(list(merge_pair([1], (1, 2), 3)), [1], "merge_pair of a single id")
course.expect_equal(list(merge_pair([1, 2], (1, 2), 300)), [300], "merge_pair of exactly the pair")
course.expect_equal(list(merge_pair([2, 1, 2, 1], (1, 2), 300)), [2, 300, 1], "merge_pair, pair in the middle")
course.expect_equal(list(merge_pair([4, 4, 4, 4, 4], (4, 4), 44)), [44, 44, 4], "merge_pair of a run of five")
### END HIDDEN TESTS

# %%
merge = course.keep_going("merge_pair", merge_pair, reference_tokenizer.merge_pair, check_merge_pair)

# %% [markdown]
# ### Training by hand
#
# Sennrich et al. (2016) illustrate BPE with four words and their counts: *low* 5 times,
# *lower* 2, *newest* 6, *widest* 3. With your two functions, one training step is: count
# the pairs, take the most frequent, merge it everywhere.

# %%
#| stable
toy = {tuple(word.encode("utf-8")): n for word, n in {"low": 5, "lower": 2, "newest": 6, "widest": 3}.items()}
counts = pairs_of(toy)
ranked = sorted(counts, key=lambda p: (-counts[p], p))
for p in ranked[:5]:
    print(f"{bytes(p)!r:8} {p}: {counts[p]}")
best = ranked[0]
print("merge", best, "->", 256, ":", {bytes(w): n for w, n in toy.items()}, "->",
      {tuple(merge(list(w), best, 256)): n for w, n in toy.items()})

# %% [markdown]
# "es" and "st" tie at 9 (*newest* 6 times, *widest* 3 times); the smaller pair, (101, 115),
# wins. After the merge, "es" is token 256, and the next count sees the pair (256, 116),
# "es" + "t", nine times.
#
# ### Exercise 3 · One training step
#
# Put the two together: return the most frequent pair of `word_counts` and the new word
# counts in which that pair is merged into `new_id`. A tie goes to the **smallest** pair
# (compare the tuples: `(101, 115) < (115, 116)`). If no word has two tokens left, raise
# `ValueError`.
#
# Call your `count_pairs` and `merge_pair`. The checks of this exercise, visible and
# hidden, run it with the course's versions of those two instead, so this exercise is
# graded on its own, whatever your answers to exercises 1 and 2 do.
#
# Difficulty ●●○ · Importance ●●● · about 12 minutes
#
# <details><summary>Hint 1</summary>Count with <code>count_pairs(word_counts)</code>; an empty result means no pair is left.</details>
# <details><summary>Hint 2</summary><code>min(counts, key=lambda p: (-counts[p], p))</code>: the highest count first, then the smallest pair.</details>
# <details><summary>Hint 3</summary>The new table: <code>{tuple(merge_pair(list(w), best, new_id)): n for w, n in word_counts.items()}</code>.</details>

# %%
#| answer train_step
#| export minillm/tokenizer.py
def train_step(word_counts: dict[tuple[int, ...], int], new_id: int) -> tuple[tuple[int, int], dict[tuple[int, ...], int]]:
    """One step of BPE training, done the slow way: every pair recounted.

    Returns the most frequent pair (a tie goes to the smallest pair, compared as tuples)
    and the word counts in which it is merged into ``new_id``. Raises ``ValueError`` when
    no word has two tokens left.
    """
    ### BEGIN SOLUTION
    counts = count_pairs(word_counts)
    if not counts:
        raise ValueError("word_counts has no pair left to merge: every word is a single token")
    best = min(counts, key=lambda pair: (-counts[pair], pair))
    return best, {tuple(merge_pair(list(word), best, new_id)): n for word, n in word_counts.items()}
    ### END SOLUTION

# %%
#| test train_step_visible points=1
def _step_case():
    words = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
    return {tuple(w.encode("utf-8")): n for w, n in words.items()}, 256

def _step_reference(word_counts, new_id, largest_on_tie=False):
    # written out here, so that this check does not depend on your count_pairs or merge_pair
    counts = {}
    for w, n in word_counts.items():
        for p in zip(w, w[1:]):
            counts[p] = counts.get(p, 0) + n
    order = sorted(counts, key=lambda p: (-counts[p], tuple(-x for x in p) if largest_on_tie else p))
    best = order[0]
    table = {}
    for w, n in word_counts.items():
        merged, i = [], 0
        while i < len(w):
            if w[i:i + 2] == best:
                merged.append(new_id)
                i += 2
            else:
                merged.append(w[i])
                i += 1
        table[tuple(merged)] = n
    return best, table


@course.visible_check("train_step", count_pairs=reference_tokenizer.count_pairs,
                      merge_pair=reference_tokenizer.merge_pair)
def check_train_step(train_step):
    case = _step_case()
    got = train_step(*case)
    assert case == _step_case(), "train_step modified its word_counts argument: build a new dict"
    expected = _step_reference(*case)
    course.expect_equal(
        got[0], expected[0], "train_step's pair",
        mistakes={
            "a tie went to the largest pair; it must go to the smallest": _step_reference(*case, largest_on_tie=True)[0],
        },
    )
    course.expect_equal(dict(got[1]), expected[1], "train_step's new word counts", hint="merge the pair in every word, keep each count")
    weighted_case = {(7, 8): 6, (2, 9): 1, (2, 9, 4): 2}
    course.expect_equal(
        train_step(weighted_case, 300)[0], (7, 8), "train_step's pair for {(7, 8): 6, (2, 9): 1, (2, 9, 4): 2}",
        mistakes={"the word counts are ignored: every word weighted 1": (2, 9)},
    )
    course.expect_equal(
        train_step({(8, 5): 4, (2, 6): 4}, 300)[0], (2, 6), "train_step's pair for {(8, 5): 4, (2, 6): 4}",
        mistakes={
            "(8, 5) and (2, 6) tie at 4 and the first one counted won (max(counts, key=counts.get) or "
            "most_common keep dict order): a tie must go to the smallest pair": (8, 5),
        },
    )
    course.expect_raises(ValueError, train_step, {(1,): 4, (2,): 1}, 256, what="train_step with no pair left")


check_train_step(train_step)
print("train_step: visible test passed")

# %%
#| test train_step_hidden points=3
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
import random as _random

def _naive_step(word_counts, new_id):
    counts = {}
    for word, count in word_counts.items():
        for i in range(len(word) - 1):
            counts[word[i:i + 2]] = counts.get(word[i:i + 2], 0) + count
    top = max(counts.values())
    best = min(p for p, c in counts.items() if c == top)
    out = {}
    for word, count in word_counts.items():
        merged, i = [], 0
        while i < len(word):
            if word[i:i + 2] == best:
                merged.append(new_id)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        out[tuple(merged)] = count
    return best, out

for n_words, alphabet, steps in [(30, 4, 12), (120, 12, 8)]:
    table = {tuple(_random.randrange(alphabet) for _ in range(_random.randint(1, 8))): _random.randint(1, 20) for _ in range(n_words)}
    new_id = 500
    for _ in range(steps):
        if not any(len(w) > 1 for w in table):
            break
        got_pair, got_table = train_step(table, new_id)
        want_pair, want_table = _naive_step(table, new_id)
        course.expect_equal(tuple(got_pair), want_pair, "train_step's pair")
        course.expect_equal(dict(got_table), want_table, "train_step's words")
        table, new_id = want_table, new_id + 1
# a frequent word beats many rare ones: the counts are weights
pair, _ = train_step({(1, 2): 100, (3, 4): 1, (3, 4, 3, 4): 1, (5, 3, 4): 1}, 7)
course.expect_equal(tuple(pair), (1, 2), "train_step must weight words by their counts")
# a three-way tie
pair, _ = train_step({(9, 8): 2, (3, 7): 2, (3, 6): 2}, 50)
course.expect_equal(tuple(pair), (3, 6), "train_step's tie-break: the smallest pair")
course.expect_raises(ValueError, train_step, {}, 256, what="train_step of an empty table")
course.expect_raises(ValueError, train_step, {(3,): 2, (250,): 9}, 256, what="train_step of single-token words only")
table = {(1, 2, 1, 2): 3, (2, 1): 4}
train_step(table, 300)
assert table == {(1, 2, 1, 2): 3, (2, 1): 4}, "train_step modified its word_counts argument"
### END HIDDEN TESTS

# %%
step = course.keep_going("train_step", train_step, reference_tokenizer.train_step, check_train_step)

# %% [markdown]
# Ten steps on the toy corpus. Each line shows the merged pair, the new token's bytes
# and its id:

# %%
#| stable
table, vocab = dict(toy), {i: bytes([i]) for i in range(256)}
for new_id in range(256, 266):
    (a, b), table = step(table, new_id)
    vocab[new_id] = vocab[a] + vocab[b]
    print(f"merge {new_id - 256}: {vocab[a]!r:10} + {vocab[b]!r:8} -> {vocab[new_id]!r:10} id {new_id}")
print({b"".join(vocab[i] for i in w): [vocab[i] for i in w] for w in table})

# %% [markdown]
# After ten merges each of the four words is a single token. A real training text has
# tens of thousands of distinct words, and we want thousands of merges.
#
# ## Training fast: counting incrementally
#
# `train_step` recounts every pair of every word at every merge. With $W$ distinct words
# of average length $\ell$ and $R$ merges, training costs about $R \cdot W \ell$
# operations, and most of them recount pairs that did not change: a merge of "e" and "s"
# leaves every word without an "es" untouched.
#
# The package's trainer keeps the counts up to date instead. It keeps three things: the
# pair counts; for each pair, the set of words that contain it; and a heap (a priority
# queue) of pairs by count. A merge of $(a, b)$ then
#
# 1. takes the words that contain $(a, b)$ from the index, and only those;
# 2. for each, subtracts the counts of its old pairs and adds the counts of its new pairs
#    (a word $w$ that becomes $w'$ changes $c(p)$ by $n_w \cdot (\#_p(w') - \#_p(w))$);
# 3. pushes the changed counts onto the heap. Older heap entries for those pairs are now
#    stale; they are recognised and skipped when they come to the top, because their count
#    no longer matches.
#
# The pair $(a, b)$ never returns: new tokens always get new ids, so nothing can rebuild
# it. Each merge now costs time in proportion to the words it touches, a few dozen for
# most merges, instead of all $W$.
#
# Special tokens (such as GPT-2's `<|endoftext|>`, which separates documents) are cut out
# of the text before counting: no merge can cross them or learn a piece of them. They
# get the last ids.

# %%
#| export minillm/tokenizer.py
def pretoken_counts(text: str, special_tokens: Iterable[str] = ()) -> Counter:
    """How often each pre-token occurs in ``text``; special tokens are cut out first."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    counts: Counter = Counter()
    special_re = _special_regex(special_tokens)
    for piece in special_re.split(text) if special_re is not None else [text]:
        counts.update(_PRETOKENIZER.findall(piece))
    return counts


def _special_regex(special_tokens: Iterable[str]):
    # Longest first, so that a special token which contains another one wins.
    specials = sorted(set(special_tokens), key=len, reverse=True)
    return regex.compile("|".join(regex.escape(s) for s in specials)) if specials else None


def _check_specials(special_tokens) -> list[str]:
    if special_tokens is None:
        return []
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a list of str, not a single str")
    specials = list(dict.fromkeys(special_tokens))
    for token in specials:
        if not isinstance(token, str) or not token:
            raise TypeError(f"special_tokens must hold non-empty str, got {token!r}")
    return specials


def train_bpe(text: str, vocab_size: int, special_tokens: Iterable[str] | None = None,
              progress: bool = False) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Learn byte-level BPE from ``text``: (vocab, merges).

    ids 0-255 are the bytes, 256 + r is made by merge r, the special tokens come last.
    The pair counts are updated after each merge, not recounted: only the words that
    hold the merged pair change, and a heap gives the next most frequent pair (a tie goes
    to the smallest pair of ids, as in ``train_step``). Stops early, with a smaller
    vocabulary, when no pair is left.
    """
    specials = _check_specials(special_tokens)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    n_merges = vocab_size - 256 - len(specials)
    if n_merges < 0:
        raise ValueError(f"vocab_size must be at least 256 bytes + {len(specials)} special tokens "
                         f"= {256 + len(specials)}, got {vocab_size}")

    # The words, as lists of byte ids, and their counts; then the pair counts, the index
    # of which words hold each pair, and the heap of (-count, pair).
    counts = pretoken_counts(text, specials)
    words = [list(word.encode("utf-8")) for word in counts]
    freqs = list(counts.values())
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> the words that hold it
    for w, (ids, freq) in enumerate(zip(words, freqs)):
        for pair in zip(ids, ids[1:]):
            pair_counts[pair] += freq
            where[pair].add(w)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    vocab = {i: bytes([i]) for i in range(256)}
    merges: list[tuple[bytes, bytes]] = []
    for new_id in tqdm(range(256, 256 + n_merges), desc="BPE merges", disable=not progress):
        while heap:  # an entry is stale when its pair's count has changed since
            negative, pair = heapq.heappop(heap)
            if pair_counts.get(pair) == -negative:
                break
        else:
            break  # no pair left
        merges.append((vocab[pair[0]], vocab[pair[1]]))
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        # Steps 1 and 2: only the words that hold the pair change; collect the changes.
        delta: dict[tuple[int, int], int] = defaultdict(int)
        for w in where.pop(pair):
            old, freq = words[w], freqs[w]
            new = merge_pair(old, pair, new_id)
            for p in zip(old, old[1:]):
                delta[p] -= freq
            for p in zip(new, new[1:]):
                delta[p] += freq
                where[p].add(w)
            words[w] = new
        # Step 3: new counts onto the heap; the older entries of these pairs are now stale.
        for p, change in delta.items():
            if change:
                pair_counts[p] += change
                if pair_counts[p]:
                    heapq.heappush(heap, (-pair_counts[p], p))
                else:
                    del pair_counts[p]
    for token in specials:
        vocab[len(vocab)] = token.encode("utf-8")
    return vocab, merges

# %% [markdown]
# Does the fast trainer learn the same merges as repeated `train_step`s? It must: both
# pick the most frequent pair with the same tie-break. Here are both on a slice of the
# course's corpus (tiny Shakespeare), timed.

# %%
corpus = data.corpus_text()
sample = data.split_corpus(corpus)[0][: 30_000 if course.QUICK else 100_000]
n_merges = 40 if course.QUICK else 120

start = time.perf_counter()
table = {tuple(w.encode("utf-8")): n for w, n in reference_tokenizer.pretoken_counts(sample).items()}
slow_merges, slow_vocab = [], {i: bytes([i]) for i in range(256)}
for new_id in range(256, 256 + n_merges):
    (a, b), table = step(table, new_id)
    slow_vocab[new_id] = slow_vocab[a] + slow_vocab[b]
    slow_merges.append((slow_vocab[a], slow_vocab[b]))
slow = time.perf_counter() - start

start = time.perf_counter()
_, fast_merges = reference_tokenizer.train_bpe(sample, 256 + n_merges)
fast = time.perf_counter() - start
print(f"{len(sample):,} characters, {n_merges} merges: recounting {slow:.3f} s, incremental {fast:.3f} s "
      f"({slow / fast:.0f}x faster); same merges: {slow_merges == fast_merges}")

# %% [markdown]
# Same merges, and the incremental trainer is many times faster (the printed ratio; it
# varies from machine to machine). The gap grows with the number of merges and the size
# of the text: `bench/bpe.py` measures it at 200 KB and 512 tokens, and also against the
# Rust trainer of Hugging Face's `tokenizers`.
#
# ## Encoding: merges in rank order
#
# To encode a new word, replay the merges. The order matters: a merge learned early
# (low **rank**) must apply before a merge learned later, because the later one may have
# been learned on top of the earlier one's result. GPT-2's encoder repeats: among the
# adjacent pairs of the word, find the one with the lowest rank; merge it everywhere in
# the word; stop when no pair of the word is a merge.
#
# ### Exercise 4 · Encode a word
#
# `merges[r]` is the pair `(a, b)` of ids that merge number `r` joins, into the new id
# `256 + r`. Return the ids of `word` (a `str`): start from its UTF-8 bytes (ids 0–255,
# not `ord` of the characters), then apply the merges in rank order as described. Call
# your `merge_pair`: the checks run this exercise with the course's `merge_pair`, so
# that it is graded on its own, whatever your answer to exercise 2 does.
#
# Difficulty ●●○ · Importance ●●● · about 15 minutes
#
# <details><summary>Hint 1</summary><code>list(word.encode("utf-8"))</code> gives the byte ids; <code>rank = {pair: r for r, pair in enumerate(merges)}</code> gives each pair's rank.</details>
# <details><summary>Hint 2</summary>In a loop: <code>best = min(zip(ids, ids[1:]), key=lambda p: rank.get(p, float("inf")))</code>; stop when <code>best</code> is not in <code>rank</code> (or fewer than two ids remain).</details>
# <details><summary>Hint 3</summary>Then <code>ids = merge_pair(ids, best, 256 + rank[best])</code>, and loop.</details>

# %%
#| answer encode_word
#| export minillm/tokenizer.py
def encode_word(word: str, merges: list[tuple[int, int]]) -> list[int]:
    """Token ids of one pre-token: its UTF-8 bytes, then the merges in rank order.

    ``merges[r]`` is the pair of ids that merge number r joins into the id 256 + r. At
    each step the pair of lowest rank in the word is merged, everywhere in the word.
    """
    ### BEGIN SOLUTION
    if not isinstance(word, str):
        raise TypeError(f"word must be a str, got {type(word).__name__}")
    ids = list(word.encode("utf-8"))
    rank = {pair: r for r, pair in enumerate(merges)}
    while len(ids) > 1:
        best = min(zip(ids, ids[1:]), key=lambda pair: rank.get(pair, len(rank)))
        if best not in rank:
            break
        ids = merge_pair(ids, best, 256 + rank[best])
    return ids
    ### END SOLUTION

# %%
#| test encode_word_visible points=1
def _encode_case():
    # 256 "es", 257 "es"+"t", 258 "lo", 259 "lo"+"w", 260 "st", 261 "é" (bytes 195, 169), 262 "we"
    return [(101, 115), (256, 116), (108, 111), (258, 119), (115, 116), (195, 169), (119, 101)]


@course.visible_check("encode_word", merge_pair=reference_tokenizer.merge_pair)
def check_encode_word(encode_word):
    merges_case = _encode_case()
    course.expect_equal(
        encode_word("lowest", merges_case), [259, 257], "encode_word('lowest')",
        mistakes={"only one merge was applied: repeat until no pair of the word is a merge": [108, 111, 119, 256, 116]},
    )
    course.expect_equal(
        encode_word("west", merges_case), [119, 257], "encode_word('west')",
        mistakes={
            "merges applied from left to right as they occur in the word, not by rank: "
            "'we' (rank 6) was merged before 'es' (rank 0)": [262, 260],
        },
    )
    course.expect_equal(
        encode_word("né", merges_case), [110, 261], "encode_word('né')",
        mistakes={"characters turned into ord(...) instead of UTF-8 bytes": [110, 233]},
    )
    course.expect_equal(encode_word("x", merges_case), [120], "encode_word of a word no merge applies to")


check_encode_word(encode_word)
print("encode_word: visible test passed")

# %%
#| test encode_word_hidden points=3
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
def _sequential_encode(word, merges):
    """A different algorithm: apply every merge once, in rank order, over the whole word."""
    ids = list(word.encode("utf-8"))
    for r, (a, b) in enumerate(merges):
        out, i = [], 0
        while i < len(ids):
            if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
                out.append(256 + r)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids

_vocab, _merges = reference_tokenizer.train_bpe(data.corpus_text()[200_000:260_000] + " naïve café über ÆØÅ 🤖🤖", 700)
_id_of = {t: i for i, t in _vocab.items()}
_id_merges = [(_id_of[a], _id_of[b]) for a, b in _merges]
for word in [" thousand", " Romeo", "'ll", " MARCIUS", " naïve", " café", "🤖🤖", "  ", " über", "zzzz", "", "!?!"]:
    got = list(encode_word(word, _id_merges))
    course.expect_equal(got, _sequential_encode(word, _id_merges), "encode_word")
    course.expect_equal(b"".join(_vocab[i] for i in got), word.encode("utf-8"), "the bytes of encode_word's tokens")
# rank order, not position: the later merge must wait
course.expect_equal(list(encode_word("abc", [(98, 99), (97, 98)])), [97, 256], "encode_word must apply merges by rank")
course.expect_equal(list(encode_word("aaaa", [(97, 97), (256, 256)])), [257], "encode_word must repeat until no merge applies")
### END HIDDEN TESTS

# %%
encode_one = course.keep_going("encode_word", encode_word, reference_tokenizer.encode_word, check_encode_word)

# %% [markdown]
# With the ten merges learned on the toy corpus, unseen words come out in known pieces:

# %%
#| stable
toy_merges = []  # the ten toy merges again, as pairs of ids
table, toy_vocab = dict(toy), {i: bytes([i]) for i in range(256)}
for new_id in range(256, 266):
    pair, table = step(table, new_id)
    toy_merges.append(pair)
    toy_vocab[new_id] = toy_vocab[pair[0]] + toy_vocab[pair[1]]
for word in ["lowest", "newer", "wider", "slow"]:
    ids = encode_one(word, toy_merges)
    print(f"{word!r:9} -> {ids} = {[toy_vocab[i] for i in ids]}")

# %% [markdown]
# ## Decoding
#
# Decoding looks like the easy half: look up each id's bytes and join them. The trap is
# that a token is a run of *bytes*, not of characters. GPT-2 cuts the emoji 🤖 (4 bytes)
# into three tokens; any one of them alone, or a text cut off between them, is not valid
# UTF-8. A decoder must not crash there: it turns each invalid byte sequence into the
# replacement character U+FFFD, "�". And it must decode the joined bytes *once*, not
# token by token, or every character that spans two tokens breaks.
#
# ### Exercise 5 · Decode
#
# Return the text of `ids`: join the bytes `vocab[i]` of all the ids, then decode them
# from UTF-8 with invalid bytes replaced by "�". An id that is not in `vocab` raises a
# `ValueError` whose message names the id.
#
# Difficulty ●○○ · Importance ●●○ · about 8 minutes
#
# <details><summary>Hint 1</summary><code>b"".join(pieces)</code> joins a list of <code>bytes</code>.</details>
# <details><summary>Hint 2</summary><code>raw.decode("utf-8", errors="replace")</code>; check <code>i in vocab</code> first and <code>raise ValueError(f"unknown token id {i}")</code>.</details>

# %%
#| answer decode_ids
#| export minillm/tokenizer.py
def decode_ids(ids: Iterable[int], vocab: dict[int, bytes]) -> str:
    """The text of ``ids``: their bytes joined, then decoded from UTF-8 in one go.

    Invalid UTF-8 (such as a character cut between tokens at the end) becomes U+FFFD,
    the replacement character. An id missing from ``vocab`` raises ``ValueError``.
    """
    ### BEGIN SOLUTION
    pieces = []
    for i in ids:
        if i not in vocab:
            raise ValueError(f"unknown token id {i!r}: not in the vocabulary")
        pieces.append(vocab[i])
    return b"".join(pieces).decode("utf-8", errors="replace")
    ### END SOLUTION

# %%
#| test decode_ids_visible points=1
def _decode_case():
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256: b"caf\xc3", 257: b"\xa9!"})  # "é" is cut between 256 and 257
    return vocab


@course.visible_check("decode_ids")
def check_decode_ids(decode_ids):
    vocab_case = _decode_case()
    course.expect_equal(
        decode_ids([256, 257], vocab_case), "café!", "decode_ids([256, 257])",
        mistakes={"each token decoded on its own: decode the joined bytes once": "caf\ufffd\ufffd!"},
    )
    try:
        got = decode_ids([256], vocab_case)
    except UnicodeDecodeError:
        raise course.CheckFailed("decode_ids([256]) crashed on a cut character: decode with errors='replace'") from None
    course.expect_equal(
        got, "caf\ufffd", "decode_ids([256])",
        mistakes={"invalid bytes dropped (errors='ignore'): they must become U+FFFD": "caf"},
    )
    course.expect_raises(
        ValueError, decode_ids, [104, 999], vocab_case, what="decode_ids([104, 999])", match="999",
        mistakes={"the vocabulary's KeyError escapes: raise ValueError naming the id": KeyError},
        hint="999 is not in the vocabulary",
    )
    course.expect_raises(
        ValueError, decode_ids, [-2], vocab_case, what="decode_ids([-2])", match="-2",
        mistakes={"only ids that are too large are rejected (i >= len(vocab)?): check i in vocab": KeyError},
        hint="-2 is not in the vocabulary either",
    )


check_decode_ids(decode_ids)
print("decode_ids: visible test passed")

# %%
#| test decode_ids_hidden points=2
# Hidden tests: they run when your notebook is graded.
### BEGIN HIDDEN TESTS
import random as _random

_gpt2 = reference_tokenizer.BPETokenizer.from_gpt2_files(*data.gpt2_files())
for text in ["Grüße aus Köln 👋🏽", "def f(x):\n\treturn x ** 2  # 平方", "plain ascii"]:
    ids = _gpt2.encode(text)
    course.expect_equal(decode_ids(ids, _gpt2.vocab), text, "decode_ids of GPT-2's ids for a text")
    for cut in range(len(ids)):
        want = b"".join(_gpt2.vocab[i] for i in ids[:cut]).decode("utf-8", errors="replace")
        course.expect_equal(decode_ids(ids[:cut], _gpt2.vocab), want, "decode_ids of a prefix of GPT-2's ids")
soup = [_random.randrange(256) for _ in range(200)]
course.expect_equal(decode_ids(soup, {i: bytes([i]) for i in range(256)}), bytes(soup).decode("utf-8", errors="replace"), "decode_ids of random bytes")
course.expect_equal(decode_ids([], {0: b"a"}), "", "decode_ids of no ids")
course.expect_equal(decode_ids((0, 0, 1), {0: b"a", 1: b"\xe2\x82\xac"}), "aa€", "decode_ids of a tuple of ids")
for bad in [-1, 50257, 10**9]:
    course.expect_raises(ValueError, decode_ids, [1, bad], _gpt2.vocab, what="decode_ids with an id that is not in the vocab", match=str(bad))

### END HIDDEN TESTS

# %%
decode_with = course.keep_going("decode_ids", decode_ids, reference_tokenizer.decode_ids, check_decode_ids)

# %% [markdown]
# ## The tokenizer
#
# The pieces become one class, `BPETokenizer`. Its state is the vocabulary
# (`vocab: dict[int, bytes]`) and the merges (`merges: list[tuple[bytes, bytes]]`, in rank
# order), both plain attributes you can inspect. Beyond the exercises it adds:
#
# - **Any ids.** GPT-2's ids for the 256 bytes are not the byte values (its files list
#   printable bytes first), so the class keeps a byte → id table and a pair → rank table
#   instead of assuming `256 + r`.
# - **Special tokens** are found first, with a regular expression of their exact strings,
#   and each becomes its one id: text that contains `<|endoftext|>` never splits it.
# - **A cache.** A text repeats its words: the ids of each pre-token are computed once and
#   remembered (up to `cache_size` distinct pre-tokens), so encoding costs mostly the
#   regular expression and dictionary lookups.
# - **`encode_iterable`** encodes a file line by line, lazily, with the same result as
#   encoding the whole text. A pre-token can continue past a line end (a run of
#   whitespace does), and "'" may yet become "'ll", so it holds back the end of what it
#   has read (the last pre-token, anything within two characters of the end, and any end
#   that could be the start of a special token) until the next line settles it.
# - **Files.** `save` writes JSON a person can read: tokens are spelled with GPT-2's
#   printable byte map (a space shows as `Ġ`, a newline as `Ċ`), merges as
#   `"Ġ t"` lines. `from_gpt2_files` reads GPT-2's released `vocab.json` and
#   `merges.txt`, which use the same map.

# %%
#| export minillm/tokenizer.py
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character, used in its vocabulary files.

    Printable Latin-1 bytes map to themselves; the 68 others (space, control bytes,
    a few more) map, in order, to characters from U+0100 on: a space shows as 'Ġ',
    a newline as 'Ċ'.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


def _unspeller(where):
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}

    def unspell(token: str) -> bytes:
        try:
            return bytes(byte_of[char] for char in token)
        except KeyError as error:
            raise ValueError(f"{where}: token {token!r} holds {error.args[0]!r}, not one of GPT-2's byte characters") from None

    return unspell


def _merge_line(line: str, where) -> list[str]:
    parts = line.split(" ")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"{where}: a merge must be two tokens separated by one space, got {line!r}")
    return parts


class BPETokenizer:
    """A byte-level BPE tokenizer: text to ids and back.

    ``vocab`` maps each id to the bytes of its token, and must hold every single byte.
    ``merges`` lists pairs of tokens in rank order (first learned first); each pair and
    its concatenation must be in ``vocab``. ``special_tokens`` (strings such as
    ``"<|endoftext|>"``) are never split: each is one id, the vocabulary's id for its
    bytes when there is one, else a new id after the largest.
    """

    cache_size = 2**16

    def __init__(self, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
                 special_tokens: Iterable[str] | None = None):
        if not isinstance(vocab, dict):
            raise TypeError(f"vocab must be a dict of id -> bytes, got {type(vocab).__name__}")
        self.vocab: dict[int, bytes] = {}
        ids_of: dict[bytes, int] = {}
        for i, token in vocab.items():
            if isinstance(i, bool) or not isinstance(i, int) or i < 0 or not isinstance(token, bytes):
                raise TypeError(f"vocab must map non-negative int ids to bytes, got {i!r}: {token!r}")
            if token in ids_of:
                raise ValueError(f"vocab holds {token!r} twice, as ids {ids_of[token]} and {i}")
            self.vocab[i] = token
            ids_of[token] = i
        missing = [b for b in range(256) if bytes([b]) not in ids_of]
        if missing:
            raise ValueError(f"vocab must hold all 256 single bytes; {len(missing)} missing, "
                             f"the first {bytes([missing[0]])!r}")
        self.merges: list[tuple[bytes, bytes]] = []
        self._ranks: dict[tuple[int, int], int] = {}
        self._merged: dict[tuple[int, int], int] = {}
        for rank, merge in enumerate(merges):
            if not (isinstance(merge, tuple) and len(merge) == 2 and all(isinstance(t, bytes) for t in merge)):
                raise TypeError(f"merges must be (bytes, bytes) pairs, got {merge!r} at rank {rank}")
            for token in (merge[0], merge[1], merge[0] + merge[1]):
                if token not in ids_of:
                    raise ValueError(f"merges[{rank}] = {merge!r}: {token!r} is not in vocab")
            pair = (ids_of[merge[0]], ids_of[merge[1]])
            self._ranks.setdefault(pair, rank)
            self._merged.setdefault(pair, ids_of[merge[0] + merge[1]])
            self.merges.append(merge)
        self.special_tokens: dict[str, int] = {}
        for token in _check_specials(special_tokens):
            raw = token.encode("utf-8")
            if raw not in ids_of:
                ids_of[raw] = max(self.vocab) + 1
                self.vocab[ids_of[raw]] = raw
            self.special_tokens[token] = ids_of[raw]
        self._special_re = _special_regex(self.special_tokens)
        self._byte_ids = [ids_of[bytes([b])] for b in range(256)]
        self._cache: dict[str, tuple[int, ...]] = {}

    def __len__(self) -> int:
        """The vocabulary size, special tokens included."""
        return len(self.vocab)

    def __repr__(self) -> str:
        return (f"BPETokenizer({len(self)} tokens, {len(self.merges)} merges, "
                f"special tokens {list(self.special_tokens)})")

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: Iterable[str] | None = None,
              progress: bool = False) -> "BPETokenizer":
        """Learn a tokenizer of ``vocab_size`` tokens (specials included) from ``text``; see ``train_bpe``."""
        vocab, merges = train_bpe(text, vocab_size, special_tokens, progress)
        return cls(vocab, merges, special_tokens)

    # encoding
    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``; each special token becomes its single id."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        start = 0
        if self._special_re is not None:
            for match in self._special_re.finditer(text):
                self._encode_ordinary(text[start:match.start()], ids)
                ids.append(self.special_tokens[match.group()])
                start = match.end()
        self._encode_ordinary(text[start:], ids)
        return ids

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        for pretoken in _PRETOKENIZER.findall(text):
            ids = self._cache.get(pretoken)
            if ids is None:
                ids = self._bpe([self._byte_ids[b] for b in pretoken.encode("utf-8")])
                if len(self._cache) >= self.cache_size:
                    self._cache.clear()
                self._cache[pretoken] = ids
            out.extend(ids)

    def _bpe(self, ids: list[int]) -> tuple[int, ...]:
        """Apply the merges to one pre-token's ids, the lowest rank first (as ``encode_word``)."""
        ranks, never = self._ranks, len(self._ranks)
        while len(ids) > 1:
            best = min(zip(ids, ids[1:]), key=lambda pair: ranks.get(pair, never))
            if best not in ranks:
                break
            ids = merge_pair(ids, best, self._merged[best])
        return tuple(ids)

    def encode_iterable(self, chunks: Iterable[str]) -> Iterator[int]:
        """The ids of the concatenated ``chunks`` (e.g. an open text file's lines), lazily.

        Yields exactly ``encode("".join(chunks))``, one id at a time, holding in memory
        only the current chunk and the unsettled end of the text before it.
        """
        if isinstance(chunks, (str, bytes)):
            raise TypeError(f"chunks must be an iterable of str (such as an open text file), not a "
                            f"single {type(chunks).__name__}; use encode for one string")
        pending = ""
        for chunk in chunks:
            if not isinstance(chunk, str):
                raise TypeError(f"chunks must yield str, got {type(chunk).__name__}")
            pending += chunk
            settled = self._settled_length(pending)
            if settled:
                yield from self.encode(pending[:settled])
                pending = pending[settled:]
        yield from self.encode(pending)

    def _settled_length(self, text: str) -> int:
        """Length of a prefix of ``text`` whose ids no continuation of ``text`` can change."""
        # An end that is, or could grow into, a special token is not settled.
        end = len(text) - max((k for token in self.special_tokens for k in range(1, len(token))
                               if text.endswith(token[:k])), default=0)
        start = 0
        if self._special_re is not None:
            for match in self._special_re.finditer(text):
                if match.start() >= end:
                    break
                start = match.end()  # a special token that starts before the end is final
        if start >= end:
            return start
        # A pre-token is settled once two more characters are known: the regular expression
        # looks at most two characters past a match ("'" may still become "'ll", "'re", "'ve").
        settled = start
        for pretoken in _PRETOKENIZER.findall(text[start:end])[:-1]:
            if settled + len(pretoken) + 2 > end:
                break
            settled += len(pretoken)
        return settled

    # decoding
    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (ints, or anything int-like: a 1-D integer tensor works).

        Bytes that are not valid UTF-8 become U+FFFD; an unknown id is a ``ValueError``.
        """
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"ids must be an iterable of int, got {type(ids).__name__}")
        try:
            ids = [operator.index(i) for i in ids]
        except TypeError:
            raise TypeError(f"ids must be integers, got {ids!r:.80}") from None
        return decode_ids(ids, self.vocab)

    # files
    def save(self, path) -> None:
        """Write the tokenizer to ``path`` as JSON, tokens spelled with GPT-2's byte map."""
        printable = bytes_to_unicode()

        def spell(token: bytes) -> str:
            return "".join(printable[b] for b in token)

        document = {
            "format": "minillm byte-level BPE",
            "version": 1,
            "pre_tokenizer": GPT2_PATTERN,
            "special_tokens": self.special_tokens,
            "merges": [f"{spell(a)} {spell(b)}" for a, b in self.merges],
            "vocab": {spell(token): i for i, token in sorted(self.vocab.items())},
        }
        Path(path).write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path) -> "BPETokenizer":
        """Read a tokenizer written by ``save``."""
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(document, dict) or document.get("format") != "minillm byte-level BPE":
            raise ValueError(f"{path}: not a tokenizer written by BPETokenizer.save")
        unspell = _unspeller(path)
        vocab = {i: unspell(token) for token, i in document["vocab"].items()}
        merges = [tuple(unspell(t) for t in _merge_line(line, path)) for line in document["merges"]]
        return cls(vocab, merges, list(document["special_tokens"]))

    @classmethod
    def from_gpt2_files(cls, vocab_path, merges_path,
                        special_tokens: Iterable[str] | None = ("<|endoftext|>",)) -> "BPETokenizer":
        """GPT-2's tokenizer from its released ``vocab.json`` (encoder.json) and ``merges.txt``."""
        unspell = _unspeller(vocab_path)
        encoder = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
        vocab = {i: unspell(token) for token, i in encoder.items()}
        merges = []
        for line in Path(merges_path).read_text(encoding="utf-8").split("\n"):
            if line and not line.startswith("#version"):
                merges.append(tuple(unspell(t) for t in _merge_line(line, merges_path)))
        return cls(vocab, merges, special_tokens)

# %% [markdown]
# The class above calls your `merge_pair`, so in this notebook it works only once your
# exercises do. From here on the chapter uses the package's copy, `minillm.tokenizer`,
# built from the same cells with the reference answers, so that it runs whatever state
# your exercises are in. (In a student bundle from your instructor, the package holds
# no reference answers for this chapter yet: its copy runs on your own functions, once
# their keep-going checks pass.)
#
# ## A tokenizer for Shakespeare
#
# Train on the course's training split, the first 90% of the corpus (about a million
# characters; `data.split_corpus` keeps the last 10% as validation text for every
# chapter, and here it measures the tokenizer on text it has not seen), with 1,024
# tokens, one of them the special `<|endoftext|>`:

# %%
from minillm.tokenizer import BPETokenizer

train_text, held_out = data.split_corpus(corpus)
start = time.perf_counter()
shakespeare = BPETokenizer.train(train_text, 1024, special_tokens=["<|endoftext|>"], progress=True)
print(f"{shakespeare} trained on {len(train_text):,} characters in {time.perf_counter() - start:.1f} s")

# %%
#| stable
print("first merges:", [a + b for a, b in shakespeare.merges[:12]])
print("last merges: ", [a + b for a, b in shakespeare.merges[-8:]])
longest = sorted(shakespeare.vocab.values(), key=len)[-8:]
print("longest tokens:", longest)
line = "ROMEO:\nBut, soft! what light through yonder window breaks?"
ids = shakespeare.encode(line)
print(len(line.encode("utf-8")), "bytes ->", len(ids), "tokens:", [shakespeare.vocab[i] for i in ids])

# %% [markdown]
# The first merges are the commonest pairs of English: a space and "t", "h" and "e", a
# space and "a"; the word " the" is merge number 10. The longest tokens are the names of
# the speakers (`CORIOLANUS`, `GLOUCESTER`), because the corpus is a play script and every
# speech starts with one. With only 767 merges the line of *Romeo and Juliet* above still
# needs 25 tokens for 58 bytes: common words are whole (" what"), rarer ones in pieces
# (" th" "r" "ough").
#
# Special tokens stay whole, and decoding gives back the text exactly, even for text far
# from the training data. Decoding a cut emoji shows the replacement character:

# %%
#| stable
mixed = "First Citizen:\nSpeak.<|endoftext|>New doc: naïve café, 🤖, x = f(2026)"
ids = shakespeare.encode(mixed)
print(f"<|endoftext|> found {ids.count(shakespeare.special_tokens['<|endoftext|>'])} time(s), as the one id {shakespeare.special_tokens['<|endoftext|>']}")
print("round trip exact:", shakespeare.decode(ids) == mixed)
robot = shakespeare.encode("🤖")
print("🤖 ->", robot, "; its first token alone decodes to", repr(decode_with(robot[:1], shakespeare.vocab)))

# %% [markdown]
# `encode_iterable` reads the corpus file line by line and yields the same ids as `encode`
# on the whole text; `save` and `load` round-trip through a JSON file you can read:

# %%
n_lines = 4_000 if course.QUICK else None  # the whole file in full mode
with open(data.path(data.CORPUS), encoding="utf-8") as lines:
    streamed = list(shakespeare.encode_iterable(itertools.islice(lines, n_lines)))
whole = "".join(corpus.splitlines(keepends=True)[:n_lines])
print(f"encode_iterable over {whole.count(chr(10)):,} lines of the file == encode of their text: {streamed == shakespeare.encode(whole)}")
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "shakespeare-1024.json"
    shakespeare.save(path)
    again = BPETokenizer.load(path)
    print("load(save(tokenizer)) encodes identically:", again.encode(mixed) == ids, "·", path.stat().st_size // 1024, "KiB")
    print("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:12]) + " ...")

# %% [markdown]
# ## GPT-2's tokenizer
#
# GPT-2's tokenizer is the same algorithm with 50,000 merges learned on 40 GB of web text,
# plus `<|endoftext|>` as id 50,256. Its released files load directly; the course's tests
# check the ids against OpenAI's own tokenizer library (`tiktoken`) on Unicode, emoji,
# code, runs of whitespace and contractions, and they agree exactly.

# %%
#| stable
gpt2 = BPETokenizer.from_gpt2_files(*data.gpt2_files())
print(gpt2)
samples = {
    "English": "The quick brown fox jumps over the lazy dog.",
    "Shakespeare": "Now is the winter of our discontent made glorious summer",
    "Python": "def area(r):\n    return 3.14159 * r ** 2\n",
    "German": "Die Straße ist naß, aber die Bäume blühen.",
    "Russian": "Привет, как дела?",
    "Japanese": "東京は日本の首都です。",
    "emoji": "🤖🎉👩‍👩‍👧",
    "digits": "In 2026 it cost 1234567.89",
}
print(f"{'text':12} {'bytes':>5} {'GPT-2 tokens':>12} {'bytes/token':>11} {'Shakespeare-1024 tokens':>23}")
for name, text in samples.items():
    n_bytes = len(text.encode("utf-8"))
    print(f"{name:12} {n_bytes:5d} {len(gpt2.encode(text)):12d} {n_bytes / len(gpt2.encode(text)):11.2f} "
          f"{len(shakespeare.encode(text)):23d}")
print([gpt2.vocab[i] for i in gpt2.encode(samples["Python"])])
print([gpt2.vocab[i] for i in gpt2.encode(samples["digits"])])

# %% [markdown]
# The table shows what a tokenizer's training data does. English costs GPT-2 about one
# token per word. Per byte of text, German costs it 1.7 times as many tokens as English,
# Japanese 2.3 times and Russian 2.6 times (and their characters already take 2 or 3
# bytes each), because its merges were learned on mostly English text. Context lengths
# and prices are counted in tokens, so this is a real unfairness (Petrov et al., 2023).
# The code line shows GPT-2's best-known weakness: four spaces of indentation become three
# tokens of one space each, and the fourth space rides with " return". The digits are cut
# into arbitrary chunks (" 123", "45", "67"), one reason why early models struggled with
# arithmetic. The Shakespeare tokenizer, with a fiftieth of GPT-2's vocabulary, needs
# about twice as many tokens on English and falls back to single bytes on Japanese and
# emoji, which it never saw.
#
# ## How big a vocabulary?
#
# Each merge adds a token and shortens the text. How fast do the returns fall? Merges are
# learned in order, so the tokenizer with the first $k$ merges of a big tokenizer is
# exactly the tokenizer trained with vocabulary $256 + k$. One training run gives the
# whole curve. We measure **bytes per token** on the held-out text.

# %%
sweep_text, sweep_size = (train_text[:200_000], 1536) if course.QUICK else (train_text, 4096)
measured = held_out[:40_000] if course.QUICK else held_out
big_vocab, big_merges = reference_tokenizer.train_bpe(sweep_text, sweep_size, progress=True)
held_bytes = len(measured.encode("utf-8"))
sizes = [s for s in (256, 300, 384, 512, 768, 1024, 1536, 2048, 3072, 4096) if s <= sweep_size]
bytes_per_token = []
for size in sizes:
    prefix = BPETokenizer({i: big_vocab[i] for i in range(size)}, big_merges[: size - 256])
    bytes_per_token.append(held_bytes / len(prefix.encode(measured)))
gpt2_bpt = held_bytes / len(gpt2.encode(measured))

fig, ax = plt.subplots(figsize=(6.5, 4))
ax.plot(sizes, bytes_per_token, "o-", label=f"trained on {len(sweep_text) // 1000:,} KB of Shakespeare")
ax.plot([50257], [gpt2_bpt], "s", color="C3", label="GPT-2 (50,257 tokens, web text)")
ax.set_xscale("log", base=2)
ax.set_xticks([256, 512, 1024, 2048, 4096, 16384, 50257], ["256", "512", "1k", "2k", "4k", "16k", "50k"])
ax.set_xlabel("vocabulary size (tokens, log scale)")
ax.set_ylabel("bytes per token on held-out Shakespeare")
ax.set_title("Past 512 tokens, each doubling of the vocabulary\nadds about a third of a byte per token")
ax.grid(True, alpha=0.3)
ax.legend()
plt.show()
for size, bpt in zip(sizes, bytes_per_token):
    print(f"{size:5d} tokens: {bpt:.2f} bytes per token")
print(f"GPT-2: {gpt2_bpt:.2f} bytes per token")

# %% [markdown]
# Bytes alone give 1 byte per token. The first 256 merges nearly double that (1.9 bytes
# per token at 512): they capture the commonest pairs and the shortest words. After that
# every *doubling* of the vocabulary adds a roughly constant amount, about a third of a
# byte per token: the returns diminish. GPT-2, with 12 times more tokens than our largest tokenizer but trained on
# other text, compresses held-out Shakespeare only a little better. A bigger vocabulary
# also costs: each token needs a row in the embedding matrix and in the output layer
# (GPT-2 small ties the two; its 50,257 rows still hold 38.6 million of its 124 million
# parameters, chapter 00), and rare tokens get few training examples.
#
# What lengths are the tokens? Count the vocabulary entries of each length, and the
# tokens of each length in the encoded held-out text:

# %%
final = BPETokenizer(big_vocab, big_merges)
encoded = final.encode(measured)
longest = 12
in_vocab = [sum(1 for t in big_vocab.values() if min(len(t), longest) == n) for n in range(1, longest + 1)]
in_text = [0] * longest
for i in encoded:
    in_text[min(len(big_vocab[i]), longest) - 1] += 1
lengths = range(1, longest + 1)
fig, ax = plt.subplots(figsize=(6.5, 4))
ax.bar([n - 0.2 for n in lengths], [c / sum(in_vocab) for c in in_vocab], width=0.4, label=f"vocabulary entries ({len(big_vocab):,})")
ax.bar([n + 0.2 for n in lengths], [c / sum(in_text) for c in in_text], width=0.4, label=f"tokens in held-out text ({len(encoded):,})")
ax.set_xticks(list(lengths), [str(n) for n in range(1, longest)] + [f"{longest}+"])
ax.set_xlabel("token length (bytes)")
ax.set_ylabel("fraction")
ax.set_title(f"Token lengths, {len(big_vocab):,}-token Shakespeare tokenizer")
ax.legend()
plt.show()
mean_vocab = sum(len(t) for t in big_vocab.values()) / len(big_vocab)
mean_text = sum(len(big_vocab[i]) for i in encoded) / len(encoded)
print(f"mean length: {mean_vocab:.2f} bytes per vocabulary entry, {mean_text:.2f} bytes per token of text")

# %% [markdown]
# The vocabulary is mostly made of tokens of 3 to 6 bytes: words and pieces of words with
# their leading space. The running text is not: a third of its tokens are single bytes
# (spaces, punctuation, newlines, letters left over), because they occur everywhere. A
# long token is used only where its whole word appears, and most words of a vocabulary
# are rare.
#
# ### Written question 1
#
# GPT-2 cuts the text with a regular expression before BPE, so that no merge crosses a
# pre-token boundary. Name two things that would go wrong if BPE ran on the raw bytes of
# the whole text instead, and one thing the pre-tokenizer costs.

# %% [markdown]
# #| written pretokenization_written points=2
# ### BEGIN SOLUTION
# *Model answer.* Without pre-tokenization, merges cross word boundaries. (1) The vocabulary fills with
# fragments that glue the end of one word to the start of the next ("e t" from "the
# table", "d o" from "and of"), and with every punctuation variant of a word ("dog.",
# "dog,", "dog!"): entries that generalise badly and crowd out useful ones. (2) The same
# word gets different tokens depending on its neighbours, so the model must learn many
# spellings of one word; and a frequent phrase can swallow the space that marks where a
# word starts. Costs of the regex: it never learns multi-word tokens ("New York",
# "in order to"), it bakes in assumptions of English and of scripts that separate words
# with spaces (contractions only with ASCII apostrophes and lower case; languages
# written without spaces give huge pre-tokens), and it handles code whitespace badly
# (runs of spaces are cut so that indentation becomes many tokens).
#
# *Grading:* 1 point for two distinct problems of merging across boundaries (tokens that
# span words, punctuation variants, context-dependent spellings of one word), 1 point for
# a real cost of the regex (no multi-word tokens, language or script assumptions, code
# whitespace).
# ### END SOLUTION

# %% [markdown]
# ## Tee check
#
# > **The shirt:** the right sleeve feeds "Code is art..." in, and token ids (TKN_IDs)
# > come out, on their way to the embeddings.
#
# **What is right:** this is the first step of every language model. The model never sees
# characters, only integers, one per token, and each integer selects one row of the
# embedding matrix (chapter 02).
#
# **What is loose:** the ids are not a property of the text. They are a property of the
# text *and a tokenizer*: its training data, its vocabulary size, the order of its merges.
# Here is the sleeve's text through the two tokenizers of this chapter:

# %%
#| stable
sleeve = "Code is art..."
for name, tok in [("Shakespeare-1024", shakespeare), ("GPT-2", gpt2)]:
    ids = tok.encode(sleeve)
    print(f"{name:17} {len(ids):2d} tokens: ids {ids}")
    print(f"{'':17}           pieces {[tok.vocab[i] for i in ids]}")
for variant in [" Code is art...", "code is art...", "CODE IS ART..."]:
    print(f"GPT-2 {variant!r:19} -> {gpt2.encode(variant)}")
art = shakespeare.encode(" art")[0]
print(f"' art' is id 1242 for GPT-2 and id {art} for the Shakespeare tokenizer; GPT-2's id {art} is {gpt2.vocab[art]!r}")

# %% [markdown]
# The same text gives 4 tokens with GPT-2 and 8 with the Shakespeare tokenizer (which
# never saw the word "Code", so it spells it "C" "od" "e"), with no id in common. Even a
# single byte has different ids: "." is 46 (its byte value) for the Shakespeare tokenizer
# and 13 for GPT-2, whose files number the bytes in another order. Even with one tokenizer, the ids change with a leading space (" Code" is
# 6127, "Code" 10669) or with capitals: "CODE" is not a GPT-2 word, so it falls apart into
# "C" and "ODE". A shirt that prints ids without naming a tokenizer (and its version) can
# only be illustrative: the numbers mean something only as row indices into one model's
# embedding table, trained together with that one tokenizer.
#
# ### Written question 2
#
# A model trained with GPT-2's tokenizer is given ids produced by the Shakespeare
# tokenizer of this chapter. Does anything raise an error? What does the model "read",
# and what does this say about shipping a model?

# %% [markdown]
# #| written wrong_tokenizer_written points=2
# ### BEGIN SOLUTION
# *Model answer.* Nothing raises: every Shakespeare id is below 1,024, a valid row index
# of GPT-2's 50,257-row embedding matrix, so the lookup succeeds silently. But each id
# selects the embedding of a different string: the model reads a sequence of unrelated
# GPT-2 tokens (the Shakespeare tokenizer's id for " art", 738, is "ident" for GPT-2), so
# its output is nonsense, and nothing says why. The tokenizer is part of the model: its
# vocabulary and merges must be shipped and versioned with the weights, and the ids are
# meaningless without it. (A defensive loader checks that the tokenizer's vocabulary size
# equals the embedding's number of rows; even that would not catch two tokenizers of the
# same size.)
#
# *Grading:* 1 point for "no error, because the ids are valid row indices, but they name
# other strings, so the model reads nonsense"; 1 point for the consequence: tokenizer and
# weights are one artefact, shipped and versioned together.
# ### END SOLUTION

# %% [markdown]
# ## What `minillm` gained
#
# `minillm.tokenizer`:
# - `count_pairs`, `merge_pair`, `train_step`, `encode_word`, `decode_ids` (your
#   Exercises 1–5), the building blocks, small enough to read;
# - `train_bpe`, the incremental trainer, and `pretoken_counts`;
# - `BPETokenizer(vocab, merges, special_tokens)` with `train`, `encode`, `decode`,
#   `encode_iterable`, `save`/`load` and `from_gpt2_files`, checked against `tiktoken`'s
#   GPT-2 in the test suite; `bench/bpe.py` times it against a naive trainer, Hugging
#   Face's `tokenizers` and `tiktoken`.
#
# Chapter 02 turns these ids into vectors; chapter 07 trains a model on the Shakespeare
# corpus with this tokenizer.
#
# ## Further reading
#
# - Gage, *A New Algorithm for Data Compression* (1994): byte-pair encoding, as compression.
# - Sennrich, Haddow & Birch, *Neural Machine Translation of Rare Words with Subword Units* (2016): BPE for words.
# - Kudo, *Subword Regularization* (2018), and Kudo & Richardson, *SentencePiece* (2018): the unigram alternative.
# - Radford et al., *Language Models are Unsupervised Multitask Learners* (2019): GPT-2's byte-level BPE and its regex.
# - Wang, Cho & Gu, *Neural Machine Translation with Byte-Level Subwords* (2020).
# - Bostrom & Durrett, *Byte Pair Encoding is Suboptimal for Language Model Pretraining* (2020).
# - Xue et al., *ByT5: Towards a Token-Free Future with Pre-trained Byte-to-Byte Models* (2022).
# - Petrov et al., *Language Model Tokenizers Introduce Unfairness Between Languages* (2023).
