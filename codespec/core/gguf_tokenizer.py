"""A GGUF file's tokenizer, twice: llama.cpp's own (``LlamaVocab``: what the target encodes prompts
with and decodes output with, so the ids are exactly llama.cpp's), and the same vocabulary as a
transformers fast tokenizer (transformers converts a GGUF's tokenizer itself) for everything that
reads a vocabulary: prompt formats, the index, the byte tables of the lookup proposers, chat
templates. ``agreement`` checks at load that both split a probe text alike (docs/gguf.md,
"Tokenizer").
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codespec.core.prompts import FORMATS, PromptFormat, resolve_format

log = logging.getLogger(__name__)

# Code and prose with the cases byte-level BPEs get wrong when they differ: runs of spaces,
# newlines, digits, non-ASCII, a special token in the text.
PROBE_TEXT = (
    "def área(x: int) -> str:\n    return f'{x:>10}'  # 1234567 日本語\n\n\n\tif  a != b:\n"
    "        pass\r\n<|endoftext|>class Ünïcode:  ...\n"
)


class LlamaVocab:
    """llama.cpp's tokenizer for one loaded model: text <-> ids, exactly as llama.cpp does it."""

    def __init__(self, lib: Any, model: Any) -> None:
        self._lib = lib
        self._vocab = lib.llama_model_get_vocab(model)
        self.size = int(lib.llama_vocab_n_tokens(self._vocab))
        self._pieces: dict[int, bytes] = {}

    def encode(self, text: str) -> list[int]:
        """Special tokens written in the text are parsed as such (prompt formats spell them)."""
        data = text.encode("utf-8", "surrogatepass")
        capacity = len(data) + 8
        buffer = (self._lib.llama_token * capacity)()
        count = self._lib.llama_tokenize(self._vocab, data, len(data), buffer, capacity, False, True)
        if count < 0:  # more tokens than bytes cannot happen for BPE, but SPM can add a prefix
            capacity = -count
            buffer = (self._lib.llama_token * capacity)()
            count = self._lib.llama_tokenize(self._vocab, data, len(data), buffer, capacity, False, True)
        return list(buffer[:count])

    def piece(self, token_id: int) -> bytes:
        """The bytes a token stands for; control tokens (special) stand for none."""
        cached = self._pieces.get(token_id)
        if cached is None:
            buffer = ctypes.create_string_buffer(64)
            length = self._lib.llama_token_to_piece(self._vocab, token_id, buffer, 64, 0, False)
            if length < 0:
                buffer = ctypes.create_string_buffer(-length)
                length = self._lib.llama_token_to_piece(self._vocab, token_id, buffer, -length, 0, False)
            cached = buffer.raw[:length]
            self._pieces[token_id] = cached
        return cached

    def decode(self, token_ids: Sequence[int]) -> str:
        return b"".join(self.piece(int(t)) for t in token_ids).decode("utf-8", "replace")

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token_id))

    def special(self, name: str) -> int | None:
        """A special id from the GGUF metadata (``eos``, ``eot``, ``fim_pre``, ...), None if unset."""
        value = int(getattr(self._lib, f"llama_vocab_{name}")(self._vocab))
        return value if 0 <= value < self.size else None


def transformers_tokenizer(path: Path, chat_template: str | None) -> Any:
    """The GGUF's tokenizer converted by transformers (it reads the file with gguf-py)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    if chat_template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = chat_template
    return tokenizer


def agreement(vocab: LlamaVocab, tokenizer: Any, text: str = PROBE_TEXT) -> bool:
    """Whether llama.cpp and the converted tokenizer give the same ids for ``text``."""
    return vocab.encode(text) == list(tokenizer.encode(text, add_special_tokens=False))


def gguf_prompt_format(tokenizer: Any, vocab: LlamaVocab, name: str | None) -> PromptFormat:
    """The family's format, detected from token names as for a transformers checkpoint; where no
    family matches but the GGUF names FIM tokens (``tokenizer.ggml.fim_*_token_id``), a format
    spelled with those tokens."""
    spec = resolve_format(tokenizer, name)
    if spec is not FORMATS["plain"] or name not in (None, "", "auto"):
        return spec
    ids = [vocab.special(kind) for kind in ("fim_pre", "fim_suf", "fim_mid")]
    if any(index is None for index in ids):
        return spec
    tokens = tuple(tokenizer.convert_ids_to_tokens([int(i) for i in ids if i is not None]))
    ends = tuple(
        tokenizer.convert_ids_to_tokens(int(i))
        for i in (vocab.special("eos"), vocab.special("eot"), vocab.special("fim_pad"))
        if i is not None
    )
    file_sep = vocab.special("fim_sep")
    return PromptFormat(
        "gguf-fim",
        (tokens[0], tokens[1], tokens[2]),
        ends,
        tokenizer.convert_ids_to_tokens(file_sep) if file_sep is not None else None,
    )
