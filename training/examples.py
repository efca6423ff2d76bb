"""Training rows: a synthetic copy curriculum, then natural code mixed with rewrite and FIM examples.

Every row is T+1 token ids plus a loss mask; all randomness comes from one seeded ``random.Random``
so a run is reproducible. Copying ("induction") forms late if it must be learned together with a
4k vocabulary, so the curriculum first copies random spans over a small vocabulary, then widens it.
"""

from __future__ import annotations

import keyword
import random
import re
from dataclasses import dataclass

from codespec.core import prompts

IGNORE = -100
_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z_0-9]*\b")
_NUMBER = re.compile(r"\b\d+\b")
_RESERVED = set(keyword.kwlist) | {"self", "cls", "True", "False", "None", "print", "len", "range"}


@dataclass
class Row:
    ids: list[int]  # T + 1 tokens
    targets: list[int]  # T + 1 tokens; IGNORE where no loss


class ExampleMaker:
    """Builds rows of each kind from the training files (pure given its ``random.Random``)."""

    def __init__(
        self,
        tokenizer,
        files: list[str],
        functions: list[str],
        stream: list[int],
        frequent_ids: list[int],
        rng: random.Random,
    ) -> None:
        self.tokenizer = tokenizer
        self.files = files
        self.functions = functions
        self.stream = stream  # all training files, EOS-separated
        self.frequent_ids = frequent_ids  # non-special ids, most frequent first
        self.rng = rng
        self.eos_id = tokenizer.eos_token_id
        self.original_header = self.encode(prompts.ORIGINAL_HEADER)
        self.edited_header = self.encode(prompts.EDITED_HEADER)
        self.file_lines = [f.splitlines(keepends=True) for f in files]
        self.copy_span = (10, 60)  # synthetic copy span lengths; the copy-rescue phase lengthens them

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    # -- rows ---------------------------------------------------------------------------------
    def row(self, kind: str, length: int, vocab: int = 64) -> Row:
        if kind == "natural":
            start = self.rng.randrange(0, len(self.stream) - length - 1)
            window = self.stream[start : start + length + 1]
            return Row(window, list(window))
        ids: list[int] = []
        targets: list[int] = []
        while len(ids) < length + 1:
            if kind == "copy":
                example, mask = self.synthetic_copy(vocab)
            elif kind == "identity":
                example, mask = self.identity_row()
            elif kind == "fim_middle":
                example, mask = self.fim_middle_row()
            elif kind == "plain_copy":
                example, mask = self.plain_copy_row()
            elif kind == "fim_repeat":
                example, mask = self.fim_repeat_row()
            else:
                text = {"rewrite": self.rewrite_text, "identity": self.identity_text, "fim": self.fim_text}[kind]()
                example = self.encode(text)
                mask = example
            ids += example
            targets += mask
        return Row(ids[: length + 1], targets[: length + 1])

    def synthetic_copy(self, vocab: int) -> tuple[list[int], list[int]]:
        """Random span, rewrite separator, the same span, EOS; loss only where copying is possible."""
        span_len = self.rng.randint(*self.copy_span)
        pool = self.frequent_ids[:vocab]
        span = [self.rng.choice(pool) for _ in range(span_len)]
        ids = [*self.original_header, *span, *self.edited_header, *span, self.eos_id]
        prefix = len(self.original_header) + span_len
        targets = [IGNORE] * prefix + ids[prefix:]
        return ids, targets

    def plain_copy_row(self) -> tuple[list[int], list[int]]:
        """Text that repeats without any template, as code does: a region, one or two blank lines, then
        the same region again or a near-copy (an identifier renamed throughout, as a sibling function
        or class would have it); loss on the repetition only. Real code models copy like this
        (induction over plain context), which is what makes lookup drafts acceptable outside the
        rewrite template."""
        first, second = self.repeated_regions()
        head = self.encode(first + "\n" * self.rng.randint(1, 2))
        ids = head + self.encode(second) + [self.eos_id]
        keep = len(head) - 1  # BPE may merge across the boundary: start the loss a token early
        return ids, [IGNORE] * keep + ids[keep:]

    def repeated_regions(self) -> tuple[str, str]:
        """A region and its repetition as ``plain_copy_row`` makes them: the same text, or a near-copy
        with one identifier renamed throughout (40%)."""
        first = self.region()
        second = first
        if self.rng.random() < 0.4:
            names = sorted({m.group() for m in _IDENTIFIER.finditer(first)} - _RESERVED)
            if names:
                old = self.rng.choice(names)
                second = re.sub(rf"\b{re.escape(old)}\b", self.new_name(old), first)
        return first, second

    def fim_repeat_row(self) -> tuple[list[int], list[int]]:
        """A FIM example whose context repeats code: a region, blank lines, then its repetition with
        a gap (``fim_parts``) in it; loss on the middle and its end token only. The middle can be
        copied from the earlier region, so copying from context and filling a gap ask for the same
        answer, and the gap's bounds (stop at the suffix) are kept while copying."""
        first, second = self.repeated_regions()
        prefix, middle, suffix = self.fim_parts(second)
        prompt = self.encode(prompts.fim_prompt(first + "\n" * self.rng.randint(1, 2) + prefix, suffix))
        ids = prompt + self.encode(middle + prompts.END_OF_TEXT)
        return ids, [IGNORE] * len(prompt) + ids[len(prompt) :]

    # -- text examples --------------------------------------------------------------------------
    def region(self, max_chars: int = 600) -> str:
        """A dedented function (half the time) or a run of whole lines from a training file."""
        if self.functions and self.rng.random() < 0.5:
            body = self.rng.choice(self.functions)
            if len(body) <= max_chars:
                return body
        lines = self.rng.choice(self.file_lines)
        start = self.rng.randrange(len(lines))
        count = self.rng.randint(2, 25)
        chunk: list[str] = []
        size = 0
        for line in lines[start : start + count]:
            if size + len(line) > max_chars and chunk:
                break
            chunk.append(line)
            size += len(line)
        text = "".join(chunk)
        return text if text.endswith("\n") else text + "\n"

    def rewrite_text(self) -> str:
        original = self.region()
        if self.rng.random() < 0.5:
            return prompts.rewrite_example(original, original)
        edited, instruction = self.edit(original)
        return prompts.rewrite_example(original, edited, instruction)

    def identity_row(self) -> tuple[list[int], list[int]]:
        """An unchanged rewrite with loss only on the copy (and its end token): all signal is copying."""
        original = self.region()
        prompt = self.encode(prompts.rewrite_prompt(original))
        ids = self.encode(prompts.rewrite_example(original, original))
        keep = len(prompt) - 1  # BPE may merge across the boundary: start the loss a token early
        return ids, [IGNORE] * keep + ids[keep:]

    def identity_text(self) -> str:
        """A rewrite example with no instruction: the edited region is the original, unchanged."""
        original = self.region()
        return prompts.rewrite_example(original, original)

    def edit(self, original: str) -> tuple[str, str | None]:
        """A small synthetic edit and an instruction that says what it is."""
        lines = original.splitlines(keepends=True)
        choice = self.rng.random()
        names = sorted({m.group() for m in _IDENTIFIER.finditer(original)} - _RESERVED)
        if choice < 0.35 and names:
            old = self.rng.choice(names)
            new = self.new_name(old)
            return re.sub(rf"\b{re.escape(old)}\b", new, original), f"rename {old} to {new}"
        index = self.rng.randrange(len(lines))
        line = lines[index]
        if choice < 0.55 and len(lines) > 1 and line.strip():
            return "".join(lines[:index] + lines[index + 1 :]), f"delete the line: {line.strip()}"
        if choice < 0.8:
            donor = self.rng.choice(self.rng.choice(self.file_lines) or ["pass\n"]).strip() or "pass"
            indent = line[: len(line) - len(line.lstrip())].rstrip("\n")
            new_line = indent + donor + "\n"
            anchor = line.strip() or "(blank line)"
            return (
                "".join(lines[: index + 1] + [new_line] + lines[index + 1 :]),
                f"add the line `{donor}` after `{anchor}`",
            )
        changed = self.change_line(line)
        return (
            "".join(lines[:index] + [changed] + lines[index + 1 :]),
            f"change `{line.strip()}` to `{changed.strip()}`",
        )

    def new_name(self, old: str) -> str:
        style = self.rng.randrange(4)
        if style == 0:
            return "new_" + old
        if style == 1:
            return old + "_" + self.rng.choice(["value", "item", "2", "list", "obj"])
        if style == 2:
            return self.rng.choice(["result", "data", "node", "value", "key", "items", "name", "count"])
        return old[:1] + "".join(self.rng.sample("abcdefghijklmnopqrstuvwxyz", 3))

    def change_line(self, line: str) -> str:
        if _NUMBER.search(line):
            return _NUMBER.sub(lambda m: str(int(m.group()) + self.rng.randint(1, 9)), line, count=1)
        names = [m for m in _IDENTIFIER.finditer(line) if m.group() not in _RESERVED]
        if names:
            m = self.rng.choice(names)
            return line[: m.start()] + self.new_name(m.group()) + line[m.end() :]
        return line.rstrip("\n") + "  # changed\n"

    def fim_text(self) -> str:
        """Prefix-suffix-middle: one whole line (mostly), the rest of a line, or a few lines."""
        text = self.region(max_chars=800)
        lines = text.splitlines(keepends=True)
        if len(lines) < 2:
            return prompts.fim_example(text, "", "")
        choice = self.rng.random()
        index = self.rng.randrange(len(lines))
        if choice < 0.6:
            middle_lines = 1
        elif choice < 0.8:
            middle_lines = self.rng.randint(2, 5)
        else:
            line = lines[index]
            cut = self.rng.randrange(len(line))
            prefix = "".join(lines[:index]) + line[:cut]
            return prompts.fim_example(prefix, line[cut:], "".join(lines[index + 1 :]))
        prefix = "".join(lines[:index])
        middle = "".join(lines[index : index + middle_lines])
        suffix = "".join(lines[index + middle_lines :])
        return prompts.fim_example(prefix, middle, suffix)

    def fim_middle_row(self) -> tuple[list[int], list[int]]:
        """A FIM example with the loss on the middle and its end token only (the finishing phase).

        In ``fim_text`` rows the loss covers the whole text, so only a few percent of their tokens
        teach filling a gap, and a cursor never has text after it on its line there."""
        prefix, middle, suffix = self.fim_parts(self.region(max_chars=800))
        prompt = self.encode(prompts.fim_prompt(prefix, suffix))
        ids = prompt + self.encode(middle + prompts.END_OF_TEXT)  # FIM_MIDDLE is special: a clean split
        return ids, [IGNORE] * len(prompt) + ids[len(prompt) :]

    def fim_parts(self, text: str) -> tuple[str, str, str]:
        """Prefix, middle, suffix as an editor's cursor makes them: half the time one whole non-blank
        line is missing (the evaluation's case), sometimes a few lines; otherwise the cursor sits
        inside a line (after its indentation, or after some of its code) and the middle runs to the
        end of that line (the suffix starts with its newline, as in ``service.inline``) or stops before
        code that follows the cursor on the line."""
        lines = text.splitlines(keepends=True)
        filled = [i for i, line in enumerate(lines) if line.strip()]
        if not filled:
            return text, "", ""
        index = self.rng.choice(filled)
        line = lines[index]
        before, after = "".join(lines[:index]), "".join(lines[index + 1 :])
        choice = self.rng.random()
        if choice < 0.5:
            return before, line, after
        if choice < 0.62:
            count = self.rng.randint(2, 4)
            return before, "".join(lines[index : index + count]), "".join(lines[index + count :])
        body = line.rstrip("\r\n")
        indent = len(body) - len(body.lstrip())
        start = indent if self.rng.random() < 0.25 else self.rng.randrange(indent, len(body))
        end = len(body) if self.rng.random() < 0.6 else self.rng.randint(start + 1, len(body))
        return before + line[:start], line[start:end], line[end:] + after
