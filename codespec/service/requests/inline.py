"""What an inline completion asks the engine for: plain functions, tested without a server.

- The prompt window around the cursor is *anchored*: its start moves in whole chunks at line
  starts, not with every keystroke, so consecutive requests on a document share a long token
  prefix and the KV cache (prompt caching) makes a keystroke cost a few tokens of prefill.
- Single-line or multi-line: a cursor with code before it on its line gets the rest of the line
  (stop at the newline); a cursor with only indentation before it gets a block (stop at a blank
  line), which ends with a newline when code follows the cursor on its line.
- Typing along a shown suggestion: the rest of the previous suggestion becomes the reference draft
  for the next request (near-free reuse; the target still verifies every token).
"""

from __future__ import annotations

from dataclasses import dataclass

from codespec.core.prompts import Fim, PromptRenderer
from codespec.core.target import Target
from codespec.service.requests.options import ServerOptions
from codespec.service.requests.schema import GenerationRequest, RequestKind, Sampling, request_of

WINDOW_CHUNK = 1024  # characters the prompt window's start moves by
CHARS_PER_TOKEN = 2.5  # a conservative estimate for code (byte-level BPEs give 3-4)


# Characters before / after the cursor on a CPU: a prompt of ~250-350 tokens. FIM puts the suffix
# after the prefix, so every keystroke re-prefills the whole suffix window; its size follows what
# that prefill costs: SUFFIX_FLOPS of work (2 x the model's parameters a token), between 64 and 200
# characters. At the qwen2.5-coder-0.5b body that is 64: the first token after a keystroke in 261 ms
# p50 instead of 777 ms at 200 (Q8_0 on llama.cpp, 2 cores; docs/gguf.md, "Inline completion
# latency"). At the shipped 5M-parameter model, 200 cost a fraction of a millisecond, and its
# completions see more of the line they continue (docs/benchmarks.md, the README main job).
CPU_PREFIX_CHARS = 800
CPU_SUFFIX_CHARS = (64, 200)
SUFFIX_FLOPS = 2.5e10
CPU_WINDOWS = (CPU_PREFIX_CHARS, CPU_SUFFIX_CHARS[0])  # a model of unknown size: the cheap window
GPU_WINDOWS = (4000, 512)


def default_windows(device_type: str, parameters: int | None = None) -> tuple[int, int]:
    """Prompt windows (characters before / after the cursor) when the user set none.

    The first request at a place in a file prefills its whole prompt (the server cannot know the
    cursor before it), so on a CPU windows stay near 300 tokens, inside what the default model was
    trained on, and the suffix (re-prefilled every keystroke) shrinks as the model grows; a GPU
    prefills thousands of tokens in milliseconds and keeps more context. The measurements behind
    the sizes are in docs/benchmarks.md (the LSP latency and GGUF inline rows).
    """
    if device_type != "cpu":
        return GPU_WINDOWS
    if not parameters:
        return CPU_WINDOWS
    low, high = CPU_SUFFIX_CHARS
    affordable = int(SUFFIX_FLOPS / (2.0 * parameters) * CHARS_PER_TOKEN)
    return CPU_PREFIX_CHARS, max(low, min(high, affordable))


def resolve_windows(
    prefix_chars: int | None,
    suffix_chars: int | None,
    device_type: str,
    max_context: int,
    max_tokens: int,
    parameters: int | None = None,
) -> tuple[int, int]:
    """The windows a request uses: the user's sizes or the defaults for the device and the model's
    size (``parameters``), fitted to the model's context."""
    default_prefix, default_suffix = default_windows(device_type, parameters)
    return fit_windows(
        default_prefix if prefix_chars is None else prefix_chars,
        default_suffix if suffix_chars is None else suffix_chars,
        max_context,
        max_tokens,
    )


def target_windows(target, prefix_chars: int | None, suffix_chars: int | None, max_tokens: int) -> tuple[int, int]:
    """``resolve_windows`` for ``target`` (a ``codespec.target.Target``): its device, context and size."""
    return resolve_windows(
        prefix_chars,
        suffix_chars,
        target.device.type,
        target.max_context,
        max_tokens,
        target.parameter_count or None,
    )


def completion_windows(target: Target, options: ServerOptions) -> tuple[int, int]:
    """The prompt windows (characters before, after the cursor) of ``options`` on ``target``."""
    completion = options.completion
    return target_windows(target, completion.prefix_chars, completion.suffix_chars, completion.block_tokens)


def fit_windows(prefix_chars: int, suffix_chars: int, max_context: int, max_tokens: int) -> tuple[int, int]:
    """Window sizes (characters) that fit the model's context with room for the output.

    Sized up front so the anchored window stays anchored; the service's exact fit (which cuts at
    the token level) is only a backstop for unusually dense text.
    """
    budget_chars = int(max(64, max_context - max_tokens - 16) * CHARS_PER_TOKEN)
    if prefix_chars + suffix_chars <= budget_chars:
        return prefix_chars, suffix_chars
    suffix = min(suffix_chars, budget_chars // 5)
    return budget_chars - suffix, suffix


@dataclass(frozen=True)
class CompletionContext:
    prefix: str  # prompt text before the cursor (windowed)
    suffix: str  # prompt text after the cursor (windowed)
    multiline: bool
    stop: tuple[str, ...]
    max_tokens: int
    before_code: bool = False  # a block inserted in front of code on the cursor's line: ends with a newline
    indent: str = ""  # the whitespace before the cursor on its line (a block's code after it keeps it)


def window_start(cursor: int, text: str, max_chars: int, chunk: int = WINDOW_CHUNK) -> int:
    """Start of the prefix window: a line start that stays put while the user types.

    The start is the first chunk boundary that keeps the window within ``max_chars``, moved
    forward to the next line start; it only changes when the cursor crosses a chunk boundary.
    """
    if cursor <= max_chars:
        return 0
    chunk = max(1, min(chunk, max_chars // 2 or 1))
    boundary = -(-(cursor - max_chars) // chunk) * chunk  # ceil to a chunk multiple
    newline = text.find("\n", boundary, cursor)
    return newline + 1 if newline != -1 else boundary


def completion_context(
    text: str,
    offset: int,
    line_tokens: int,
    block_tokens: int,
    prefix_chars: int,
    suffix_chars: int,
    invoked: bool = False,
    mode: str = "auto",
) -> CompletionContext:
    """The FIM request for a cursor at code point ``offset`` in ``text``.

    ``mode``: "auto" (by the cursor's line), "line" (always finish one line), "block" (always lines).
    """
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end == -1 else line_end
    before = text[line_start:offset]
    after = text[offset:line_end]
    # A block when nothing but indentation precedes the cursor on its line; otherwise finish the line.
    multiline = not before.strip() if mode == "auto" else mode == "block"
    prefix = text[window_start(offset, text, prefix_chars) : offset]
    suffix = text[offset : offset + suffix_chars]
    if multiline:
        stop = ("\n\n",)  # a block ends at a blank line (and, as every request, at the format's end markers)
        max_tokens = block_tokens
    else:
        stop = ("\n",)
        max_tokens = line_tokens
    return CompletionContext(
        prefix,
        suffix,
        multiline,
        stop,
        max_tokens,
        before_code=multiline and bool(after.strip()),
        indent=before if multiline else "",
    )


def warm_prompt(text: str, prefix_chars: int, prompts: PromptRenderer) -> str | None:
    """The start every completion prompt in the first window of ``text`` shares (the FIM prompt up
    to the cursor), for prefilling a document's KV cache when it is opened. None for an empty text."""
    head = text[:prefix_chars]
    if not head.strip():
        return None
    full = prompts.render(Fim(head, "")).text
    return full[: full.find(head) + len(head)]


def completion_prompt(context: CompletionContext, prompts: PromptRenderer) -> str:
    """The prompt text the service sends for ``context`` (plain decoding of it is the reference output)."""
    return prompts.render(Fim(context.prefix, context.suffix)).text


def trim_completion(text: str, context: CompletionContext) -> str:
    """A block loses trailing whitespace (noise in ghost text); one inserted in front of code on the
    cursor's line ends with a newline and the cursor's indentation, so that code stays on a line of
    its own, indented as it was."""
    if not context.multiline:
        return text
    text = text.rstrip()
    return text + "\n" + context.indent if text and context.before_code else text


@dataclass
class Suggestion:
    """The last completion shown for a document: where it was anchored and what it said."""

    text_before: str  # document text up to the anchor
    text: str


def typed_along(shown: Suggestion | None, document_text: str, offset: int) -> str | None:
    """The rest of ``shown`` if the user has typed a prefix of it since; else None."""
    if shown is None or not shown.text:
        return None
    anchor = len(shown.text_before)
    if offset < anchor or not document_text.startswith(shown.text_before):
        return None
    typed = document_text[anchor:offset]
    if not shown.text.startswith(typed):
        return None
    rest = shown.text[len(typed) :]
    return rest or None


def completion_request(
    text: str,
    offset: int,
    options: ServerOptions,
    target: Target,
    *,
    invoked: bool,
    uri: str | None = None,
    cache_key: str | None = None,
    reference: str | None = None,
    sampling: Sampling = Sampling(),
    deadline: bool = True,
    origin: str = "",
) -> tuple[GenerationRequest, CompletionContext]:
    """A completion at code point ``offset`` of ``text`` for ``target`` (its prompt windows follow
    the model, ``completion_windows``): what every door asks once, to get the engine's request.

    ``sampling.stop`` replaces the cursor's stop rule (a newline for a line, a blank line for a block);
    ``reference`` is a reference draft (the rest of a shown suggestion, a client's prediction).
    ``deadline``: stop at ``options.completion.deadline_ms`` (an editor no longer waits for a late completion).
    """
    context = completion_context(
        text,
        offset,
        options.completion.line_tokens,
        options.completion.block_tokens,
        *completion_windows(target, options),
        invoked=invoked,
        mode=options.completion.mode,
    )
    request = request_of(
        Fim(context.prefix, context.suffix),
        sampling.max_tokens or context.max_tokens,
        RequestKind.COMPLETE,
        sampling,
        context.stop if sampling.stop is None else sampling.stop,
        reference=reference,
        cache_key=cache_key,
        uri=uri,
        cursor=offset,
        deadline_s=options.completion.deadline_ms / 1000 if deadline else None,
        origin=origin,
    )
    return request, context
