"""The steps of ``train-default`` in order: corpus, tokenizer, rows, models, training, export, card."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from collections import Counter
from pathlib import Path

import torch

from training import corpus
from training.examples import ExampleMaker
from training.tokenizer import train_tokenizer
from training.trainer import (
    DRAFT_SHAPE,
    FINISHED_CHECKPOINT,
    MAIN_CHECKPOINT,
    TARGET_SHAPE,
    TrainConfig,
    TrainResult,
    build_llama,
    export,
    load_checkpoint,
    save_checkpoint,
    train,
)

log = logging.getLogger(__name__)
VOCAB_SIZE = 4096


def default_out() -> Path:
    """The package's model directory (codespec/models/default), where the shipped pair lives."""
    from codespec.core.default_model import DEFAULT_DIR

    return DEFAULT_DIR


class Pipeline:
    def __init__(self, seed: int, threads: int, work: Path, out: Path | None, device: str = "cpu") -> None:
        self.seed = seed
        self.device = device
        self.work = Path(work)
        self.out = Path(out) if out is not None else default_out()
        torch.set_num_threads(threads)
        self.threads = threads
        self.work.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.work / "train.log", "a", encoding="utf-8")

    def say(self, message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def prepare(self) -> None:
        started = time.perf_counter()
        files = corpus.stdlib_files()
        self.train_files, self.heldout_files = corpus.split_files(files)
        texts = [f.text for f in self.train_files]
        self.tokenizer = train_tokenizer(texts, VOCAB_SIZE)
        eos = self.tokenizer.eos_token_id
        stream: list[int] = []
        for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]:
            stream += ids
            stream.append(eos)
        self.stream = stream
        special = set(self.tokenizer.all_special_ids)
        counts = Counter(stream)
        frequent = [i for i, _ in counts.most_common() if i not in special]
        frequent += [i for i in range(len(self.tokenizer)) if i not in special and i not in counts]
        functions = [body for f in self.train_files for body in corpus.functions(f.text)]
        self.maker = ExampleMaker(self.tokenizer, texts, functions, stream, frequent, random.Random(self.seed))
        self.target = build_llama(TARGET_SHAPE, len(self.tokenizer), eos, TrainConfig.max_context, self.seed)
        self.draft = build_llama(DRAFT_SHAPE, len(self.tokenizer), eos, TrainConfig.max_context, self.seed + 7)
        self.corpus_info = {
            "train_files": len(self.train_files),
            "heldout_files": len(self.heldout_files),
            "train_chars": sum(len(t) for t in texts),
            "train_tokens": len(stream),
            "train_functions": len(functions),
        }
        self.say(f"prepared in {time.perf_counter() - started:.1f} s: {json.dumps(self.corpus_info)}")

    def train(self, mix_steps: int) -> TrainResult:
        from training.probe import copy_and_fim_scorer

        config = TrainConfig(seed=self.seed, mix_steps=mix_steps)
        self.train_config = config
        score = copy_and_fim_scorer(self.tokenizer, self.heldout_files)
        self.say(
            f"training (copy curriculum, bridge, then {mix_steps} mixture steps) on {self.device}: "
            f"target {count(self.target)} params, draft {count(self.draft)}"
        )
        return train(
            self.target.to(self.device),
            self.draft.to(self.device),
            self.maker,
            config,
            self.work,
            log=self.say,
            probe=score,
            stop=(self.work / "STOP").exists,
        )

    def rescue(self, steps: int, decay_fraction: float | None = None, probe_count: int | None = None):
        from dataclasses import replace

        from training.rescue import RescueConfig, rescue

        config = RescueConfig(seed=self.seed, steps=steps)
        if decay_fraction is not None:
            config = replace(config, decay_fraction=decay_fraction)
        if probe_count is not None:
            config = replace(config, probe_functions=probe_count)
        self.rescue_config = config
        # The evaluation uses the first 40 held-out functions; the probe the ones after them.
        probe_functions = corpus.heldout_functions(40 + config.probe_functions, files=self.heldout_files)[40:]
        self.say(f"copy-rescue fine-tune: {steps} steps, mixture {config.mixture}")
        return rescue(
            self.target,
            self.tokenizer,
            self.maker,
            probe_functions,
            config,
            log=self.say,
            stop=(self.work / "STOP").exists,
        )

    def finish(self, result: TrainResult, steps: int) -> None:
        """The FIM finishing phase on the main run's target; ``result`` records it, and the
        finished weights go to their own checkpoint (the main one stays what --resume needs)."""
        from dataclasses import replace

        from training.finish import FinishConfig, finish
        from training.probe import copy_and_fim_scorer

        config = replace(FinishConfig(seed=self.seed), steps=steps)
        self.finish_config = config
        score = copy_and_fim_scorer(self.tokenizer, self.heldout_files, count=config.probe_functions)
        self.say(f"FIM finishing phase: {steps} steps, mixture {config.mixture}")
        finished = finish(
            self.target.to(self.device), self.maker, config, score, log=self.say, stop=(self.work / "STOP").exists
        )
        result.finish_steps, result.finish_tokens = finished.steps, finished.tokens_seen
        result.finish_wall_s, result.finish_best_step = finished.wall_s, finished.best_step
        result.finish_probes = finished.probes
        result.tokens_seen += finished.tokens_seen
        self.save(result, FINISHED_CHECKPOINT)

    def context_copy(self, result: TrainResult, steps: int, **overrides) -> None:
        """The context-copy phase, from the target as exported (bf16-rounded: ``export`` leaves the
        in-memory weights rounded too, so a full run and ``--from-shipped`` start alike)."""
        from dataclasses import replace

        from training.context_copy import ContextCopyConfig
        from training.finish import finish
        from training.probe import context_copy_scorer

        config = replace(ContextCopyConfig(seed=self.seed + ContextCopyConfig.seed), steps=steps, **overrides)
        self.context_config = config
        score = context_copy_scorer(
            self.tokenizer,
            self.heldout_files,
            count=config.probe_functions,
            fim_tolerance=config.fim_tolerance,
            log=self.say,
        )
        self.say(f"context-copy phase: {steps} steps, mixture {config.mixture}")
        done = finish(
            self.target.to(self.device), self.maker, config, score, log=self.say, stop=(self.work / "STOP").exists
        )
        result.context_steps, result.context_tokens = done.steps, done.tokens_seen
        result.context_wall_s, result.context_best_step = done.wall_s, done.best_step
        result.context_probes = done.probes
        result.tokens_seen += done.tokens_seen

    def load_shipped(self, start: Path | None = None) -> TrainResult:
        """The exported pair in ``start`` (default: the package's codespec/models/default, the shipped
        finish weights) as the starting weights, and the record of the run that made them
        (``training/runs/shipped-finish.json``: its main run and finishing phase). The phase's
        output still goes to ``out``, so it can be written elsewhere than the weights it starts from."""
        from safetensors.torch import load_file

        start = Path(start) if start is not None else default_out()
        record = json.loads((Path(__file__).parent / "runs" / "shipped-finish.json").read_text())
        check_finish_weights(start, record)
        for model, name in ((self.target, "target"), (self.draft, "draft")):
            state = load_file(str(start / name / "model.safetensors"))
            model.load_state_dict({key: value.float() for key, value in state.items()})
        fields = {field.name for field in dataclasses.fields(TrainResult)}  # the record also holds digests
        result = TrainResult(**{key: value for key, value in record.items() if key in fields})
        result.from_shipped = True
        self.say(
            f"started from the shipped target in {start} (recorded run: main {result.steps} steps, "
            f"finishing {result.finish_steps}); writing to {self.out}"
        )
        return result

    def save(self, result: TrainResult, name: str = MAIN_CHECKPOINT) -> None:
        save_checkpoint(
            self.work,
            self.target,
            self.draft,
            result,
            getattr(self, "train_config", None) or TrainConfig(seed=self.seed),
            name,
        )

    def restore(self, prefer_finished: bool = False) -> TrainResult:
        name = (
            FINISHED_CHECKPOINT if prefer_finished and (self.work / FINISHED_CHECKPOINT).exists() else MAIN_CHECKPOINT
        )
        result = load_checkpoint(self.work, self.target, self.draft, name)
        self.say(f"restored {name} (main run step {result.steps}, finishing step {result.finish_steps})")
        return result

    def export(self) -> None:
        self.target, self.draft = self.target.cpu(), self.draft.cpu()
        export(self.target, self.tokenizer, self.out / "target")
        export(self.draft, self.tokenizer, self.out / "draft")
        self.say(f"exported to {self.out}")

    def evaluate_and_write_card(
        self, result: TrainResult, card_path: Path, completion_records: list[dict] | None = None
    ) -> None:
        from training.card import write_card
        from training.evaluate import evaluate

        metrics = evaluate(
            self.out / "target", self.out / "draft", self.heldout_files, self.say, completion_records=completion_records
        )
        write_card(
            card_path,
            result,
            metrics,
            self.corpus_info,
            {"target": count(self.target), "draft": count(self.draft)},
            self.threads,
            getattr(self, "rescue_config", None),
            getattr(self, "finish_config", None),
            getattr(self, "context_config", None),
        )
        (self.work / "metrics.json").write_text(json.dumps(metrics, indent=1))
        self.say(f"model card written to {card_path}")


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def check_finish_weights(start: Path, record: dict) -> None:
    """The context-copy phase must start from the finish weights the record names; the package now
    ships the phase's output, so starting from it would run the phase twice."""
    import hashlib

    for name in ("target", "draft"):
        path = start / name / "model.safetensors"
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        if digest != record[f"finish_{name}_sha256"]:
            commit = record["finish_commit"]
            raise SystemExit(
                f"{path}: not the finish weights the context-copy phase starts from (sha256 {digest[:12]}, "
                f"expected {record[f'finish_{name}_sha256'][:12]}). Write them from commit {commit}: "
                f"for m in target draft; do mkdir -p DIR/$m; git show {commit}:codespec/models/default/$m/"
                f"model.safetensors > DIR/$m/model.safetensors; done; then pass --start DIR"
            )
