"""Copy-rescue fine-tune: a short copy-heavy phase after the main run that restores copying.

The main run's natural mixture erased the copy (induction) circuit the curriculum had formed
(0% of held-out functions copied). This phase starts from that checkpoint and trains the target on
mostly copy work (unchanged rewrites and long full-vocabulary synthetic spans) with some natural
code and FIM so those skills are kept, at a constant LR with a short linear decay. Every
``probe_every`` steps a greedy copy probe on a few held-out functions scores the model; the
best-scoring weights are kept (ties go to the later step), so a late collapse cannot ship.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from training.examples import ExampleMaker
from training.probe import copy_probe
from training.trainer import batch, make_optimizer, optimizer_step, target_loss


@dataclass
class RescueConfig:
    seed: int = 0
    steps: int = 500
    batch: tuple[int, int] = (8, 512)  # rows, tokens per row
    mixture: tuple = (("identity", 0.35), ("rewrite", 0.10), ("copy", 0.30), ("natural", 0.10), ("fim", 0.15))
    copy_span: tuple = (10, 160)  # held-out functions are up to ~130 tokens
    copy_vocab: int = 4096  # synthetic copy rows in the mixture use the most frequent tokens
    # First re-form the copy circuit on pure synthetic copy over a small vocabulary (as the main
    # run's curriculum did): (vocab, mean-loss goal, step cap) per stage, no early-exit loss.
    warm_stages: tuple = ((64, 0.4, 300), (512, 0.4, 200))
    warm_batch: tuple[int, int] = (32, 128)
    warm_span: tuple = (10, 60)
    warm_lr: float = 1e-3
    # Then generalise it: the copy map is learned per token (a 64- or 512-token circuit copies nothing
    # else: measured 7-11 nats on wider spans), so widen the vocabulary on synthetic copy half and
    # unchanged rewrites of real code half: (vocab, steps, rows, tokens per row).
    bridge_stages: tuple = ((1024, 40, 32, 128), (4096, 40, 32, 128), (4096, 60, 16, 256))
    lr: float = 5e-4
    decay_fraction: float = 0.35  # linear decay to 10% over the last part (0.15: copy rate 50% vs 57.5%)
    exit_weight: float = 0.25
    exit_stride: int = 3
    probe_every: int = 50
    probe_functions: int = 20  # 10 were too noisy to pick by (one function = 10 points)
    log_every: int = 10


@dataclass
class RescueResult:
    steps: int = 0
    tokens_seen: int = 0
    wall_s: float = 0.0
    warm_steps: int = 0
    best_step: int = 0
    best_probe: float = -1.0
    probes: list = field(default_factory=list)  # (step, copy rate)


def rescue_lr(step: int, config: RescueConfig) -> float:
    decay_start = int(config.steps * (1 - config.decay_fraction))
    if step < decay_start:
        return config.lr
    progress = (step - decay_start) / max(1, config.steps - decay_start)
    return config.lr * (1 - 0.9 * progress)


def copy_step(target, optimizer, ids, targets, exit_stride: int) -> float:
    """One optimizer step on copy rows (no early-exit loss); returns the loss on the copied part."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        loss, final = target_loss(target, ids, targets, 0.0, exit_stride, 0)
    optimizer_step(target, optimizer, loss)
    return final


def rescue(
    target,
    tokenizer,
    maker: ExampleMaker,
    probe_functions: list[str],
    config: RescueConfig,
    log: Callable[[str], None] = print,
    stop: Callable[[], bool] = lambda: False,
) -> RescueResult:
    """Fine-tune ``target`` in place; on return it holds the weights with the best copy probe."""
    rng = random.Random(config.seed + 101)
    torch.manual_seed(config.seed + 101)
    maker.rng = random.Random(config.seed + 202)  # same rows whether resumed or run straight through
    target.train()
    device = next(target.parameters()).device
    optimizer = make_optimizer(target, config.lr)
    kinds, weights = (list(x) for x in zip(*config.mixture))
    result = RescueResult()
    best_state = None
    start = time.perf_counter()

    def probe(step: int) -> None:
        nonlocal best_state
        rate = copy_probe(target, tokenizer, probe_functions)
        result.probes.append((step, rate))
        log(f"rescue step {step}: copy probe {rate:.2f} on {len(probe_functions)} held-out functions")
        if rate >= result.best_probe:
            result.best_probe, result.best_step = rate, step
            best_state = copy.deepcopy(target.state_dict())

    maker.copy_span = config.warm_span
    for vocab, goal, cap in config.warm_stages:
        recent: list[float] = []
        for stage_step in range(cap):
            ids, targets = batch(maker, rng, ["copy"], [1.0], *config.warm_batch, vocab, device)
            for group in optimizer.param_groups:
                group["lr"] = config.warm_lr
            final = copy_step(target, optimizer, ids, targets, config.exit_stride)
            result.warm_steps += 1
            result.tokens_seen += ids.numel()
            recent = (recent + [final])[-20:]
            if stage_step % config.log_every == 0:
                log(
                    json.dumps(
                        {
                            "warm_vocab": vocab,
                            "step": stage_step,
                            "copy_loss": round(final, 4),
                            "elapsed_s": round(time.perf_counter() - start, 1),
                        }
                    )
                )
            if len(recent) == 20 and sum(recent) / 20 < goal:
                break
        log(f"warm copy stage vocab={vocab}: {stage_step + 1} steps, copy loss {sum(recent) / len(recent):.3f}")
    for vocab, steps, rows, length in config.bridge_stages:
        for stage_step in range(steps):
            ids, targets = batch(maker, rng, ["copy", "identity"], [0.5, 0.5], rows, length, vocab, device)
            final = copy_step(target, optimizer, ids, targets, config.exit_stride)
            result.warm_steps += 1
            result.tokens_seen += ids.numel()
            if stage_step % config.log_every == 0:
                log(
                    json.dumps(
                        {
                            "bridge_vocab": vocab,
                            "step": stage_step,
                            "copy_loss": round(final, 4),
                            "elapsed_s": round(time.perf_counter() - start, 1),
                        }
                    )
                )
    probe(0)
    maker.copy_span = config.copy_span
    for step in range(config.steps):
        ids, targets = batch(maker, rng, kinds, weights, *config.batch, config.copy_vocab, device)
        for group in optimizer.param_groups:
            group["lr"] = rescue_lr(step, config)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, final = target_loss(
                target, ids, targets, config.exit_weight, config.exit_stride, step % config.exit_stride
            )
        optimizer_step(target, optimizer, loss)
        result.steps = step + 1
        result.tokens_seen += ids.numel()
        if step % config.log_every == 0:
            elapsed = time.perf_counter() - start
            log(
                json.dumps(
                    {
                        "rescue_step": step,
                        "loss": round(final, 4),
                        "lr": round(rescue_lr(step, config), 6),
                        "elapsed_s": round(elapsed, 1),
                    }
                )
            )
        if (step + 1) % config.probe_every == 0 or step + 1 == config.steps:
            probe(step + 1)
            if result.best_probe == 1.0 and step + 1 >= config.steps // 2:
                log("copy probe perfect: stopping early")
                break
            if stop():
                log("stop requested: ending the fine-tune at this probe")
                break
    result.wall_s = time.perf_counter() - start
    if best_state is not None:
        target.load_state_dict(best_state)
    log(
        f"rescue done: {result.steps} steps, {result.wall_s:.0f} s, best probe {result.best_probe:.2f} "
        f"at step {result.best_step}"
    )
    return result
