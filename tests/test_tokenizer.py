"""minillm.tokenizer: GPT-2 parity with tiktoken, training against a naive trainer, properties, errors."""
import hashlib
import itertools
import json
import random
from collections import Counter

import pytest
import regex

from minillm import data
from minillm.tokenizer import (
    BPETokenizer, bytes_to_unicode, count_pairs, decode_ids, encode_word, merge_pair, pretoken_counts,
    pretokenize, train_bpe, train_step,
)

# GPT-2's pre-tokenizer as published in its encoder.py, written out here rather than
# imported, so that a typo in the package's copy fails the tests below.
GPT2_REGEX = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
ENDOFTEXT = "<|endoftext|>"
TIKTOKEN_URLS = {  # tiktoken_ext/openai_public.py; the cache names each file by the SHA-1 of its URL
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
}

PARITY_TEXTS = {
    "unicode": "Grüße, naïve café — Ελληνικά, русский, 中文, 日本語のテキスト, العربية, עברית, हिन्दी, ﬁ ẞ Å",
    "emoji": "🤖🎉 👩‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 👍🏽 ✨ ❤️\u200d🔥 a🤖b",
    "code": (
        'def f(x, *args, **kw):\n    """Doc."""\n    if x >= 0x1F:\n\t\treturn {"a": [1, 2.5e-3]}  # ok\n'
        "    return lambda y: x<<2 | y\n\nclass A(B):\n        pass\n#include <stdio.h>\nint main() { return 0; }\n"
    ),
    "whitespace": "a  b   c    d\n\n\n  e\t\t f \r\n  \u00a0 \u3000 g   \n   x\n \n\t \n",
    "trailing whitespace": "ends with spaces   ",
    "leading whitespace": "   \n starts with space",
    "contractions": "I'm sure they're here; we'll see, you've been, he'd've, it's JOHN'S, don't DON'T can't 'tis 's ''",
    "numbers": "3.14159 1,000,000 2026-11-30 0xFF 1e-9 ½ ² 12345678901234567890 ٣٤٥",
    "punctuation": "Hello!!! What?! ... -- ``quotes'' «guillemets» (parens) [brackets] {braces} @#$%^&*",
    "shakespeare": data.corpus_text()[:20_000],
}


# --- GPT-2 against tiktoken ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiktoken_gpt2(tmp_path_factory):
    """tiktoken's own get_encoding("gpt2"), served offline from a cache of the bundled files."""
    import tiktoken
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    vocab_json, merges_txt = data.gpt2_files()
    (cache / hashlib.sha1(TIKTOKEN_URLS["encoder.json"].encode()).hexdigest()).write_bytes(vocab_json.read_bytes())
    (cache / hashlib.sha1(TIKTOKEN_URLS["vocab.bpe"].encode()).hexdigest()).write_bytes(
        b"#version: 0.2\n" + merges_txt.read_bytes())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        patch.delenv("DATA_GYM_CACHE_DIR", raising=False)
        return tiktoken.get_encoding("gpt2")


@pytest.fixture(scope="module")
def gpt2():
    return BPETokenizer.from_gpt2_files(*data.gpt2_files())


@pytest.mark.parametrize("name", PARITY_TEXTS)
def test_gpt2_ids_equal_tiktoken(gpt2, tiktoken_gpt2, name):
    text = PARITY_TEXTS[name]
    assert gpt2.encode(text) == tiktoken_gpt2.encode(text)
    assert gpt2.decode(gpt2.encode(text)) == text


def test_gpt2_ids_equal_tiktoken_on_the_whole_corpus(gpt2, tiktoken_gpt2):
    text = data.corpus_text()
    assert gpt2.encode(text) == tiktoken_gpt2.encode(text)


def test_gpt2_ids_equal_tiktoken_on_random_unicode(gpt2, tiktoken_gpt2):
    rng = random.Random(0)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x4FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F6FF), (0x0, 0x10FFFF)]
    for _ in range(300):
        chars = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.2:
                chars.append(rng.choice([" ", "  ", "\n", "\t", "'s", "'ll", " '"]))
                continue
            low, high = rng.choice(ranges)
            code = rng.randint(low, high)
            if not 0xD800 <= code <= 0xDFFF:
                chars.append(chr(code))
        text = "".join(chars)
        assert gpt2.encode(text) == tiktoken_gpt2.encode(text), repr(text)
        assert gpt2.decode(gpt2.encode(text)) == text


def test_gpt2_special_token(gpt2, tiktoken_gpt2):
    text = "end of one<|endoftext|>start of two<|endoftext|><|endoftext|>"
    assert gpt2.encode(text) == tiktoken_gpt2.encode(text, allowed_special="all")
    assert gpt2.encode(text).count(50256) == 3
    plain = BPETokenizer.from_gpt2_files(*data.gpt2_files(), special_tokens=None)
    assert plain.encode(text) == tiktoken_gpt2.encode_ordinary(text)
    assert 50256 not in plain.encode(text)


def test_gpt2_vocabulary(gpt2):
    assert len(gpt2) == 50257 and len(gpt2.merges) == 50000
    assert gpt2.vocab[50256] == b"<|endoftext|>" and gpt2.special_tokens == {ENDOFTEXT: 50256}
    assert gpt2.vocab[220] == b" " and gpt2.vocab[198] == b"\n" and gpt2.vocab[262] == b" the"
    assert gpt2.merges[0] == (b" ", b"t")
    assert sorted(len(gpt2.vocab[i]) for i in range(256)) == [1] * 256


def test_bytes_to_unicode_matches_gpt2_files():
    mapping = bytes_to_unicode()
    assert len(set(mapping.values())) == 256
    assert mapping[ord(" ")] == "\u0120" and mapping[ord("\n")] == "\u010a" and mapping[ord("A")] == "A"
    encoder = json.loads(data.gpt2_files()[0].read_text(encoding="utf-8"))
    assert set(mapping.values()) <= set(encoder)  # every byte's character is a GPT-2 token


# --- training --------------------------------------------------------------------------------------

def naive_train(text, vocab_size, specials=()):
    """BPE the slow, obvious way: recount every pair after every merge (ties: smallest ids)."""
    pieces = regex.split("|".join(regex.escape(s) for s in specials), text) if specials else [text]
    words = Counter(w for piece in pieces for w in GPT2_REGEX.findall(piece))
    id_of = {bytes([b]): b for b in range(256)}
    seqs = {tuple(bytes([b]) for b in w.encode("utf-8")): n for w, n in words.items()}
    merges = []
    while len(id_of) < vocab_size - len(specials):
        counts = Counter()
        for seq, n in seqs.items():
            for pair in zip(seq, seq[1:]):
                counts[pair] += n
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], id_of[p[0]], id_of[p[1]]))
        merges.append(best)
        id_of[best[0] + best[1]] = len(id_of)
        new_seqs = {}
        for seq, n in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if seq[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            new_seqs[tuple(out)] = n
        seqs = new_seqs
    return merges


@pytest.mark.parametrize("start, size, vocab_size, specials", [
    (0, 20_000, 400, ()),
    (300_000, 8_000, 600, (ENDOFTEXT,)),
])
def test_training_equals_naive_recounting(start, size, vocab_size, specials):
    text = data.corpus_text()[start:start + size]
    if specials:
        text = text.replace("\n\n", "\n\n" + specials[0])
    vocab, merges = train_bpe(text, vocab_size, list(specials))
    assert merges == naive_train(text, vocab_size, specials)
    assert len(vocab) == vocab_size


def test_training_by_hand():
    # pre-tokens "ab" once, " ab" twice, " cd" once: (a, b) occurs 3 times, then (" ", ab) twice
    vocab, merges = train_bpe("ab ab ab cd", 258)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert vocab[256] == b"ab" and vocab[257] == b" ab" and len(vocab) == 258


def test_training_stops_when_no_pair_is_left():
    vocab, merges = train_bpe("ab", 1000)
    assert merges == [(b"a", b"b")] and len(vocab) == 257
    assert BPETokenizer.train("ab", 1000, special_tokens=[ENDOFTEXT]).special_tokens == {ENDOFTEXT: 257}


def test_training_keeps_ids_merges_and_vocab_consistent():
    tok = BPETokenizer.train(data.corpus_text()[:50_000], 700, special_tokens=[ENDOFTEXT])
    assert len(tok) == 700 and len(tok.merges) == 700 - 256 - 1
    assert tok.special_tokens == {ENDOFTEXT: 699}
    for i in range(256):
        assert tok.vocab[i] == bytes([i])
    for r, (a, b) in enumerate(tok.merges):
        assert tok.vocab[256 + r] == a + b
    pretokens = set(pretokenize(data.corpus_text()[:50_000]))
    corpus_bytes = {p.encode("utf-8") for p in pretokens}
    for r in range(len(tok.merges)):  # merges never cross a pre-token boundary
        token = tok.vocab[256 + r]
        assert any(token in p for p in corpus_bytes), token


def test_special_tokens_are_cut_out_of_training():
    text = ENDOFTEXT.join(["the cat sat on the mat"] * 40)
    with_special = BPETokenizer.train(text, 300, special_tokens=[ENDOFTEXT])
    without = BPETokenizer.train(text, 300)
    learned = lambda tok: [tok.vocab[256 + r] for r in range(len(tok.merges))]
    assert not any(b"|" in t or b"endof" in t for t in learned(with_special))
    assert any(b"|" in t or b"endof" in t for t in learned(without))  # the check can fail
    ids = with_special.encode(text)
    assert ids.count(with_special.special_tokens[ENDOFTEXT]) == 39
    assert with_special.decode(ids) == text


def test_more_merges_compress_held_out_text_better():
    text = data.corpus_text()
    vocab, merges = train_bpe(text[:200_000], 1024)
    held_out = text[-50_000:]
    lengths = [len(BPETokenizer({i: vocab[i] for i in range(256 + k)}, merges[:k]).encode(held_out))
               for k in (0, 64, 256, 768)]
    assert lengths[0] == len(held_out.encode("utf-8"))
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] < 0.5 * lengths[0]


# --- encoding and decoding -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shakespeare():
    return BPETokenizer.train(data.corpus_text()[:100_000], 600, special_tokens=[ENDOFTEXT, "<|pad|>"])


def test_encode_equals_encode_word_per_pretoken(shakespeare):
    ids_of = {t: i for i, t in shakespeare.vocab.items()}
    id_merges = [(ids_of[a], ids_of[b]) for a, b in shakespeare.merges]
    text = data.corpus_text()[500_000:505_000] + " naïve café 🤖"
    expected = [i for p in GPT2_REGEX.findall(text) for i in encode_word(p, id_merges)]
    assert shakespeare.encode(text) == expected


@pytest.mark.parametrize("text", ["", " ", "a", "\n\n\n", "Ünïcödé 😀 x", "<|endoftext|>", "<|endoftext", "<|pad|><|endoftext|>x<|pad|>"])
def test_round_trip(shakespeare, gpt2, text):
    for tok in (shakespeare, gpt2):
        assert tok.decode(tok.encode(text)) == text


def test_special_tokens_are_never_split(shakespeare):
    eot, pad = shakespeare.special_tokens[ENDOFTEXT], shakespeare.special_tokens["<|pad|>"]
    assert shakespeare.encode("x<|endoftext|>y") == shakespeare.encode("x") + [eot] + shakespeare.encode("y")
    assert shakespeare.encode("<|pad|><|endoftext|>") == [pad, eot]
    assert eot not in shakespeare.encode("<|endoftext") and eot not in shakespeare.encode("<| endoftext|>")
    nested = BPETokenizer(shakespeare.vocab, shakespeare.merges, ["<|a|>", "<|a|><|a|>"])
    assert len(nested.encode("<|a|><|a|>")) == 1 and len(nested.encode("<|a|><|a|><|a|>")) == 2


def test_decode_replaces_invalid_utf8(shakespeare, gpt2):
    assert shakespeare.decode([0xFF]) == "\ufffd"
    assert shakespeare.decode([0xC3]) == "\ufffd" and shakespeare.decode([0xC3, 0xA9]) == "é"
    robot = gpt2.encode("🤖")
    assert len(robot) > 1 and gpt2.decode(robot[:1]) == "\ufffd" and gpt2.decode(robot) == "🤖"


def test_encode_caches_pretokens(shakespeare, monkeypatch):
    tok = BPETokenizer(shakespeare.vocab, shakespeare.merges)
    calls = Counter()
    original = tok._bpe

    def counting(ids):
        calls[tuple(ids)] += 1
        return original(ids)

    monkeypatch.setattr(tok, "_bpe", counting)
    first = tok.encode("the cat and the hat and the bat")
    assert tok.encode("the cat and the hat and the bat") == first
    assert sum(calls.values()) == len(set(pretokenize("the cat and the hat and the bat")))
    assert max(calls.values()) == 1


def naive_merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if tuple(ids[i:i + 2]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def test_exercise_functions_against_naive_versions():
    rng = random.Random(5)
    table = {tuple(rng.randrange(5) for _ in range(rng.randint(1, 7))): rng.randint(1, 9) for _ in range(60)}
    naive = Counter()
    for w, n in table.items():
        for i in range(len(w) - 1):
            naive[w[i], w[i + 1]] += n
    before = dict(table)
    assert count_pairs(table) == dict(naive)
    pair, new_table = train_step(table, 100)
    assert table == before, "the exercises must not modify their arguments"
    top = max(naive.values())
    assert pair == min(p for p, c in naive.items() if c == top)
    assert new_table == {tuple(naive_merge(list(w), pair, 100)): n for w, n in table.items()}
    assert any(100 in w for w in new_table)
    ids = [1, 1, 1, 2, 1, 1]
    assert merge_pair(ids, (1, 1), 9) == [9, 1, 2, 9] and ids == [1, 1, 1, 2, 1, 1]
    for seq in ([rng.randrange(3) for _ in range(40)] for _ in range(20)):
        assert merge_pair(seq, (0, 1), 7) == naive_merge(seq, (0, 1), 7)
    assert merge_pair([], (1, 2), 3) == [] and merge_pair([1], (1, 2), 3) == [1]
    assert encode_word("abc", [(98, 99), (97, 98)]) == [97, 256]
    assert encode_word("", [(97, 98)]) == [] and encode_word("é", []) == [195, 169]
    assert decode_ids([0x61, 0xE2, 0x82], {i: bytes([i]) for i in range(256)}) == "a\ufffd"


def test_train_step_breaks_ties_toward_the_smallest_pair():
    # dict order puts (8, 5) first: max(counts, key=counts.get) would pick it
    assert train_step({(8, 5): 4, (2, 6): 4}, 300) == ((2, 6), {(8, 5): 4, (300,): 4})


def test_exercise_functions_reject_bad_input():
    with pytest.raises(ValueError, match="word_counts"):
        train_step({(1,): 3, (): 1}, 256)
    with pytest.raises(ValueError, match="word_counts"):
        train_step({}, 256)
    with pytest.raises(TypeError, match="word"):
        encode_word(b"bytes", [])
    with pytest.raises(ValueError, match="7"):
        decode_ids([7], {0: b"a"})


def test_pretokenize():
    text = "Hello world!  It's 2026, don't panic:\n    x = 42\n" + data.corpus_text()[:3_000]
    pieces = pretokenize(text)
    assert "".join(pieces) == text and pieces == GPT2_REGEX.findall(text)
    assert pretokenize("  hello") == [" ", " hello"]
    with pytest.raises(TypeError, match="text"):
        pretokenize(b"bytes")
    with pytest.raises(TypeError, match="text"):
        pretoken_counts(b"bytes")
    assert pretoken_counts("a<|x|>a a", ["<|x|>"]) == Counter({"a": 2, " a": 1})


# --- encode_iterable -------------------------------------------------------------------------------

def test_encode_iterable_over_file_lines(gpt2):
    path = data.path(data.CORPUS)
    with open(path, encoding="utf-8") as lines:
        assert list(gpt2.encode_iterable(lines)) == gpt2.encode(data.corpus_text())


def test_encode_iterable_any_chunking(shakespeare):
    text = ("Hello  world \n\n  x<|endoftext|>   y<|pad|>'ll  \t\n<|endoftext|><|endof<|pad|> end 're've 'm's  " * 3
            + data.corpus_text()[:2_000])
    rng = random.Random(3)
    want = shakespeare.encode(text)
    for _ in range(60):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 200)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert list(shakespeare.encode_iterable(chunks)) == want
    assert list(shakespeare.encode_iterable(iter(text))) == want  # one character at a time


def test_encode_iterable_is_lazy(shakespeare):
    consumed = 0

    def endless_lines():
        nonlocal consumed
        for _ in itertools.count():
            consumed += 1
            yield "To be, or not to be, that is the question:\n"

    first = list(itertools.islice(shakespeare.encode_iterable(endless_lines()), 50))
    assert len(first) == 50 and consumed < 20


# --- files -----------------------------------------------------------------------------------------

def test_save_load_round_trip(shakespeare, tmp_path):
    path = tmp_path / "tok.json"
    shakespeare.save(path)
    again = BPETokenizer.load(path)
    assert again.vocab == shakespeare.vocab and again.merges == shakespeare.merges
    assert again.special_tokens == shakespeare.special_tokens
    text = "Wherefore art thou<|endoftext|> naïve 🤖"
    assert again.encode(text) == shakespeare.encode(text)


def test_saved_file_is_human_readable(gpt2, tmp_path, tiktoken_gpt2):
    path = tmp_path / "gpt2.json"
    gpt2.save(path)
    text = path.read_text(encoding="utf-8")
    document = json.loads(text)
    assert document["merges"][0] == "Ġ t" and document["vocab"]["Ġthe"] == 262
    assert document["special_tokens"] == {ENDOFTEXT: 50256}
    assert len(text.splitlines()) > 50_000  # one entry a line
    again = BPETokenizer.load(path)
    assert again.encode(PARITY_TEXTS["code"]) == tiktoken_gpt2.encode(PARITY_TEXTS["code"])


# --- bad input -------------------------------------------------------------------------------------

def test_vocab_size_below_bytes_plus_specials():
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train("hello", 255)
    with pytest.raises(ValueError, match="257"):
        BPETokenizer.train("hello", 256, special_tokens=[ENDOFTEXT])
    assert len(BPETokenizer.train("hello", 257, special_tokens=[ENDOFTEXT])) == 257
    with pytest.raises(TypeError, match="vocab_size"):
        BPETokenizer.train("hello", 300.0)


def test_decoding_an_unknown_id_names_it(shakespeare, gpt2):
    with pytest.raises(ValueError, match="12345"):
        shakespeare.decode([1, 2, 12345])
    with pytest.raises(ValueError, match="50257"):
        gpt2.decode([50257])
    with pytest.raises(ValueError, match="-1"):
        gpt2.decode([-1])
    with pytest.raises(TypeError):
        gpt2.decode("abc")
    with pytest.raises(TypeError, match="integers"):
        gpt2.decode([464, 2.0])


def test_decode_accepts_integer_tensors(gpt2):
    import torch
    ids = gpt2.encode("Tensors of ids decode too.")
    assert gpt2.decode(torch.tensor(ids)) == gpt2.decode(ids) == "Tensors of ids decode too."


@pytest.mark.parametrize("bad", [b"bytes", None, 42, ["a", "list"]])
def test_non_str_input_is_a_type_error(shakespeare, bad):
    with pytest.raises(TypeError, match="str"):
        shakespeare.encode(bad)
    with pytest.raises(TypeError):
        BPETokenizer.train(bad, 300)


def test_encode_iterable_rejects_bad_input(shakespeare):
    with pytest.raises(TypeError, match="iterable of str"):
        list(shakespeare.encode_iterable("a single string"))
    with pytest.raises(TypeError, match="str"):
        list(shakespeare.encode_iterable(["ok", b"bytes"]))


def test_constructor_rejects_inconsistent_vocab_and_merges():
    base = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ValueError, match="single bytes"):
        BPETokenizer({i: bytes([i]) for i in range(255)}, [])
    with pytest.raises(ValueError, match="twice"):
        BPETokenizer({**base, 256: b"a"}, [])
    with pytest.raises(ValueError, match="not in vocab"):
        BPETokenizer(base, [(b"a", b"b")])
    with pytest.raises(TypeError, match="merges"):
        BPETokenizer(base, [("a", "b")])
    with pytest.raises(TypeError, match="special_tokens"):
        BPETokenizer(base, [], special_tokens=ENDOFTEXT)
    with pytest.raises(TypeError, match="vocab"):
        BPETokenizer([b"a"], [])


def test_load_rejects_other_files(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": 1}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a tokenizer"):
        BPETokenizer.load(path)
