"""A request's prompt, made ready before it reaches the engine thread: refused at once when it cannot
fit the context, else rendered and tokenized on one of two lanes.

**Refused at once** (:meth:`PromptPreparer.refusal`, on the caller's thread, no tokenizing): a
prompt or a reference draft with more characters than the model's context can hold at the most
characters a token of this tokenizer covers (:class:`TokenBound`). A prompt that passes that
bound but is still too long is found on its lane, by a count in slices that stops once the
context is passed, and its job fails there: it never waits for a place in the batch.

**Two lanes** (one thread each): prompts up to ``SMALL_PROMPT_CHARS`` characters (an editor's
completion, a short chat) on the small lane, larger ones and large opened documents on the large
lane. Each lane keeps arrival order; a big prompt's tokenizing never delays a small one
(tokenizers release the GIL while they work, so the lanes run side by side).

**The bound** (:class:`TokenBound`): what a prompt costs, known before paying for it. A token of a
given tokenizer covers at most as many characters as its longest vocabulary entry
spells (a byte-level BPE spells one character per byte, and a character is at least a byte; a
SentencePiece entry spells its characters; an added token its content). So a text of ``n``
characters is at least ``n / longest`` tokens, whatever it holds: a prompt over ``max_context *
longest`` characters is refused without tokenizing it (the shipped model: 41 characters a token,
1,024 positions, so 41,984 characters; qwen2.5-coder: 45 and 32,768). A normalizer may merge a
few characters into one (NFC composes a decomposed Hangul syllable from three), so a tokenizer
with one gets ``NORMALIZER_FACTOR`` times the room for text that is not ASCII.

Between that bound and the context, :func:`count_exceeds` tokenizes a long text a slice at a time
and stops once the count has passed the context, so an over-long prompt costs the tokenizing of
about a context's worth of text, not of all of it (nor the tokenizer's buffers for all of it).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codespec.core.errors import ContextLengthError
from codespec.core.prompts import Fim, Prompt, PromptRenderer, RenderedPrompt, Rewrite
from codespec.core.target import Target
from codespec.service.engine.jobs import PreparedPrompt
from codespec.service.engine.memory import LARGE_FREE_BYTES, release_free_memory
from codespec.service.requests.schema import GenerationRequest

SMALL_PROMPT_CHARS = 16_384  # a prompt up to this long is prepared on the small lane (~25 ms of tokenizing)
TOKENIZER_BYTES_PER_CHAR = 250  # what a fast tokenizer's buffers hold while it encodes a text, about
NORMALIZER_FACTOR = 3  # characters one normalized character may stand for (NFC: a Hangul L+V+T)
SLICE_CHARS = 16_384  # characters tokenized at a time when counting an over-long text (~10 ms)
SLICE_MARGIN = 8  # tokens a cut between slices may add to the count (cuts are at line starts)


@dataclass(frozen=True)
class TokenBound:
    """The most characters one token of a tokenizer covers: a lower bound on a text's tokens."""

    chars_per_token: int
    normalizes: bool = False  # the tokenizer normalizes its input (see NORMALIZER_FACTOR)

    @classmethod
    def of(cls, tokenizer: Any) -> TokenBound | None:
        """The bound for a transformers tokenizer (None: it has no vocabulary to read)."""
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if get_vocab is None:
            return None
        try:
            spellings = list(get_vocab())
        except Exception:  # a tokenizer without a readable vocabulary: no bound, every prompt is tokenized
            return None
        spellings += [
            str(getattr(token, "content", token)) for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        ]
        if not spellings:
            return None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        normalizes = backend is None or getattr(backend, "normalizer", None) is not None
        return cls(max(1, max(len(spelling) for spelling in spellings)), normalizes)

    def per_token(self, text: str) -> int:
        """Characters one token of ``text`` may cover (``str.isascii`` is O(1) in CPython)."""
        return self.chars_per_token * (NORMALIZER_FACTOR if self.normalizes and not text.isascii() else 1)

    def at_least(self, text: str) -> int:
        """Tokens ``text`` has at least."""
        return -(-len(text) // self.per_token(text))


def slices(text: str, size: int = SLICE_CHARS) -> list[tuple[int, int]]:
    """(start, end) cuts of ``text`` about ``size`` characters long, each cut at a line start that
    begins with a non-space (a pre-tokenizer splits there too, so the slices' counts add up to
    the whole's, nearly always exactly); where none is near, at ``size``."""
    cuts, start = [], 0
    while len(text) - start > size:
        end = start + size
        newline = text.rfind("\n", start + size // 2, end)
        while newline >= 0 and newline + 1 < len(text) and text[newline + 1].isspace():
            newline = text.rfind("\n", start + size // 2, newline)
        if newline >= 0:
            end = newline + 1
        cuts.append((start, end))
        start = end
    cuts.append((start, len(text)))
    return cuts


def count_exceeds(encode: Callable[[str], list[int]], text: str, limit: int) -> int | None:
    """Tokenize ``text`` a slice at a time until the count has passed ``limit`` (with the cuts'
    margin): the count so far, a lower bound of the whole's; None: the text did not pass it."""
    counted = 0
    for number, (start, end) in enumerate(slices(text)):
        counted += len(encode(text[start:end]))
        if counted > limit + SLICE_MARGIN * number:
            return counted - SLICE_MARGIN * number
    return None


@dataclass(frozen=True)
class Refusal:
    """Why a request cannot fit the context, known without tokenizing it."""

    field: str  # "prompt" or "reference" (a door names its own parameter: prompt, messages, prediction)
    message: str

    def error(self) -> ContextLengthError:
        return ContextLengthError(self.message)


def prompt_chars(prompt: Prompt) -> int:
    """The characters a prompt brings (what its rendering and tokenizing cost grows with)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, Fim):
        return len(prompt.prefix) + len(prompt.suffix)
    return len(prompt.original) + len(prompt.instruction or "")


def request_chars(request: GenerationRequest) -> int:
    return prompt_chars(request.prompt) + len(request.reference or "")


def too_long(tokens: int, context: int, at_least: bool = False) -> ContextLengthError:
    """The context error every door turns into its 400 ``context_length_exceeded``."""
    return ContextLengthError(
        f"the prompt is {'at least ' if at_least else ''}{tokens} tokens but the model's context is {context}; "
        "shorten it (editors send a window around the cursor)"
    )


class PromptPreparer:
    """The service's prompt side: the cheap refusal, the two lanes, rendering and tokenizing."""

    def __init__(self, target: Target, prompts: PromptRenderer) -> None:
        self.target = target
        self.prompts = prompts
        self.bound = TokenBound.of(getattr(target, "tokenizer", None))
        self._small = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="codespec-prepare")
        self._large = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="codespec-prepare-large")

    def run(self, chars: int, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` (the work for a text of ``chars`` characters) on its lane; after a large
        text's, the tokenizer's freed buffers (~250 bytes a character) go back to the system."""
        if chars <= SMALL_PROMPT_CHARS:
            return self._small.submit(fn)

        def large() -> Any:
            try:
                return fn()
            finally:
                if chars * TOKENIZER_BYTES_PER_CHAR >= LARGE_FREE_BYTES:
                    release_free_memory()

        return self._large.submit(large)

    def refusal(self, request: GenerationRequest) -> Refusal | None:
        """A request whose prompt or reference is surely longer than the context (O(1): lengths only).
        A FIM prompt is never refused (it is windowed to fit), nor a background prefill (cut)."""
        if self.bound is None or not request.kind.decodes:
            return None
        context = self.target.max_context
        prompt = request.prompt
        text = prompt if isinstance(prompt, str) else prompt.original if isinstance(prompt, Rewrite) else None
        if text is not None and self.bound.at_least(text) >= context:
            return Refusal("prompt", str(self._bound_error(text)))
        if request.reference and self.bound.at_least(request.reference) >= context:
            tokens = self.bound.at_least(request.reference)
            return Refusal(
                "reference",
                f"the prediction is at least {tokens} tokens ({len(request.reference)} characters) but the "
                f"model's context is {context}: no answer can be that long",
            )
        return None

    def _bound_error(self, text: str) -> ContextLengthError:
        assert self.bound is not None
        tokens = self.bound.at_least(text)
        return ContextLengthError(
            f"the prompt is at least {tokens} tokens ({len(text)} characters; a token of this model covers at most "
            f"{self.bound.per_token(text)}) but the model's context is {self.target.max_context}; "
            "shorten it (editors send a window around the cursor)"
        )

    def prepare(self, request: GenerationRequest) -> PreparedPrompt:
        """On a lane: the prompt rendered and tokenized; a prompt too long for the context raises."""
        if not request.kind.decodes:  # a background prefill: the rendered prompt, cut to the context
            ids = self.target.encode(self.prompts.render(request.prompt).text)[: self.target.max_context - 1]
            return PreparedPrompt(None, ids, 0)
        rendered, prompt_ids = self.fit(request)
        if len(prompt_ids) >= self.target.max_context:
            raise too_long(len(prompt_ids), self.target.max_context)
        reference_tokens = 0
        basis = request.reference if request.budget_text is None else request.budget_text
        if request.kind.budget_adds_reference and basis:  # a rewrite is about as long as what it rewrites
            reference_tokens = len(self.target.encode(basis))
        return PreparedPrompt(rendered, prompt_ids, reference_tokens)

    def fit(self, request: GenerationRequest) -> tuple[RenderedPrompt, list[int]]:
        """The rendered prompt and its ids; a FIM prompt too long for the context is rebuilt from a
        narrower window (keeping the text nearest the cursor). Any other prompt much longer than
        the context in characters is first counted in slices, and refused once it has passed."""
        rendered = self.prompts.render(request.prompt)
        context = self.target.max_context
        if not isinstance(request.prompt, Fim) and len(rendered.text) > max(SLICE_CHARS, 2 * context):
            counted = count_exceeds(self.target.encode, rendered.text, context - 1)
            if counted is not None:
                raise too_long(counted, context, at_least=True)
        prompt_ids = self.target.encode(rendered.text)
        budget = context - min(request.max_tokens, context // 4) - 1
        if not isinstance(request.prompt, Fim) or len(prompt_ids) <= budget:
            return rendered, prompt_ids
        prefix, suffix = request.prompt.prefix, request.prompt.suffix
        for _ in range(8):
            scale = 0.9 * budget / len(prompt_ids)
            keep = int(len(prefix) * scale)
            cut = prefix.find("\n", len(prefix) - keep)  # start the window at a line start
            prefix = prefix[cut + 1 :] if 0 <= cut < len(prefix) - 1 else prefix[len(prefix) - keep :]
            suffix = suffix[: int(len(suffix) * scale)]
            rendered = self.prompts.render(Fim(prefix, suffix))
            prompt_ids = self.target.encode(rendered.text)
            if len(prompt_ids) <= budget:
                break
        return rendered, prompt_ids

    def shutdown(self) -> None:
        self._small.shutdown(wait=False)
        self._large.shutdown(wait=False)
