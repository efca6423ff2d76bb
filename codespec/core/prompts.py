"""Prompt formats, defined once: fill-in-the-middle for completions, a rewrite layout for edits.

A request carries *what* it asks (``Fim``: the text before and after the cursor; ``Rewrite``: a
region and an optional instruction; or a plain string sent as it is); the target's
``PromptFormat`` says *how* its family spells it (docs/prompt-formats.md):

- ``qwen2.5-coder`` (the shipped default model is trained on exactly this): ``<|fim_prefix|>``
  prefix ``<|fim_suffix|>`` suffix ``<|fim_middle|>``; rewrites as repository files
  (``<|file_sep|>original.py`` ... ``<|file_sep|>edited.py``), after which the model copies the
  region (changed as the instruction says) and ends.
- ``starcoder2``: the same layout with ``<fim_prefix>`` ... and ``<file_sep>``.
- ``deepseek-coder``: ``<｜fim▁begin｜>`` prefix ``<｜fim▁hole｜>`` suffix ``<｜fim▁end｜>``,
  after the BOS token the model was trained with.
- ``codellama``: ``▁<PRE> prefix ▁<SUF>suffix ▁<MID>`` after the BOS, ending at ``▁<EOT>``.
- ``plain``: no FIM tokens; a completion is the prefix alone.

A rewrite uses the tokenizer's chat template when it has one (an instruct checkpoint): the region
goes in a fenced block of the user turn and the assistant turn is opened with a fence, so the
answer is the code and ends at the closing fence. Otherwise the family's file layout (or, for
families without file separators, a plain-text layout) is used.

Generation ends at the model's EOS, at any end marker of the format, and at the stops a rendered
prompt adds (the closing fence of a chat rewrite).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from codespec.core.errors import InvalidRequestError

# The shipped default model's special tokens (Qwen2.5-Coder's names).
FIM_PREFIX = "<|fim_prefix|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_PAD = "<|fim_pad|>"
END_OF_TEXT = "<|endoftext|>"
FILE_SEP = "<|file_sep|>"
REPO_NAME = "<|repo_name|>"

# Every special token the default tokenizer defines (END_OF_TEXT first: it is id 0 and the EOS).
SPECIAL_TOKENS = (END_OF_TEXT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME, FILE_SEP)
# Tokens after which the default model's output is over (for both prompt kinds).
END_MARKERS = (END_OF_TEXT, FILE_SEP, FIM_PAD)

ORIGINAL_HEADER = f"{FILE_SEP}original.py\n"
INSTRUCTION_HEADER = f"{FILE_SEP}instruction.txt\n"
EDITED_HEADER = f"{FILE_SEP}edited.py\n"

CHAT_FENCE = "```"
DEFAULT_INSTRUCTION = "Rewrite this code. Change only what is needed; keep everything else exactly as it is."


@dataclass(frozen=True)
class Fim:
    """Complete at a cursor: the text before it and the text after it (each already windowed)."""

    prefix: str
    suffix: str


@dataclass(frozen=True)
class Rewrite:
    """Rewrite ``original`` (a region of a file), following ``instruction`` if there is one."""

    original: str
    instruction: str | None = None


Prompt = str | Fim | Rewrite  # a str is sent to the model as it is


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    stop: tuple[str, ...] = ()  # stop strings this rendering adds (a chat rewrite's closing fence)


@dataclass(frozen=True)
class PromptFormat:
    """How one model family spells FIM and rewrites (token strings as its vocabulary has them)."""

    name: str
    fim_tokens: tuple[str, str, str] | None  # prefix, suffix, middle markers (prefix-suffix-middle order)
    end_markers: tuple[str, ...]
    file_sep: str | None = None  # repository-file separator for the rewrite layout
    bos: bool = False  # the family was trained with a BOS token in front of every prompt
    spaced: bool = False  # CodeLlama: "<PRE> {prefix} <SUF>{suffix} <MID>"

    def fim(self, prefix: str, suffix: str) -> str:
        if self.fim_tokens is None:
            return prefix  # plain: prefix-only completion
        start, hole, middle = self.fim_tokens
        if self.spaced:
            return f"{start} {prefix} {hole}{suffix} {middle}"
        return f"{start}{prefix}{hole}{suffix}{middle}"

    def rewrite(self, original: str, instruction: str | None = None) -> str:
        """The rewrite layout without a chat template."""
        if self.file_sep is None:
            note = f"# Instruction: {instruction.strip()}\n" if instruction and instruction.strip() else ""
            return f"# Original:\n{original}\n{note}# Rewritten:\n"
        sep = self.file_sep
        parts = [f"{sep}original.py\n", original]
        if instruction:
            parts += [f"{sep}instruction.txt\n", instruction.strip(), "\n"]
        parts.append(f"{sep}edited.py\n")
        return "".join(parts)


FORMATS: dict[str, PromptFormat] = {
    "qwen2.5-coder": PromptFormat(
        "qwen2.5-coder",
        (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE),
        (END_OF_TEXT, FILE_SEP, FIM_PAD, REPO_NAME, "<|im_end|>"),
        FILE_SEP,
    ),
    "starcoder2": PromptFormat(
        "starcoder2",
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        ("<|endoftext|>", "<file_sep>", "<fim_pad>", "<repo_name>"),
        "<file_sep>",
    ),
    "deepseek-coder": PromptFormat(
        "deepseek-coder",
        ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
        ("<｜end▁of▁sentence｜>", "<|EOT|>"),
        bos=True,
    ),
    "codellama": PromptFormat("codellama", ("▁<PRE>", "▁<SUF>", "▁<MID>"), ("▁<EOT>", "</s>"), bos=True, spaced=True),
    "plain": PromptFormat("plain", None, ()),
}
FORMAT_NAMES = tuple(FORMATS)
DEFAULT_FORMAT = FORMATS["qwen2.5-coder"]


def detect_format(tokenizer: Any) -> PromptFormat:
    """The family whose FIM tokens this tokenizer has as single tokens; ``plain`` when none."""
    vocab = tokenizer.get_vocab()
    for spec in FORMATS.values():
        if spec.fim_tokens is not None and all(token in vocab for token in spec.fim_tokens):
            return spec
    return FORMATS["plain"]


def resolve_format(tokenizer: Any, name: str | None = None) -> PromptFormat:
    """``name`` (an override; "auto" or None: detect from the tokenizer)."""
    if name in (None, "", "auto"):
        return detect_format(tokenizer)
    if name not in FORMATS:
        raise InvalidRequestError(f"unknown prompt format {name!r}; use auto or one of {', '.join(FORMAT_NAMES)}")
    return FORMATS[name]


class PromptRenderer:
    """Renders request prompts for one target: its family format, its BOS and chat template."""

    def __init__(self, tokenizer: Any, spec: PromptFormat) -> None:
        self.tokenizer = tokenizer
        self.format = spec
        self.bos = (getattr(tokenizer, "bos_token", None) or "") if spec.bos else ""
        self.chat = bool(getattr(tokenizer, "chat_template", None))

    @cached_property
    def end_markers(self) -> tuple[str, ...]:
        """The format's end markers this tokenizer knows (once: building a vocabulary took ~1.5 ms
        of every request's start with a 150k-token tokenizer)."""
        vocab = self.tokenizer.get_vocab()
        return tuple(marker for marker in self.format.end_markers if marker in vocab)

    def render(self, prompt: Prompt) -> RenderedPrompt:
        if isinstance(prompt, str):
            return RenderedPrompt(prompt)
        if isinstance(prompt, Fim):
            return RenderedPrompt(self.bos + self.format.fim(prompt.prefix, prompt.suffix))
        if isinstance(prompt, Rewrite):
            if self.chat:
                return self._chat_rewrite(prompt)
            return RenderedPrompt(self.bos + self.format.rewrite(prompt.original, prompt.instruction))
        raise TypeError(f"not a prompt: {type(prompt).__name__}")

    def _chat_rewrite(self, prompt: Rewrite) -> RenderedPrompt:
        instruction = (prompt.instruction or "").strip() or DEFAULT_INSTRUCTION
        body = prompt.original if prompt.original.endswith("\n") else prompt.original + "\n"
        messages = [{"role": "user", "content": f"{instruction}\n\n{CHAT_FENCE}\n{body}{CHAT_FENCE}"}]
        head = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return RenderedPrompt(f"{head}{CHAT_FENCE}\n", (CHAT_FENCE,))

    def stop_token_ids(self) -> frozenset[int]:
        """Ids of the format's end markers this tokenizer has as single tokens, plus its EOS."""
        return stop_token_ids(self.tokenizer, self.format.end_markers)


def fim_prompt(prefix: str, suffix: str) -> str:
    """The default model's fill-in-the-middle prompt: it continues with the text between the two."""
    return DEFAULT_FORMAT.fim(prefix, suffix)


def rewrite_prompt(original: str, instruction: str | None = None) -> str:
    """The default model's edit prompt: it continues with ``original`` rewritten (copied when no instruction)."""
    return DEFAULT_FORMAT.rewrite(original, instruction)


def fim_example(prefix: str, middle: str, suffix: str) -> str:
    """A full FIM training text: the prompt, the answer, the end token."""
    return fim_prompt(prefix, suffix) + middle + END_OF_TEXT


def rewrite_example(original: str, edited: str, instruction: str | None = None) -> str:
    """A full rewrite training text: the prompt, the edited region, the end token."""
    return rewrite_prompt(original, instruction) + edited + END_OF_TEXT


def stop_token_ids(tokenizer: Any, markers: tuple[str, ...] = END_MARKERS) -> frozenset[int]:
    """Ids of ``markers`` that ``tokenizer`` knows as single tokens (plus its EOS)."""
    ids = set()
    vocab = tokenizer.get_vocab()
    for marker in markers:
        if marker in vocab:
            ids.add(int(vocab[marker]))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def cut_at_end_marker(text: str, markers: tuple[str, ...] = END_MARKERS) -> str:
    """``text`` up to the first end marker (for decoded text that kept special tokens)."""
    cut = len(text)
    for marker in markers:
        index = text.find(marker)
        if index != -1:
            cut = min(cut, index)
    return text[:cut]


def rewrite_endings(spec: PromptFormat) -> tuple[str, ...]:
    """How a rewrite prompt ends in each layout ``prompt_code`` reads: a prompt that ends otherwise
    and has no code fence in it carries no code."""
    own = (f"{spec.file_sep}edited.py\n",) if spec.file_sep is not None else ()
    return (*own, "# Rewritten:\n")


def prompt_code(text: str, spec: PromptFormat) -> str | None:
    """The code a prompt asks to be rewritten, read back from its text (what a proposer drafts
    from when it sees only the prompt, as inside vLLM): the original of a rewrite in ``spec``'s
    layout, else the last fenced code block (a chat rewrite, an OpenAI client's "fix this: ```...```").
    None when the prompt carries no such code."""
    if spec.file_sep is not None and text.endswith(f"{spec.file_sep}edited.py\n"):
        start = text.rfind(f"{spec.file_sep}original.py\n")
        if start >= 0:
            start += len(f"{spec.file_sep}original.py\n")
            return text[start : text.find(spec.file_sep, start)]
    if text.endswith("# Rewritten:\n") and "# Original:\n" in text:
        start = text.rfind("# Original:\n") + len("# Original:\n")
        end = text.rfind("\n# Instruction: ", start)
        return text[start : end if end >= 0 else len(text) - len("\n# Rewritten:\n")]
    fences = [m.start() for m in re.finditer(rf"^{CHAT_FENCE}[^\n]*\n?", text, re.MULTILINE)]
    if len(fences) < 2:
        return None
    pairs = len(fences) // 2  # fences open and close in turn; an opening one left over is the answer's
    opening, closing = fences[2 * pairs - 2], fences[2 * pairs - 1]
    return text[text.find("\n", opening) + 1 : closing]
