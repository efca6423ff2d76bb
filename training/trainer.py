"""Train the target (with a LayerSkip-style early-exit loss) and the draft on the same rows.

Schedule: a synthetic copy curriculum (small vocabulary, widened in stages; each stage ends when
its copy loss is low or at its step cap), a bridge that widens copying to real code, then the
mixture (copy work kept in it: identity rewrites, synthetic copy, FIM, natural code) with its LR
decay; a probe every ``probe_every`` mixture steps picks the target weights that are kept. Runs on
any torch device (bf16 autocast). Checkpoints are written periodically so a run stopped early can
still be exported.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from training.examples import IGNORE, ExampleMaker


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


# Untied embeddings: with tied ones the copy (induction) circuit did not form in 1,200 curriculum
# steps; untied (and LR 1e-3, 32 x 128 rows, 64-token spans) it formed after about 150.
TIE_EMBEDDINGS = False
TARGET_SHAPE = Shape(256, 4, 4, 2, 704)
DRAFT_SHAPE = Shape(128, 2, 4, 2, 352)


@dataclass
class TrainConfig:
    seed: int = 0
    mix_steps: int = 3200  # steps of the mixture after the copy curriculum and the bridge
    total_steps: int = 0  # set when the curriculum ends (curriculum + bridge + mix_steps)
    copy_stages: tuple = ((64, 0.4, 1500), (512, 0.4, 400), (4096, 0.5, 300))  # vocab, loss goal, step cap
    copy_batch: tuple[int, int] = (32, 128)  # rows, tokens per row
    mix_batch: tuple[int, int] = (8, 512)
    # Copy work stays in the mixture from the start: a natural-code-heavy mixture erased the copy
    # circuit the curriculum formed (0% of held-out functions copied), and restoring it afterwards
    # cost a third of the budget. Recipe chosen by a side-by-side search (training/sweep.py).
    mixture: tuple = (("identity", 0.35), ("rewrite", 0.05), ("copy", 0.15), ("natural", 0.15), ("fim", 0.30))
    # After the curriculum, widen the copy map to real code before the mixture: half synthetic copy,
    # half unchanged rewrites, (vocab, steps, rows, tokens per row) per stage, target only (the copy
    # map is learned per token: a 512-token circuit copied nothing else).
    bridge_stages: tuple = ((1024, 40, 32, 128), (4096, 40, 32, 128), (4096, 60, 16, 256))
    mix_copy_span: tuple = (10, 160)  # synthetic copy span lengths inside the mixture
    peak_lr: float = 1e-3
    mix_lr: float = 0.0  # peak LR of the mixture phase (0: peak_lr)
    schedule: str = "cosine"  # mixture LR: "cosine" to min_lr_ratio, or "linear_tail" (constant, then linear)
    decay_fraction: float = 0.35  # linear_tail: the last fraction of the mixture decays linearly
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    draft_every: int = 3  # the draft trains on every n-th mixture batch (it needs fewer steps)
    probe_every: int = 100  # mixture steps between probes that pick the kept weights (0: keep the last)
    exit_weight: float = 0.25  # per early-exit layer
    exit_stride: int = 3  # early-exit loss on every 3rd position (the LM head is a large part of the cost)
    checkpoint_every: int = 200
    log_every: int = 20
    max_context: int = 1024


@dataclass
class TrainResult:
    steps: int = 0
    tokens_seen: int = 0
    copy_steps: int = 0
    wall_s: float = 0.0
    final_loss: float = float("nan")
    rescue_steps: int = 0  # the copy-rescue fine-tune (training/rescue.py) after the main run
    rescue_warm_steps: int = 0
    rescue_tokens: int = 0
    rescue_wall_s: float = 0.0
    rescue_probes: list = field(default_factory=list)
    finish_steps: int = 0  # the FIM finishing phase (training/finish.py) after the main run
    finish_tokens: int = 0
    finish_wall_s: float = 0.0
    finish_best_step: int = 0
    finish_probes: list = field(default_factory=list)
    context_steps: int = 0  # the context-copy phase (training/context_copy.py) after the finishing phase
    context_tokens: int = 0
    context_wall_s: float = 0.0
    context_best_step: int = 0
    context_probes: list = field(default_factory=list)
    from_shipped: bool = False  # only the context-copy phase ran, from the shipped finish weights
    resumed: bool = False  # the phases after the main run ran in a later invocation (--resume)
    bridge_steps: int = 0
    probes: list = field(default_factory=list)  # (mixture step, probe score) during the main run
    best_step: int = -1  # mixture step whose weights were kept (-1: the last)
    history: list = field(default_factory=list)


def build_llama(shape: Shape, vocab_size: int, eos_id: int, max_context: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=max_context,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=None,
        tie_word_embeddings=TIE_EMBEDDINGS,  # RoPE theta: the default, 10,000
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


@contextmanager
def capture_layer_outputs(model, layer_indices):
    """Collect the residual stream after the given decoder layers during one forward."""
    outputs: dict[int, torch.Tensor] = {}
    handles = []
    for index in layer_indices:

        def hook(_module, _args, output, index=index):
            outputs[index] = output[0] if isinstance(output, tuple) else output

        handles.append(model.model.layers[index].register_forward_hook(hook))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def exit_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """An early exit: an intermediate residual stream through the final norm and the LM head."""
    return model.lm_head(model.model.norm(hidden))


def target_loss(
    model, ids: torch.Tensor, targets: torch.Tensor, exit_weight: float, stride: int, offset: int
) -> tuple[torch.Tensor, float]:
    """Next-token CE at the last layer plus weighted CE at each earlier exit (subsampled positions)."""
    exits = list(range(model.config.num_hidden_layers - 1))
    with capture_layer_outputs(model, exits) as hidden_by_layer:
        logits = model(input_ids=ids).logits  # [B, T, V]
    final = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
    total = final
    sub_targets = targets[:, offset::stride]  # [B, T/stride]
    for index in exits if exit_weight > 0 else ():
        hidden = hidden_by_layer[index][:, offset::stride]  # [B, T/stride, D]
        early = exit_logits(model, hidden)  # [B, T/stride, V]
        total = total + exit_weight * F.cross_entropy(
            early.flatten(0, 1).float(), sub_targets.flatten(), ignore_index=IGNORE
        )
    return total, final.item()


def make_optimizer(model, lr: float):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95)
    )


def lr_at(step: int, mix_start: int | None, config: TrainConfig) -> float:
    """Warmup, constant through the copy curriculum, then the mixture's schedule (cosine, or
    constant with a linear tail) from ``mix_lr``."""
    if step < config.warmup_steps:
        return config.peak_lr * (step + 1) / config.warmup_steps
    if mix_start is None:
        return config.peak_lr
    peak = config.mix_lr or config.peak_lr
    progress = min(1.0, (step - mix_start) / max(1, config.total_steps - mix_start))
    floor = config.min_lr_ratio
    if config.schedule == "linear_tail":
        tail = max(0.0, progress - (1 - config.decay_fraction)) / max(1e-9, config.decay_fraction)
        return peak * (1 - (1 - floor) * min(1.0, tail))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch(
    maker: ExampleMaker,
    rng: random.Random,
    kinds: list[str],
    weights: list[float],
    rows: int,
    length: int,
    vocab: int,
    device="cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    picked = [rng.choices(kinds, weights)[0] for _ in range(rows)]
    built = [maker.row(kind, length, vocab) for kind in picked]
    ids = torch.tensor([row.ids[:-1] for row in built], device=device)  # [B, T]
    targets = torch.tensor([row.targets[1:] for row in built], device=device)  # [B, T]
    return ids, targets


def optimizer_step(model, optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def set_lr(optimizer, value: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = value


def train(
    target,
    draft,
    maker: ExampleMaker,
    config: TrainConfig,
    checkpoint_dir: Path,
    log=print,
    probe: Callable[[object], float] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> TrainResult:
    """Curriculum, bridge, mixture. With ``probe`` (a score of the target, higher is better) and
    ``config.probe_every``, the target keeps the mixture weights with the best score (ties go to the
    later step), so a late regression cannot ship; the draft keeps its last weights."""
    rng = random.Random(config.seed + 1)
    torch.manual_seed(config.seed)
    device = next(target.parameters()).device
    # bf16 matmuls (autocast keeps fp32 weights and optimizer state) are ~2x faster on CPU.
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
    target.train()
    draft.train()
    target_opt = make_optimizer(target, config.peak_lr)
    draft_opt = make_optimizer(draft, config.peak_lr)
    result = TrainResult()
    start = time.perf_counter()
    stage, stage_steps, mix_start = 0, 0, None
    recent: list[float] = []
    best_score, best_state = -1.0, None
    bridge = [(vocab, rows, length) for vocab, steps, rows, length in config.bridge_stages for _ in range(steps)]
    step = 0
    while mix_start is None or step < config.total_steps:
        lr = lr_at(step, mix_start, config)
        if mix_start is None:
            vocab, goal, cap = config.copy_stages[stage]
            ids, targets = batch(maker, rng, ["copy"], [1.0], *config.copy_batch, vocab, device)
        elif result.bridge_steps < len(bridge):
            vocab, rows, length = bridge[result.bridge_steps]
            ids, targets = batch(maker, rng, ["copy", "identity"], [0.5, 0.5], rows, length, vocab, device)
            result.bridge_steps += 1
            lr = config.mix_lr or config.peak_lr
        else:
            kinds, weights = zip(*config.mixture)
            ids, targets = batch(maker, rng, list(kinds), list(weights), *config.mix_batch, 4096, device)
        mixing = mix_start is not None and result.bridge_steps >= len(bridge) and step >= mix_start
        mixed = step - mix_start if mix_start is not None else -1  # steps into the mixture (while mixing: >= 0)
        set_lr(target_opt, lr)

        with autocast():
            # No early-exit loss while copying is formed: it pulls the first layers towards
            # predicting tokens themselves, which competes with the two-layer induction circuit.
            exit_weight = config.exit_weight if mixing else 0.0
            loss, final = target_loss(target, ids, targets, exit_weight, config.exit_stride, step % config.exit_stride)
        optimizer_step(target, target_opt, loss)

        draft_ce = torch.tensor(float("nan"))
        # The draft skips the copy curriculum (it is a plain small LM) and trains on every
        # draft_every-th mixture batch.
        if mixing and mixed % config.draft_every == 0:
            draft_step = mixed // config.draft_every
            set_lr(draft_opt, lr * min(1.0, (draft_step + 1) / config.warmup_steps))
            with autocast():
                draft_logits = draft(input_ids=ids).logits  # [B, T, V]
                draft_ce = F.cross_entropy(draft_logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
            optimizer_step(draft, draft_opt, draft_ce)

        result.steps = step + 1
        result.tokens_seen += ids.numel()
        result.final_loss = final
        recent = (recent + [final])[-20:]
        if mix_start is None:
            stage_steps += 1
            if (len(recent) == 20 and sum(recent) / 20 < goal) or stage_steps >= cap:
                log(
                    f"step {step}: copy stage vocab={vocab} done after {stage_steps} steps "
                    f"(copy loss {sum(recent) / len(recent):.3f})"
                )
                stage, stage_steps, recent = stage + 1, 0, []
                if stage == len(config.copy_stages):
                    result.copy_steps = step + 1
                    mix_start = step + 1 + len(bridge)
                    config.total_steps = mix_start + config.mix_steps
                    maker.copy_span = config.mix_copy_span
        if step % config.log_every == 0:
            elapsed = time.perf_counter() - start
            phase = "copy" if mix_start is None else ("mix" if mixing else "bridge")
            entry = {
                "step": step,
                "loss": round(final, 4),
                "draft_loss": round(draft_ce.item(), 4),
                "lr": round(lr, 6),
                "phase": phase,
                "tokens": result.tokens_seen,
                "elapsed_s": round(elapsed, 1),
                "tokens_per_s": round(result.tokens_seen / elapsed, 1),
            }
            result.history.append(entry)
            log(json.dumps(entry))
        stopping = mixing and stop()
        if mixing and probe is not None and config.probe_every:
            mix_step = mixed + 1
            if mix_step % config.probe_every == 0 or step + 1 == config.total_steps or stopping:
                score = probe(target)
                result.probes.append((mix_step, round(score, 4)))
                log(f"mixture step {mix_step}: probe {score:.3f}")
                if score >= best_score:
                    best_score, result.best_step = score, mix_step
                    best_state = copy.deepcopy(target.state_dict())
        if (step + 1) % config.checkpoint_every == 0:
            result.wall_s = time.perf_counter() - start
            save_checkpoint(checkpoint_dir, target, draft, result, config)
        step += 1
        if stopping:
            log(f"stop requested: ending the mixture after step {step}")
            break
    if best_state is not None:
        target.load_state_dict(best_state)
        log(f"kept the target's weights from mixture step {result.best_step} (probe {best_score:.3f})")
    result.wall_s = time.perf_counter() - start
    save_checkpoint(checkpoint_dir, target, draft, result, config)
    return result


MAIN_CHECKPOINT = "checkpoint.pt"  # the main run (what --resume continues from)
FINISHED_CHECKPOINT = "finished.pt"  # after the finishing phase (what --export-only prefers)


def save_checkpoint(
    directory: Path, target, draft, result: TrainResult, config: TrainConfig, name: str = MAIN_CHECKPOINT
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (name + ".tmp")
    torch.save(
        {
            "target": target.state_dict(),
            "draft": draft.state_dict(),
            "result": asdict(result),
            "config": asdict(config),
        },
        tmp,
    )
    tmp.replace(directory / name)


def load_checkpoint(directory: Path, target, draft, name: str = MAIN_CHECKPOINT) -> TrainResult:
    state = torch.load(directory / name, map_location="cpu", weights_only=False)
    target.load_state_dict(state["target"])
    draft.load_state_dict(state["draft"])
    return TrainResult(**state["result"])


def export(model, tokenizer, directory: Path) -> None:
    """bf16 safetensors (half the bytes; loads as float32 on CPU) + the tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    # An (empty) __init__.py makes the directory a package, so setuptools' package-data globs
    # (*.json, *.safetensors) ship the weights in a non-editable install.
    (directory / "__init__.py").touch()
    model.to(torch.float32)
