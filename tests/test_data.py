"""minillm.data: bundled files found through the package, and the one train/validation split."""
import hashlib

import pytest

from minillm import data


def test_corpus_is_the_bundled_tiny_shakespeare():
    text = data.corpus_text()
    assert hashlib.md5(text.encode("utf-8")).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    assert text.startswith("First Citizen:")


def test_split_is_the_last_ten_percent_by_characters():
    train, val = data.split_corpus("abcdefghij")
    assert (train, val) == ("abcdefghi", "j")
    text = data.corpus_text()
    train, val = data.split_corpus(text)
    assert train + val == text and len(val) == len(text) - int(len(text) * 0.9)


def test_bad_arguments_are_named(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="val_fraction"):
        data.split_corpus("abc", 1.5)
    with pytest.raises(TypeError, match="text"):
        data.split_corpus(b"abc")
    monkeypatch.setenv("MINILLM_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="tinyshakespeare.txt"):
        data.corpus_text()


def test_gpt2_files_exist():
    vocab, merges = data.gpt2_files()
    assert vocab.stat().st_size == 1042301 and merges.stat().st_size == 456304
