"""The model card's numbers, measured on held-out standard-library files with the exported weights.

The copy and FIM checks are plain functions over a ``TargetModel`` so the tests run exactly the
same checks on the shipped weights (with a lookup proposer for speed: greedy output is identical).
"""

from __future__ import annotations

import ast
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from codespec.core import prompts
from codespec.core.config import GenerationLimits
from codespec.core.decode import generate_all
from codespec.core.model import TargetModel
from training import DEFAULT_COMPLETIONS, corpus

TESTED_FUNCTIONS = 30  # the capability tests use the first 30 of the evaluation functions


@dataclass(frozen=True)
class CopyResult:
    original: str
    output: str
    reason: str

    @property
    def exact(self) -> bool:
        return self.reason == "eos" and self.output == self.original


@dataclass(frozen=True)
class FimResult:
    prefix: str
    removed_line: str
    suffix: str
    completion: str  # the generated text up to and including its first newline

    @property
    def valid(self) -> bool:
        if not self.completion.strip():
            return False
        try:
            ast.parse(self.prefix + self.completion + self.suffix)
        except SyntaxError:
            return False
        return True

    @property
    def exact(self) -> bool:
        return self.completion.rstrip("\n") == self.removed_line.rstrip("\n")


def copy_check(target: TargetModel, function: str, proposer=None) -> CopyResult:
    """Greedy rewrite of ``function`` with no instruction: it should come back unchanged, then EOS."""
    prompt_ids = target.encode(prompts.rewrite_prompt(function))
    budget = len(target.encode(function)) + 8
    finished = generate_all(target, prompt_ids, proposer, limits=GenerationLimits(budget, max_draft_len=16))
    return CopyResult(function, finished.text, finished.reason)


PLAIN_COPY_CHARS = 60


def read_records(path: Path | None) -> list[dict] | None:
    """The completion records for the card, or None (and the card says it was not measured)."""
    if path is None or not path.is_file():
        return None
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plain_copy_check(target: TargetModel, function: str, proposer=None) -> bool:
    """Copying from plain context, no template: the prompt is ``function``, two blank lines and its
    header again; the model should write the same body (its first 60 characters, exactly).

    The header is given without its newline (byte-level BPE merges a newline with the next line's
    indentation), so the expected text starts with that newline.
    """
    header, _, _ = function.partition("\n")
    expected = function[len(header) :][:PLAIN_COPY_CHARS]
    prompt_ids = target.encode(function + "\n\n" + header)
    budget = len(target.encode(expected)) + 8
    finished = generate_all(target, prompt_ids, proposer, limits=GenerationLimits(budget, max_draft_len=16))
    return finished.text.startswith(expected)


def first_line_exact(
    target: TargetModel, records: list[dict], windows: tuple[int, int] = (800, 200), proposer=None
) -> float:
    """Completion records (``prefix``, ``suffix``, ``target``): the completion's first line, as the
    server asks for it (the cursor's mode, these prompt windows, FIM in the target's format), equals
    the recorded first line (both stripped)."""
    from codespec.core.prompts import Fim, PromptRenderer
    from codespec.service.requests.inline import completion_context, trim_completion

    renderer = PromptRenderer(target.tokenizer, target.prompt_format)
    hits = 0
    for record in records:
        text = record["prefix"] + record["suffix"]
        context = completion_context(text, len(record["prefix"]), 48, 160, *windows, invoked=True)
        prompt = renderer.render(Fim(context.prefix, context.suffix))
        stops = (*context.stop, *prompt.stop, *renderer.end_markers)
        finished = generate_all(
            target,
            target.encode(prompt.text),
            proposer,
            limits=GenerationLimits(
                context.max_tokens, stops, max_draft_len=16, stop_token_ids=renderer.stop_token_ids()
            ),
        )
        produced = trim_completion(finished.text, context).split("\n", 1)[0].strip()
        hits += bool(produced) and produced == record["target"].split("\n", 1)[0].strip()
    return hits / max(1, len(records))


def fim_split(function: str) -> tuple[str, str, str] | None:
    """Remove one body line (the first non-blank line past the middle): prefix, line, suffix."""
    lines = function.splitlines(keepends=True)
    for index in range(max(1, len(lines) // 2), len(lines)):
        if lines[index].strip() and not lines[index].lstrip().startswith(("#", '"', "'")):
            return "".join(lines[:index]), lines[index], "".join(lines[index + 1 :])
    return None


def fim_check(
    target: TargetModel, prefix: str, removed: str, suffix: str, proposer=None, max_new_tokens: int = 32
) -> FimResult:
    prompt_ids = target.encode(prompts.fim_prompt(prefix, suffix))
    finished = generate_all(target, prompt_ids, proposer, limits=GenerationLimits(max_new_tokens, ("\n",)))
    line = finished.text.split("\n", 1)[0] + "\n"
    return FimResult(prefix, removed, suffix, line)


def heldout_windows(
    target: TargetModel, files: list[corpus.SourceFile], length: int = 512, count: int = 40
) -> torch.Tensor:
    stream: list[int] = []
    for source in sorted(files, key=lambda f: f.path):
        stream += target.encode(source.text) + [target.tokenizer.eos_token_id]
    step = max(length, (len(stream) - length) // count)
    windows = [stream[i : i + length] for i in range(0, len(stream) - length, step)][:count]
    return torch.tensor(windows)  # [N, length]


@torch.inference_mode()
def layer_metrics(target: TargetModel, draft: TargetModel, windows: torch.Tensor) -> dict:
    """Held-out loss at each exit (layer l through the final norm + LM head) and for the draft,
    and greedy top-1 agreement of each exit and of the draft with the full target."""
    from training.trainer import capture_layer_outputs, exit_logits

    model = target.model
    layers = model.config.num_hidden_layers
    losses = {f"exit_{l}": 0.0 for l in range(1, layers + 1)}
    agreement = {f"exit_{l}": 0 for l in range(1, layers)}
    losses["draft"], agreement["draft"], positions = 0.0, 0, 0
    for row in windows:
        ids = row[None, :-1]  # [1, T]
        labels = row[1:]  # [T]
        with capture_layer_outputs(model, range(layers - 1)) as hidden_by_layer:
            final_logits = model(input_ids=ids).logits[0].float()  # [T, V]
        final_top1 = final_logits.argmax(-1)  # [T]
        losses[f"exit_{layers}"] += F.cross_entropy(final_logits, labels, reduction="sum").item()
        for index in range(layers - 1):
            early = exit_logits(model, hidden_by_layer[index])[0].float()  # [T, V]
            losses[f"exit_{index + 1}"] += F.cross_entropy(early, labels, reduction="sum").item()
            agreement[f"exit_{index + 1}"] += (early.argmax(-1) == final_top1).sum().item()
        draft_logits = draft.model(input_ids=ids).logits[0].float()  # [T, V]
        losses["draft"] += F.cross_entropy(draft_logits, labels, reduction="sum").item()
        agreement["draft"] += (draft_logits.argmax(-1) == final_top1).sum().item()
        positions += labels.numel()
    return {
        "loss_nats": {k: v / positions for k, v in losses.items()},
        "top1_agreement": {k: v / positions for k, v in agreement.items()},
        "positions": positions,
    }


def next_line_exact(
    target: TargetModel, files: list[corpus.SourceFile], count: int = 100, context_chars: int = 1500
) -> float:
    """Greedy next line from the preceding text of a held-out file, compared exactly (stripped).

    The context stops *before* the previous line's newline: byte-level BPE merges a newline with
    the next line's indentation, so a context ending in a bare newline would be out of distribution.
    """
    cases = []
    for source in sorted(files, key=lambda f: f.path):
        lines = source.text.splitlines(keepends=True)
        offset = 0
        for index, line in enumerate(lines):
            if index >= 5 and index % 7 == 0 and line.strip() and offset > 200:
                context = source.text[: offset - 1][-context_chars:]
                cases.append((context, line.rstrip("\n")))
            offset += len(line)
    stride = max(1, len(cases) // count)
    cases = cases[::stride][:count]
    hits = 0
    for context, expected in cases:
        finished = generate_all(target, target.encode(context), None, limits=GenerationLimits(40))
        produced = finished.text.split("\n")
        hits += len(produced) > 1 and produced[1].strip() == expected.strip()
    return hits / len(cases)


def step_latency_ms(model: TargetModel, tokens: int = 64) -> float:
    """Mean wall time of one single-token decode step (after a 64-token prefill), in ms."""
    cache = model.new_cache()
    model.forward(list(range(10, 74)), cache)
    start = time.perf_counter()
    for i in range(tokens):
        model.forward([100 + i], cache)
    return 1000 * (time.perf_counter() - start) / tokens


def evaluate(
    target_dir,
    draft_dir,
    heldout_files: list[corpus.SourceFile],
    say: Callable[[str], None] = print,
    functions_count: int = 40,
    completion_records: list[dict] | None = None,
) -> dict:
    torch.manual_seed(0)
    target = TargetModel.load(str(target_dir), device="cpu", dtype="float32")
    draft = TargetModel.load(str(draft_dir), device="cpu", dtype="float32")
    metrics: dict = {}
    windows = heldout_windows(target, heldout_files)
    metrics.update(layer_metrics(target, draft, windows))
    say(f"held-out loss {metrics['loss_nats']}, agreement {metrics['top1_agreement']}")

    functions = corpus.heldout_functions(functions_count, files=heldout_files)
    copies = [copy_check(target, fn) for fn in functions]
    metrics["copy_rate"] = sum(c.exact for c in copies) / len(copies)
    metrics["copy_functions"] = len(copies)
    tested = copies[:TESTED_FUNCTIONS]  # tests/test_default_model.py checks the bars on these
    metrics["copy_rate_tested"] = sum(c.exact for c in tested) / len(tested)
    say(f"copy rate {metrics['copy_rate']:.3f} on {len(copies)} functions")

    indexed = [(i, split) for i, split in enumerate(fim_split(fn) for fn in functions) if split is not None]
    fims = [fim_check(target, *split) for _, split in indexed]
    metrics["fim_valid_rate"] = sum(f.valid for f in fims) / len(fims)
    metrics["fim_exact_rate"] = sum(f.exact for f in fims) / len(fims)
    metrics["fim_functions"] = len(fims)
    tested_fims = [f for f, (i, _) in zip(fims, indexed) if i < TESTED_FUNCTIONS]
    metrics["fim_valid_rate_tested"] = sum(f.valid for f in tested_fims) / max(1, len(tested_fims))
    say(f"FIM valid {metrics['fim_valid_rate']:.3f}, exact {metrics['fim_exact_rate']:.3f}")

    plain = [plain_copy_check(target, fn) for fn in functions]
    metrics["plain_copy_rate"] = sum(plain) / len(plain)
    say(f"plain-context copy rate {metrics['plain_copy_rate']:.3f} on {len(plain)} functions")
    if completion_records:
        metrics["first_line_exact"] = first_line_exact(target, completion_records)
        metrics["first_line_cases"] = len(completion_records)
        say(f"first-line exact match {metrics['first_line_exact']:.3f} on {len(completion_records)} completions")

    metrics["next_line_exact"] = next_line_exact(target, heldout_files)
    say(f"next-line exact match {metrics['next_line_exact']:.3f}")
    metrics["step_ms"] = {"target": step_latency_ms(target), "draft": step_latency_ms(draft)}

    sample_prompt = 'def read_lines(path):\n    """Return the lines of the file at path."""\n'
    sample = generate_all(target, target.encode(sample_prompt), None, limits=GenerationLimits(60))
    fim = fims[0]
    metrics["samples"] = {
        "completion": {"prompt": sample_prompt, "output": sample.text},
        "fim": {"prefix": fim.prefix, "suffix": fim.suffix, "expected": fim.removed_line, "output": fim.completion},
    }
    metrics["copy_failures"] = [
        {"original": c.original, "output": c.output, "reason": c.reason} for c in copies if not c.exact
    ][:3]
    return metrics


def mean_or_nan(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def main(argv: list[str] | None = None) -> int:
    """``python -m training.evaluate --model DIR``: the card's context-copy figures for any model."""
    import argparse

    from codespec.core.default_model import target_path
    from codespec.proposers.context import ContextLookup

    parser = argparse.ArgumentParser(prog="python -m training.evaluate")
    parser.add_argument("--model", default=str(target_path()))
    parser.add_argument("--completions", type=Path, default=DEFAULT_COMPLETIONS)
    parser.add_argument("--functions", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target = TargetModel.load(args.model, device="cpu", dtype="float32")
    functions = corpus.heldout_functions(args.functions)
    lookup = ContextLookup()  # greedy output is identical with or without it; it is faster
    report: dict = {"model": args.model}
    report["plain_copy_rate"] = sum(plain_copy_check(target, fn, lookup) for fn in functions) / len(functions)
    report["rewrite_copy_rate"] = sum(copy_check(target, fn, lookup).exact for fn in functions) / len(functions)
    splits = [split for split in (fim_split(fn) for fn in functions) if split is not None]
    report["fim_valid_rate"] = sum(fim_check(target, *split).valid for split in splits) / len(splits)
    tested = [
        fim_check(target, *s).valid
        for i, s in ((i, fim_split(fn)) for i, fn in enumerate(functions))
        if s is not None and i < TESTED_FUNCTIONS
    ]
    report["fim_valid_rate_tested"] = sum(tested) / max(1, len(tested))
    records = read_records(args.completions)
    if records:
        report["first_line_exact"] = first_line_exact(target, records, proposer=lookup)
        report["first_line_cases"] = len(records)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
