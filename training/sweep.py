"""Recipe search for ``train-default`` on a GPU: several recipes at once, each at the CPU budget.

A recipe that fits the 90-minute CPU budget takes a few minutes on a GPU, so candidate schedules
and mixtures are compared side by side at exactly the step counts the CPU run would use: the
corpus and tokenizer are prepared once, then one process per recipe (forked, sharing the GPU)
trains, probes and scores its target on the 40 evaluation functions (copy rate and FIM validity,
batched as in ``probe.py``). The chosen recipe becomes ``TrainConfig``'s defaults and the shipped
weights come from a CPU run of ``codespec train-default``.

    python -m training.sweep --out DIR [--stdlib DIR] [--cap-s 420] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import replace
from pathlib import Path

BRIDGE = ((1024, 40, 32, 128), (4096, 40, 32, 128), (4096, 60, 16, 256))
KEEP = dict(bridge_stages=BRIDGE, mix_copy_span=(10, 160), draft_every=2, probe_every=100, mix_steps=3200)
RESCUE_MIX = (("identity", 0.35), ("rewrite", 0.10), ("copy", 0.30), ("natural", 0.10), ("fim", 0.15))
BALANCED = (("identity", 0.25), ("rewrite", 0.15), ("copy", 0.15), ("natural", 0.25), ("fim", 0.20))
FIM_HEAVY = (("identity", 0.25), ("rewrite", 0.10), ("copy", 0.15), ("natural", 0.20), ("fim", 0.30))
COPY_FIM = (("identity", 0.30), ("rewrite", 0.05), ("copy", 0.25), ("natural", 0.15), ("fim", 0.25))
IDENTITY_FIM = (("identity", 0.35), ("rewrite", 0.05), ("copy", 0.15), ("natural", 0.15), ("fim", 0.30))
RESCUE_FIM = (("identity", 0.35), ("rewrite", 0.05), ("copy", 0.25), ("natural", 0.10), ("fim", 0.25))

# name -> (TrainConfig overrides, copy-rescue steps after the main run)
PREVIOUS = dict(
    mix_steps=1100,
    mixture=(("natural", 0.45), ("rewrite", 0.30), ("fim", 0.20), ("copy", 0.05)),
    bridge_stages=(),
    mix_copy_span=(10, 60),
    draft_every=1,
    probe_every=0,
)
RECIPES: dict[str, tuple[dict, int]] = {
    "baseline": (PREVIOUS, 2100),  # the previous recipe: natural main run, then the copy rescue
    "rescuemix-5e-4": ({**KEEP, "mixture": RESCUE_MIX, "mix_lr": 5e-4, "schedule": "linear_tail"}, 0),
    "rescuemix-1e-3": ({**KEEP, "mixture": RESCUE_MIX, "mix_lr": 1e-3, "schedule": "linear_tail"}, 0),
    "balanced-5e-4": ({**KEEP, "mixture": BALANCED, "mix_lr": 5e-4, "schedule": "linear_tail"}, 0),
    "balanced-1e-3-cos": ({**KEEP, "mixture": BALANCED, "mix_lr": 1e-3, "schedule": "cosine"}, 0),
    "fimheavy-5e-4": ({**KEEP, "mixture": FIM_HEAVY, "mix_lr": 5e-4, "schedule": "linear_tail"}, 0),
    "copyfim-5e-4": ({**KEEP, "mixture": COPY_FIM, "mix_lr": 5e-4, "schedule": "linear_tail"}, 0),
    # Not a CPU-budget recipe: twice the mixture steps, to see how much headroom more data buys.
    "copyfim-5e-4-2x": ({**KEEP, "mixture": COPY_FIM, "mix_lr": 5e-4, "schedule": "linear_tail", "mix_steps": 6400}, 0),
    # Second round, around the best copier (rescuemix-1e-3), aiming at FIM validity.
    "rescuemix-1e-3-seed1": ({**KEEP, "mixture": RESCUE_MIX, "mix_lr": 1e-3, "schedule": "linear_tail", "seed": 1}, 0),
    "rescuemix-1e-3-decay50": (
        {**KEEP, "mixture": RESCUE_MIX, "mix_lr": 1e-3, "schedule": "linear_tail", "decay_fraction": 0.5},
        0,
    ),
    "copyfim-1e-3": ({**KEEP, "mixture": COPY_FIM, "mix_lr": 1e-3, "schedule": "linear_tail"}, 0),
    "copyfim-1e-3-draft4": (
        {**KEEP, "mixture": COPY_FIM, "mix_lr": 1e-3, "schedule": "linear_tail", "draft_every": 4, "mix_steps": 3500},
        0,
    ),
    "idfim-1e-3": ({**KEEP, "mixture": IDENTITY_FIM, "mix_lr": 1e-3, "schedule": "linear_tail"}, 0),
    "idfim-7e-4": ({**KEEP, "mixture": IDENTITY_FIM, "mix_lr": 7e-4, "schedule": "linear_tail"}, 0),
    "idfim-1e-3-cos": ({**KEEP, "mixture": IDENTITY_FIM, "mix_lr": 1e-3, "schedule": "cosine"}, 0),
    "rescuefim-1e-3": ({**KEEP, "mixture": RESCUE_FIM, "mix_lr": 1e-3, "schedule": "linear_tail"}, 0),
}


def run_recipe(name: str, pipeline, out: Path, cap_s: float, device: str, smoke: bool = False) -> dict:
    import torch

    from training import corpus, probe
    from training.evaluate import fim_split
    from training.rescue import RescueConfig, rescue
    from training.trainer import TrainConfig, train

    overrides, rescue_steps = RECIPES[name]
    torch.set_num_threads(1)
    log_file = open(out / "sweep.log", "a", buffering=1, encoding="utf-8")

    def say(message: str) -> None:
        log_file.write(f"[{time.strftime('%H:%M:%S')}] {name}: {message}\n")

    started = time.perf_counter()
    stop = lambda: time.perf_counter() - started > cap_s  # noqa: E731
    target, draft = pipeline.target.to(device), pipeline.draft.to(device)
    tokenizer = pipeline.tokenizer
    probe_fns = corpus.heldout_functions(probe.PROBE_START + probe.PROBE_COUNT, files=pipeline.heldout_files)[
        probe.PROBE_START :
    ]
    eval_fns = corpus.heldout_functions(probe.PROBE_START, files=pipeline.heldout_files)
    eval_splits = [s for s in (fim_split(fn) for fn in eval_fns) if s is not None]
    score = probe.copy_and_fim_scorer(tokenizer, pipeline.heldout_files)

    config = replace(TrainConfig(seed=pipeline.seed), **overrides)
    if smoke:  # a few steps of every phase, to check the plumbing
        config = replace(
            config,
            copy_stages=((64, 0.0, 3), (4096, 0.0, 2)),
            mix_steps=6,
            probe_every=3,
            bridge_stages=config.bridge_stages[:1] and ((1024, 2, 4, 64),),
        )
        rescue_steps = min(rescue_steps, 4)
    result = train(target, draft, pipeline.maker, config, out / f"ckpt-{name}", log=say, probe=score, stop=stop)
    record = {
        "name": name,
        "overrides": {k: v for k, v in overrides.items()},
        "steps": result.steps,
        "copy_steps": result.copy_steps,
        "bridge_steps": result.bridge_steps,
        "tokens": result.tokens_seen,
        "train_s": round(result.wall_s, 1),
        "probes": result.probes,
        "best_step": result.best_step,
        "final_loss": result.final_loss,
    }
    if rescue_steps:
        rescue_config = replace(RescueConfig(seed=pipeline.seed), steps=rescue_steps)
        if smoke:
            rescue_config = replace(
                rescue_config, warm_stages=((64, 0.0, 2),), bridge_stages=((1024, 2, 4, 64),), probe_every=2
            )
        rescued = rescue(target, tokenizer, pipeline.maker, probe_fns, rescue_config, log=say, stop=stop)
        record.update(rescue_steps=rescued.steps, rescue_probes=rescued.probes, rescue_s=round(rescued.wall_s, 1))
    record["copy_rate"] = probe.copy_probe(target, tokenizer, eval_fns)
    record["fim_valid"] = probe.fim_probe(target, tokenizer, eval_splits)
    record["wall_s"] = round(time.perf_counter() - started, 1)
    record["stopped_early"] = stop()
    say(f"RESULT {json.dumps(record)}")
    export_dir = out / f"model-{name}"
    from training.trainer import export

    export(target.cpu(), tokenizer, export_dir / "target")
    export(draft.cpu(), tokenizer, export_dir / "draft")
    return record


def _child(name, pipeline, out, cap_s, device, smoke, queue) -> None:
    try:
        queue.put(run_recipe(name, pipeline, out, cap_s, device, smoke))
    except Exception:  # a broken recipe must not hide the others' results
        queue.put({"name": name, "error": traceback.format_exc()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stdlib", type=Path, default=None, help="train on this standard-library tree")
    parser.add_argument("--cap-s", type=float, default=420.0, help="wall-time cap per recipe")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--smoke", action="store_true", help="a few steps per phase (plumbing check)")
    args = parser.parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if args.stdlib is not None:
        from training import corpus

        corpus.stdlib_root = lambda: args.stdlib
    from training.pipeline import Pipeline

    args.out.mkdir(parents=True, exist_ok=True)
    pipeline = Pipeline(0, 1, args.out / "work", args.out / "unused")
    pipeline.prepare()
    names = args.only or list(RECIPES)
    context = mp.get_context("fork")  # CUDA is first touched in the children
    queue = context.Queue()
    children = [
        context.Process(target=_child, args=(n, pipeline, args.out, args.cap_s, args.device, args.smoke, queue))
        for n in names
    ]
    for child in children:
        child.start()
    results = [queue.get() for _ in children]
    for child in children:
        child.join()
    results.sort(key=lambda r: -(r.get("copy_rate", 0) + r.get("fim_valid", 0)))
    (args.out / "sweep.json").write_text(json.dumps(results, indent=1))
    for r in results:
        print(
            r["name"],
            r.get("copy_rate"),
            r.get("fim_valid"),
            r.get("steps"),
            r.get("train_s"),
            r.get("stopped_early"),
            (r.get("error") or "")[-300:],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
