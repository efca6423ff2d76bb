"""Writes docs/default-model.md from the training result and the evaluation metrics."""

from __future__ import annotations

from pathlib import Path

from training.context_copy import ContextCopyConfig
from training.evaluate import PLAIN_COPY_CHARS
from training.finish import FinishConfig
from training.rescue import RescueConfig
from training.trainer import DRAFT_SHAPE, TARGET_SHAPE, TrainConfig, TrainResult


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def machine_description(threads: int) -> str:
    """The machine this run trained on, as measured now (not a fixed string)."""
    import os
    import platform

    import torch

    where = (
        f"a {torch.cuda.get_device_name(0)} GPU"
        if torch.cuda.is_available()
        else f"a CPU machine with {os.cpu_count()} cores ({platform.machine()}), {threads} torch thread(s)"
    )
    return where


def _block(text: str) -> str:
    return "```python\n" + text.rstrip("\n") + "\n```"


def write_card(
    path: Path,
    result: TrainResult,
    metrics: dict,
    corpus_info: dict,
    params: dict,
    threads: int,
    rescue: RescueConfig | None = None,
    finish: FinishConfig | None = None,
    context: ContextCopyConfig | None = None,
) -> None:
    config = TrainConfig()
    losses, agreement = metrics["loss_nats"], metrics["top1_agreement"]
    layers = TARGET_SHAPE.layers
    loss_rows = "\n".join(
        f"| target exit after layer {l}{' (full model)' if l == layers else ''} | {losses[f'exit_{l}']:.3f} | "
        f"{_pct(agreement[f'exit_{l}']) if l < layers else '100% (itself)'} |"
        for l in range(1, layers + 1)
    )
    samples = metrics["samples"]
    total_s = result.wall_s + result.rescue_wall_s + result.finish_wall_s + result.context_wall_s
    mixture = ", ".join(f"{kind} {round(100 * share)}%" for kind, share in config.mixture)
    probes = ", ".join(f"{score:.2f} at {step}" for step, score in result.probes)
    stages = ", then ".join(f"{vocab:,}" for vocab, _, _ in config.copy_stages)
    bridge = "; ".join(f"{v:,} tokens, {n} steps of {r} x {l}" for v, n, r, l in config.bridge_stages)
    mix_steps = result.steps - result.copy_steps - result.bridge_steps
    kept = (
        f"the weights from mixture step {result.best_step:,} were kept"
        if result.best_step >= 0
        else "the last weights were kept"
    )
    rescue_line = ""
    if result.rescue_steps:
        rescue = rescue or RescueConfig()
        rescue_line = (
            f"\n- Then the previous recipe's copy-rescue fine-tune (`training/rescue.py`): "
            f"{result.rescue_warm_steps + result.rescue_steps} steps, {result.rescue_wall_s / 60:.1f} minutes "
            f"(mixture {', '.join(f'{k} {round(100 * w)}%' for k, w in rescue.mixture)})."
        )
    finish_line = ""
    if result.finish_steps:
        finish = finish or FinishConfig()
        kept_finish = (
            f"the weights after finishing step {result.finish_best_step:,} were kept"
            if result.finish_best_step
            else "the main run's weights were kept (no probe improved on them)"
        )
        finish_line = (
            f"\n- Then the FIM finishing phase (`training/finish.py`, target only): {result.finish_steps:,} "
            f"steps of batch {finish.batch[0]} x {finish.batch[1]}, "
            f"{', '.join(f'{k} {round(100 * w)}%' for k, w in finish.mixture)}, LR {finish.lr:g} "
            f"({finish.warmup_steps} warmup steps, cosine to {finish.min_lr_ratio:g}x), "
            f"{result.finish_wall_s / 60:.1f} minutes. `fim_middle` rows put the loss on the middle only (the "
            f"mixture's `fim` rows train on the whole text, so a few percent of their tokens teach filling a gap); "
            f"their middles are what an editor asks for: one whole line (half), 2-4 lines, or the rest of a "
            f"line from a cursor inside it, up to its end or up to code that follows the cursor. A probe every "
            f"{finish.probe_every} steps on {finish.probe_functions} other held-out functions (copy rate + FIM "
            f"validity) picks the weights, the starting ones included; {kept_finish} "
            f"(probe: {', '.join(f'{score:.2f} at {step}' for step, score in result.finish_probes)})."
        )
    first_line = (
        f"**{_pct(metrics['first_line_exact'])}** of {metrics['first_line_cases']} cases (`completions-httpx`)"
        if "first_line_exact" in metrics
        else "not measured in this run (no completion records were found)"
    )
    context_line = ""
    if result.context_steps:
        context = context or ContextCopyConfig()
        kept_context = (
            f"the weights after step {result.context_best_step:,} were kept"
            if result.context_best_step
            else "the starting weights were kept (no probe improved on them)"
        )
        context_line = (
            f"\n- Then the context-copy phase (`training/context_copy.py`, target only): {result.context_steps:,} "
            f"steps of batch {context.batch[0]} x {context.batch[1]}, "
            f"{', '.join(f'{k} {round(100 * w)}%' for k, w in context.mixture)}, LR {context.lr:g}"
            f"{' (constant after warmup)' if context.min_lr_ratio == 1 else ''}, "
            f"{result.context_wall_s / 60:.1f} minutes. `plain_copy` rows repeat a region without any template "
            f"(the same code again, or a near-copy with an identifier renamed), loss on the repetition, so the "
            f"model copies from plain context as real code models do. It starts from the exported finish "
            f"weights; a probe of copy rate + FIM validity + plain-context copy rate picks the kept weights"
            + (
                f" (a step whose probe FIM validity is more than {100 * context.fim_tolerance:g} points under the "
                f"starting weights' is never kept: it scores 3 less)"
                if context.fim_tolerance is not None
                else ""
            )
            + f": "
            f"{kept_context} (probe: {', '.join(f'{score:.2f} at {step}' for step, score in result.context_probes)})."
            + (
                " **This invocation ran only this phase** (`--from-shipped`), from the weights the run recorded in "
                "`training/runs/shipped-finish.json` exported; the figures above for the earlier phases are that "
                "run's."
                if result.from_shipped
                else ""
            )
        )
    output = samples["completion"]["output"]
    completion_sample = (
        f"gives\n\n{_block(output)}"
        if output.strip()
        else "gives nothing: the model ends the text at once (end-of-text token)."
    )
    text = f"""# The default model pair

codespec ships a small Python code model (the default **target**) and a smaller **draft** model with the
same tokenizer, so it runs offline on a fresh machine. Both are `LlamaForCausalLM` checkpoints loaded
with `from_pretrained` from `codespec/models/default/{{target,draft}}` (bf16 safetensors; loaded as
float32 on CPU). They were trained by `codespec train-default` (this file is written by that command).
They are tiny: good enough that completions look like Python, that edit prompts copy their input,
and that the draft-model and early-exit fallbacks behave realistically; not a useful assistant. Point
`--model` at a real checkpoint (e.g. Qwen2.5-Coder) for real completions: the prompt formats in
`codespec/core/prompts.py` are the same.

## Models

| | layers | hidden | heads (kv) | MLP | parameters | decode step (CPU, 1 thread) |
|---|---|---|---|---|---|---|
| target | {TARGET_SHAPE.layers} | {TARGET_SHAPE.hidden} | {TARGET_SHAPE.heads} ({TARGET_SHAPE.kv_heads}) | {
        TARGET_SHAPE.intermediate
    } | {params["target"]:,} | {metrics["step_ms"]["target"]:.1f} ms |
| draft | {DRAFT_SHAPE.layers} | {DRAFT_SHAPE.hidden} | {DRAFT_SHAPE.heads} ({DRAFT_SHAPE.kv_heads}) | {
        DRAFT_SHAPE.intermediate
    } | {params["draft"]:,} | {metrics["step_ms"]["draft"]:.1f} ms |

Untied input/output embeddings, vocabulary 4,096 (byte-level BPE, `tokenizers`), RoPE, context 1,024
(trained on rows of up to 512 tokens). The draft costs about a fifth of the target's multiply-adds per
token. Special tokens: `<|endoftext|>` (id 0, EOS), `<|fim_prefix|>`, `<|fim_middle|>`,
`<|fim_suffix|>`, `<|fim_pad|>`, `<|repo_name|>`, `<|file_sep|>` (Qwen2.5-Coder's names). A source
text that literally contains one of these strings is tokenized as the special token.

## Training

- Data: the Python standard library's own `.py` files minus its tests ({corpus_info["train_files"]} files,
  {corpus_info["train_chars"]:,} characters, {corpus_info["train_tokens"]:,} tokens; PSF licence).
  {corpus_info["heldout_files"]} files are held out by a hash of their path (`training/corpus.py`);
  every number below is measured on them. `shared/workloads` is never used.
- Curriculum: synthetic copy in the rewrite format (random spans of 10-60 tokens) over the
  {stages} most frequent tokens, batch {config.copy_batch[0]} x {config.copy_batch[1]} (each stage until
  its copy loss is low; {result.copy_steps} steps in all, target only, no early-exit loss). Copying
  ("induction") forms suddenly and late when it must be learned together with a 4k vocabulary, so it
  is formed on a small one first.
- Bridge to real code ({result.bridge_steps} steps, target only): the copy map is learned per token (a
  512-token circuit copied nothing else), so it is widened on half synthetic copy, half unchanged
  rewrites of real code (loss on the copy only): {bridge}.
- Mixture, {mix_steps:,} steps of batch {config.mix_batch[0]} x {config.mix_batch[1]}: {mixture}.
  `identity`: an unchanged rewrite of a real function or run of lines, loss on the copy only;
  `rewrite`: half unchanged, half small synthetic edits with an instruction (renamed identifier,
  deleted, inserted or changed line); `copy`: synthetic spans of {config.mix_copy_span[0]}-{
        config.mix_copy_span[1]
    } tokens
  over the full vocabulary; `fim`: prefix-suffix-middle (one line, part of a line, or 2-5 lines);
  `natural`: plain code. Copy work stays in the mixture from the start: a natural-code-heavy mixture
  (the previous recipe) erased the copy circuit the curriculum formed, and restoring it afterwards
  took a third of the budget. The recipe was chosen in a side-by-side search at this budget
  ([training-sweep.md](training-sweep.md)).
- Target loss: next-token cross-entropy plus a LayerSkip-style early-exit loss (weight
  {config.exit_weight} each, mixture only): the residual stream after layers 1..{layers - 1}, through the final
  norm and the LM head, also predicts the next token (on every {config.exit_stride}rd position). The draft trains
  on every {config.draft_every}rd mixture batch with plain cross-entropy.
- AdamW (betas 0.9/0.95, weight decay 0.1), LR {config.peak_lr:g}, {config.warmup_steps} warmup steps, constant
  through the curriculum and the bridge, {config.schedule} decay to {config.min_lr_ratio:g}x over the mixture;
  bf16 autocast; seed 0; {threads} torch thread(s).
- Every {config.probe_every} mixture steps a greedy probe scores the target on 20 held-out functions
  that are not in the evaluation set below (copy rate + FIM validity, 0-2); {kept}
  (probe: {probes}).{rescue_line}{finish_line}{context_line}
- Tokens seen: {result.tokens_seen:,} (target). Steps: {result.steps:,}.
- **Wall time: {total_s / 60:.1f} minutes** of training ({total_s:.0f} s: main run {result.wall_s / 60:.1f}{
        f", finishing {result.finish_wall_s / 60:.1f}" if result.finish_steps else ""
    }{f", context copy {result.context_wall_s / 60:.1f}" if result.context_steps else ""}{
        f", rescue {result.rescue_wall_s / 60:.1f}" if result.rescue_steps else ""
    }) on {machine_description(threads)}, plus about a
  minute of preparation (tokenizer, corpus) and a few minutes of evaluation.{
        " The main run and the phases after it ran as two invocations: `codespec train-default`, then"
        " `codespec train-default --resume` on its checkpoint; each part's time is its own measured wall time."
        if result.resumed
        else " The main run and the finishing phase are the recorded run's (`training/runs/shipped-finish.json`); this"
        " invocation (`codespec train-default --from-shipped`) ran the context-copy phase, measured here."
        if result.from_shipped
        else " One uninterrupted run of `codespec train-default`."
    }

## Held-out quality

| model | loss (nats/token) | greedy top-1 agreement with the target |
|---|---|---|
{loss_rows}
| draft | {losses["draft"]:.3f} | {_pct(agreement["draft"])} |

Measured over {metrics["positions"]:,} held-out token positions (512-token windows).

- **Copy rate** (rewrite prompt, no instruction, greedy output identical to the input then EOS):
  **{_pct(metrics["copy_rate"])}** of {metrics["copy_functions"]} held-out functions.
- **FIM** (one body line of a held-out function removed): completion is valid Python
  **{_pct(metrics["fim_valid_rate"])}**, exact **{_pct(metrics["fim_exact_rate"])}** of {metrics["fim_functions"]}.
- **Plain-context copy rate** (no template: the function, two blank lines and its header again;
  the first {PLAIN_COPY_CHARS} characters of the body written exactly): **{_pct(metrics["plain_copy_rate"])}** of
  {metrics["copy_functions"]} held-out functions.
- **First-line exact match on completion records** (cursor at the recorded position, 800 / 200
  character windows as the server uses on a CPU): {first_line}.
- **Next-line exact match** (greedy, from up to 1,500 characters of preceding text ending before the
  previous line's newline; the line after the first generated newline, stripped):
  **{_pct(metrics["next_line_exact"])}** of 100 held-out lines.

Capability bars checked by `tests/test_default_model.py` on these weights, over the first 30 of
the functions above: copy rate >= 80% (here {_pct(metrics.get("copy_rate_tested", metrics["copy_rate"]))}:
{"met" if metrics.get("copy_rate_tested", metrics["copy_rate"]) >= 0.8 else "NOT met"}; {
        _pct(metrics["copy_rate"])
    } over all 40), FIM validity >= 50%
(here {_pct(metrics.get("fim_valid_rate_tested", metrics["fim_valid_rate"]))}: {
        "met" if metrics.get("fim_valid_rate_tested", metrics["fim_valid_rate"]) >= 0.5 else "NOT met"
    }). How the recipe was chosen, and how much runs of one
recipe differ, is in [training-sweep.md](training-sweep.md).

## Samples (greedy)

Completion of

{_block(samples["completion"]["prompt"])}

{completion_sample}

FIM: prefix

{_block(samples["fim"]["prefix"])}

suffix

{_block(samples["fim"]["suffix"])}

expected line `{samples["fim"]["expected"].rstrip()}`, model's line `{samples["fim"]["output"].rstrip()}`.

## Reproduce

```
codespec train-default                 # main run + FIM finishing: codespec/models/default/ and this file
codespec train-default --resume        # only the phases after the main run, from its checkpoint in --work
codespec train-default --export-only   # re-export + re-evaluate the last checkpoint in --work
codespec train-default --device cuda   # same recipe on a GPU (minutes; not bit-identical to CPU)
python -m training.sweep --out DIR   # the recipe search (training-sweep.md), on a GPU
```
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
