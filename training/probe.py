"""Cheap in-training probes of the two capability bars: copying and FIM, on held-out functions.

Both run every held-out prompt as one left-padded batch through ``generate`` (greedy): one batched
decode step costs little more than an unbatched one, so a 20-function probe is ~20x cheaper than
looping, which matters on CPU (probes run every few hundred steps) and on a GPU (per-token launch
overhead). The model card's numbers still come from ``evaluate.py`` (one prompt at a time, through
codespec's own decode loop); the probes only rank checkpoints during training.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import torch

from codespec.core import prompts


@torch.no_grad()
def _greedy_batch(model, tokenizer, prompt_texts: list[str], max_new_tokens: int) -> list[list[int]]:
    """New token ids per prompt (greedy; rows that ended are padded with EOS by ``generate``)."""
    was_training = model.training
    model.eval()
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in prompt_texts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.eos_token_id
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in encoded], device=device)  # [N, W]
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in encoded], device=device)
    output = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(prompts.stop_token_ids(tokenizer)),
        pad_token_id=pad,
    )
    model.train(was_training)
    return [row[width:].tolist() for row in output]


def copy_probe(model, tokenizer, functions: list[str]) -> float:
    """Fraction of ``functions`` reproduced exactly, then an end token, from the rewrite prompt."""
    if not functions:
        return 0.0
    stops = prompts.stop_token_ids(tokenizer)
    budget = max(len(tokenizer.encode(fn, add_special_tokens=False)) for fn in functions) + 8
    outputs = _greedy_batch(model, tokenizer, [prompts.rewrite_prompt(fn) for fn in functions], budget)
    hits = 0
    for function, new in zip(functions, outputs):
        end = next((i for i, token in enumerate(new) if token in stops), None)
        hits += end is not None and tokenizer.decode(new[:end], skip_special_tokens=False) == function
    return hits / len(functions)


def fim_probe(model, tokenizer, splits: list[tuple[str, str, str]], max_new_tokens: int = 24) -> float:
    """Fraction of (prefix, removed line, suffix) cases whose completed line parses (evaluate's rule)."""
    if not splits:
        return 0.0
    stops = prompts.stop_token_ids(tokenizer)
    outputs = _greedy_batch(model, tokenizer, [prompts.fim_prompt(p, s) for p, _, s in splits], max_new_tokens)
    valid = 0
    for (prefix, _removed, suffix), new in zip(splits, outputs):
        end = next((i for i, token in enumerate(new) if token in stops), len(new))
        line = tokenizer.decode(new[:end], skip_special_tokens=False).split("\n", 1)[0] + "\n"
        if line.strip():
            try:
                ast.parse(prefix + line + suffix)
                valid += 1
            except SyntaxError:
                pass
    return valid / len(splits)


def plain_copy_probe(model, tokenizer, functions: list[str], chars: int = 60) -> float:
    """Fraction of ``functions`` whose body comes back from plain context (evaluate's rule: the
    function, two blank lines, its header; the first ``chars`` characters of the body exactly)."""
    if not functions:
        return 0.0
    headers = [fn.partition("\n")[0] for fn in functions]
    expected = [fn[len(header) :][:chars] for fn, header in zip(functions, headers)]
    budget = max(len(tokenizer.encode(text, add_special_tokens=False)) for text in expected) + 8
    outputs = _greedy_batch(model, tokenizer, [fn + "\n\n" + header for fn, header in zip(functions, headers)], budget)
    return sum(
        tokenizer.decode(new, skip_special_tokens=True).startswith(text) for text, new in zip(expected, outputs)
    ) / len(functions)


PROBE_START, PROBE_COUNT = 40, 20  # the evaluation uses the first 40 held-out functions; probes the next 20


def copy_and_fim_scorer(tokenizer, heldout_files, count: int = PROBE_COUNT) -> Callable[[object], float]:
    """A checkpoint's score while training: copy rate + FIM validity (0-2) on ``count`` probe functions."""
    from training import corpus
    from training.evaluate import fim_split

    functions = corpus.heldout_functions(PROBE_START + count, files=heldout_files)[PROBE_START:]
    splits = [s for s in (fim_split(fn) for fn in functions) if s is not None]
    return lambda model: copy_probe(model, tokenizer, functions) + fim_probe(model, tokenizer, splits)


def context_copy_scorer(
    tokenizer,
    heldout_files,
    count: int = PROBE_COUNT,
    fim_tolerance: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Callable[[object], float]:
    """Copy rate + FIM validity + plain-context copy rate (0-3) on ``count`` probe functions.

    With ``fim_tolerance``, a checkpoint whose FIM validity is more than that below the first one
    scored (the phase's starting weights: ``finish`` probes them first) scores 3 less, under every
    admissible checkpoint and the starting weights: plain-context copy (0 -> 0.8) would otherwise
    outweigh a FIM drop (0.55 -> 0.35) in the sum, and the phase traded FIM away."""
    from training import corpus
    from training.evaluate import fim_split

    functions = corpus.heldout_functions(PROBE_START + count, files=heldout_files)[PROBE_START:]
    splits = [s for s in (fim_split(fn) for fn in functions) if s is not None]
    start_fim: list[float] = []

    def score(model) -> float:
        copy_rate = copy_probe(model, tokenizer, functions)
        fim = fim_probe(model, tokenizer, splits)
        plain = plain_copy_probe(model, tokenizer, functions)
        if not start_fim:
            start_fim.append(fim)
        rejected = fim_tolerance is not None and fim < start_fim[0] - fim_tolerance - 1e-9
        if log is not None:
            log(
                f"probe: copy {copy_rate:.3f}, FIM valid {fim:.3f} (start {start_fim[0]:.3f}), "
                f"plain copy {plain:.3f}{', rejected: FIM below the start' if rejected else ''}"
            )
        return copy_rate + fim + plain - (3.0 if rejected else 0.0)

    return score
