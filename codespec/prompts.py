"""The prompt formats, defined once: FIM for inline completion and the rewrite template for edits.

Both use special tokens that Qwen2.5-Coder's tokenizer also has (``<|fim_prefix|>``,
``<|fim_suffix|>``, ``<|fim_middle|>``, ``<|file_sep|>``, ``<|endoftext|>``), so one template serves
the shipped default model (trained on exactly these formats) and Qwen2.5-Coder-style checkpoints.

- FIM (prefix-suffix-middle order, as Qwen2.5-Coder): the model writes the middle, then ends.
- Rewrite: the original region as one "file", an optional instruction as another, then the
  header of the edited file; the model writes the edited region and ends. With no instruction
  the default model copies its input exactly (as "fast apply" models do), so the original region
  is the natural reference draft for the copy pointer.

Generation ends at an end-of-text token (the model's EOS) or at any of ``END_MARKERS``; a real
checkpoint may end an edited file with ``<|file_sep|>`` instead of EOS, so callers that stop on
token ids should use ``stop_token_ids(tokenizer)``.
"""

from __future__ import annotations

FIM_PREFIX = "<|fim_prefix|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_PAD = "<|fim_pad|>"
END_OF_TEXT = "<|endoftext|>"
FILE_SEP = "<|file_sep|>"
REPO_NAME = "<|repo_name|>"

# Every special token the default tokenizer defines (END_OF_TEXT first: it is id 0 and the EOS).
SPECIAL_TOKENS = (END_OF_TEXT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME, FILE_SEP)
# Tokens after which the model's output is over (for both prompt formats).
END_MARKERS = (END_OF_TEXT, FILE_SEP, FIM_PAD)

ORIGINAL_HEADER = f"{FILE_SEP}original.py\n"
INSTRUCTION_HEADER = f"{FILE_SEP}instruction.txt\n"
EDITED_HEADER = f"{FILE_SEP}edited.py\n"


def fim_prompt(prefix: str, suffix: str) -> str:
    """Fill-in-the-middle prompt: the model continues with the text between ``prefix`` and ``suffix``."""
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"


def rewrite_prompt(original: str, instruction: str | None = None) -> str:
    """Edit prompt: the model continues with ``original`` rewritten (copied when no instruction)."""
    parts = [ORIGINAL_HEADER, original]
    if instruction:
        parts += [INSTRUCTION_HEADER, instruction.strip(), "\n"]
    parts.append(EDITED_HEADER)
    return "".join(parts)


def fim_example(prefix: str, middle: str, suffix: str) -> str:
    """A full FIM training text: the prompt, the answer, the end token."""
    return fim_prompt(prefix, suffix) + middle + END_OF_TEXT


def rewrite_example(original: str, edited: str, instruction: str | None = None) -> str:
    """A full rewrite training text: the prompt, the edited region, the end token."""
    return rewrite_prompt(original, instruction) + edited + END_OF_TEXT


def stop_token_ids(tokenizer) -> frozenset[int]:
    """Ids of ``END_MARKERS`` that ``tokenizer`` knows as single tokens (plus its EOS)."""
    ids = set()
    vocab = tokenizer.get_vocab()
    for marker in END_MARKERS:
        if marker in vocab:
            ids.add(int(vocab[marker]))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def cut_at_end_marker(text: str) -> str:
    """``text`` up to the first end marker (for decoded text that kept special tokens)."""
    cut = len(text)
    for marker in END_MARKERS:
        index = text.find(marker)
        if index != -1:
            cut = min(cut, index)
    return text[:cut]
