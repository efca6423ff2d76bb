"""The cheap lower bound on a text's tokens (no tokenizing) and the count in slices: the bound never
says more tokens than the tokenizer makes, on the texts that pack the most characters into a
token, and the count in slices stops early on an over-long text and agrees with the whole's."""

from __future__ import annotations

import random

import pytest

from codespec.service.engine.preparing import SLICE_CHARS, SLICE_MARGIN, TokenBound, count_exceeds, slices


@pytest.fixture(scope="module")
def shipped_tokenizer():
    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path

    return AutoTokenizer.from_pretrained(str(target_path()), local_files_only=True)


def dense_texts(tokenizer, rng: random.Random) -> list[str]:
    """Texts made of the vocabulary's longest entries (what a hostile client sends to slip past a
    bound), spaces, code and non-ASCII, seeded."""
    vocab = sorted(tokenizer.get_vocab(), key=len)[-64:]
    longest = [tokenizer.convert_tokens_to_string([token]) for token in vocab]
    pieces = [*longest, " " * 40, "\n" + " " * 39, "def f(x):\n    return x\n", "日本語", "ü", "\t\t", "<|fim_prefix|>"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 200))) for _ in range(300)]


def test_the_bound_never_exceeds_the_tokens_the_tokenizer_makes(shipped_tokenizer):
    bound = TokenBound.of(shipped_tokenizer)
    assert bound is not None and bound.chars_per_token == 41  # the shipped vocabulary's longest entry
    for text in dense_texts(shipped_tokenizer, random.Random(0)):
        assert bound.at_least(text) <= len(shipped_tokenizer.encode(text, add_special_tokens=False)), repr(text[:80])


def test_a_normalizing_tokenizer_gets_room_for_composed_characters():
    plain, normalizing = TokenBound(10), TokenBound(10, normalizes=True)
    assert plain.at_least("a" * 100) == normalizing.at_least("a" * 100) == 10
    assert normalizing.at_least("\u1100\u1161\u11a8" * 10) == 1 < plain.at_least("\u1100\u1161\u11a8" * 10)


def test_slices_cover_the_text_and_cut_at_line_starts():
    rng = random.Random(1)
    text = "".join(rng.choice(["def f():\n", "    x = 1\n", "\n", "y" * 50]) for _ in range(20_000))
    cuts = slices(text)
    assert "".join(text[start:end] for start, end in cuts) == text
    assert all(end - start <= SLICE_CHARS for start, end in cuts)
    assert all(text[end - 1] == "\n" and not text[end].isspace() for _, end in cuts[:-1])
    assert slices("no newline " * 5000)[0] == (0, SLICE_CHARS)  # none near: cut at the size


def test_counting_in_slices_stops_once_past_the_limit_and_agrees_with_the_whole(shipped_tokenizer):
    def encode(text: str) -> list[int]:
        seen.append(len(text))
        return shipped_tokenizer.encode(text, add_special_tokens=False)

    source = open(__file__).read()
    text = source * (400_000 // len(source))
    whole = len(shipped_tokenizer.encode(text, add_special_tokens=False))
    seen: list[int] = []
    counted = count_exceeds(encode, text, 1023)
    assert counted is not None and 1023 < counted <= whole
    assert sum(seen) <= 2 * SLICE_CHARS < len(text)  # a slice or two, not the whole text
    seen.clear()
    assert count_exceeds(encode, text, whole + SLICE_MARGIN * len(slices(text))) is None  # it fits: counted through
    assert sum(seen) == len(text)
    pieces = sum(len(shipped_tokenizer.encode(text[a:b], add_special_tokens=False)) for a, b in slices(text))
    assert abs(pieces - whole) <= SLICE_MARGIN * len(slices(text))
