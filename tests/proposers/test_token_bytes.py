"""Token ids <-> bytes: a text read from where it lies in a token sequence (a prompt's code)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from codespec.core.default_model import target_path
from codespec.core.prompts import detect_format, prompt_code
from codespec.proposers.token_bytes import TokenBytes, vocabulary

CODE = 'def greet(name: str) -> str:\n    """Say hello: «é» 漢字."""\n    return f"hello {name}"\n'


@pytest.fixture(scope="module")
def shipped():
    tokenizer = AutoTokenizer.from_pretrained(target_path())
    return tokenizer, TokenBytes(tokenizer)


def chat_prompt(tokenizer, code: str) -> list[int]:
    """A rewrite prompt as a chat client sends one (a fenced block), after a special token."""
    return [tokenizer.eos_token_id, *tokenizer.encode(f"Rewrite the code unchanged.\n```python\n{code}```\n")]


@pytest.mark.parametrize("code", [CODE, "    indented = 1\n" + CODE, "x\n", "\n\n" + CODE])
def test_a_prompt_s_code_is_read_from_the_prompt_s_tokens(shipped, code):
    """What the drafter passes the copy pointer instead of encoding the code again: the ids spell
    the code exactly, and the tokens wholly inside it are the prompt's own."""
    tokenizer, codec = shipped
    prompt = chat_prompt(tokenizer, code)
    found = prompt_code(tokenizer.decode(prompt, skip_special_tokens=False), detect_format(tokenizer))
    assert found == code
    ids = codec.spelled_in(prompt, found)
    assert ids is not None and codec.join(ids) == code.encode("utf-8")
    if len(ids) > 2:
        middle = ids[1:-1]
        assert any(prompt[n : n + len(middle)] == middle for n in range(len(prompt)))


def test_text_the_tokens_do_not_spell_plainly_is_left_to_the_encoder(shipped):
    tokenizer, codec = shipped
    prompt = chat_prompt(tokenizer, CODE)
    assert codec.spelled_in(prompt, "not in the prompt") is None
    assert codec.spelled_in(prompt, "") is None
    # across a special token: the bytes are there (a special token spells none), the text is not
    special = tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id)
    assert codec.spelled_in([*prompt, tokenizer.eos_token_id, *tokenizer.encode("tail")], "\ntail") is None
    assert special not in tokenizer.decode(prompt[1:])


def test_special_tokens_at_the_text_s_edges_are_not_part_of_it(shipped):
    """codespec's own rewrite layout puts the code between ``<|file_sep|>`` tokens (no bytes)."""
    tokenizer, codec = shipped
    special = tokenizer.convert_tokens_to_ids("<|file_sep|>")
    code_ids = tokenizer.encode(CODE)
    assert codec.spelled_in([special, *code_ids, special, *tokenizer.encode("edited.py\n")], CODE) == code_ids


def test_a_special_token_inside_the_text_is_not_skipped(shipped):
    """Only a special token at the text's very edge is left out: one inside it leaves the tokens
    unable to spell it plainly."""
    tokenizer, codec = shipped
    eos = tokenizer.eos_token_id
    ids = [*tokenizer.encode("alpha"), eos, *tokenizer.encode("beta")]
    assert codec.join(ids) == b"alphabeta"
    assert codec.spelled_in(ids, "alphabet") is None
    assert codec.spelled_in(ids, "alpha") == tokenizer.encode("alpha")


def test_one_tokenizer_s_vocabulary_is_worked_out_once_and_filled_ahead():
    """Every copy pointer of a tokenizer shares its table of token bytes and its special ids (a
    request's first step reads neither from the tokenizer again); ``fill`` puts every token's bytes
    in that table, each what the token spells on its own."""
    tokenizer = AutoTokenizer.from_pretrained(target_path())  # its own instance: a table not yet filled
    first, second = TokenBytes(tokenizer), TokenBytes(tokenizer)
    assert vocabulary(tokenizer) is vocabulary(tokenizer)
    assert first._table is second._table and first._special == frozenset(tokenizer.all_special_ids)
    assert len(first._table) < len(tokenizer)
    first.fill()
    table = vocabulary(tokenizer).table
    assert len(table) == len(tokenizer)
    ids = tokenizer.encode(CODE)
    assert b"".join(table[token] for token in ids) == CODE.encode()
    assert all(table[token] == b"" for token in tokenizer.all_special_ids)
