"""The fine-tuning tasks of chapters 12 and 13, scored by code with no model (infrastructure;
the chapters use these, they teach LoRA and DPO).

- Chapter 12's task, pig latin, a dialect made by rules: ``pig_latin_word``, ``pig_latin``
  and ``pig_latin_score(text, vocabulary)``, the share of a text's words that are the pig
  latin of a known word.
- Chapter 13's preferred attribute, a text that speaks of love: ``TARGET_WORDS`` and
  ``uses_target(text)``.
- ``words(text)``: the words of a text as both tasks count them.
"""
import re

_WORD = re.compile(r"[A-Za-z]+")


def words(text: str) -> list[str]:
    """The words of ``text``, lower-cased: its runs of ASCII letters (an apostrophe splits a word)."""
    return [word.lower() for word in _WORD.findall(text)]


def pig_latin_word(word: str) -> str:
    """One word (ASCII letters) in pig latin: a word that starts with a vowel gets "way"
    ("art" → "artway"); otherwise its leading consonants move to the end, followed by "ay"
    ("thou" → "outhay"; a word without a, e, i, o, u treats y as its vowel: "thy" → "ythay").
    A capitalized word stays capitalized, an upper-case one (of two letters or more) upper-case."""
    if not _WORD.fullmatch(word):
        raise ValueError(f"word must be a run of ASCII letters, got {word!r}")
    lower = word.lower()
    if lower[0] in "aeiou":
        out = lower + "way"
    else:
        onset = next((i for i, letter in enumerate(lower) if letter in "aeiou"), None)
        if onset is None:
            y = lower.find("y", 1)
            onset = y if y > 0 else len(lower)
        out = lower[onset:] + lower[:onset] + "ay"
    if word.isupper() and len(word) > 1:
        return out.upper()
    return out.capitalize() if word[0].isupper() else out


def pig_latin(text: str) -> str:
    """``text`` with every word (run of ASCII letters) in pig latin (``pig_latin_word``), the rest as it was."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _WORD.sub(lambda match: pig_latin_word(match.group(0)), text)


def pig_latin_score(text: str, vocabulary) -> float:
    """The share of the words of ``text`` that are the pig latin of a word in ``vocabulary``.

    vocabulary: lower-case plain words (for example ``set(words(training_text))``). A text
    without words scores 0. Computed by code, with no model: the task score of the chapter's
    fine-tune, 1 for a perfect pig latin text of known words.
    """
    targets = {pig_latin_word(word) for word in vocabulary}
    found = words(text)
    return sum(word in targets for word in found) / len(found) if found else 0.0


TARGET_WORDS = frozenset({"love", "loves", "loved", "lover", "lovers", "lovely", "loving", "lovest", "loveth"})
"""The preferred attribute: a response that uses one of these words (``uses_target``)."""


def uses_target(text: str, target=TARGET_WORDS) -> bool:
    """True when ``text`` uses one of the words of ``target`` (lower-case; case is ignored).

    Words are runs of ASCII letters (``words``), so "love's" uses "love" and
    "glove" does not. The chapter's preferred attribute, scored by code, with no model.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    target = frozenset(target)
    return any(word in target for word in words(text))
