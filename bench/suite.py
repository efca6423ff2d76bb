"""One bench invocation: models, cases, configurations, the main run, sweeps, offered load.

The result is the JSON of the issue's contract: ``{"mode", "workloads", "configs": {NAME: {...}}}``
where ``configs`` aggregates every workload (each workload's own table is under
``workloads[NAME]["configs"]``), plus ``sweeps``, ``load`` and ``setup``.
"""

from __future__ import annotations

import functools
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.engine import CODESPEC_CONFIGS
from bench.measure import MemoryProbe, cpu_model
from bench.peers import HF_CONFIGS
from bench.run import BASELINE, Prepared, RunSettings, make_runners, prepare, run_interleaved, summarize
from codespec.core.config import SERVE_MAX_DRAFT, SamplingParams
from codespec.core.errors import CodespecError
from codespec.core.prompts import PromptRenderer

log = logging.getLogger(__name__)

ALL_CONFIGS = (*CODESPEC_CONFIGS, *HF_CONFIGS)
SWEEP_CONFIGS = ("greedy", "auto", "hf-pld")  # what each sweep point re-runs (greedy for its speedup)


@dataclass
class BenchPlan:
    workloads: list[Path]
    workspace: Path | None
    mode: str
    configs: list[str]
    model: str | None = None
    model_shape: str | None = None
    draft: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_requests: int | None = None
    stride: int = 1
    max_chars: int | None = None
    token_budget: int | None = None  # estimated output tokens per workload (a profile's sample size)
    max_new_tokens: list[int] = field(default_factory=lambda: [128])
    draft_len: list[int] = field(default_factory=lambda: [SERVE_MAX_DRAFT])
    temperature: list[float] = field(default_factory=lambda: [0.0])
    top_p: list[float] = field(default_factory=lambda: [1.0])
    context_chars: list[int] = field(default_factory=list)  # sweep values of the prompt window
    sweep_requests: int | None = None
    concurrency: list[int] = field(default_factory=list)
    load_requests: int = 8
    slo_ttft_ms: float = 500.0
    seed: int = 0
    profile: str | None = None
    threads: int | None = None  # torch CPU threads (None: torch's default)
    peer_kernels: str = "stock"  # transformers peers: "stock" (as users run them) or "codespec"


def check_configs(configs: Sequence[str]) -> list[str]:
    unknown = [name for name in configs if name not in ALL_CONFIGS]
    if unknown:
        raise CodespecError(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(ALL_CONFIGS)}")
    names = list(dict.fromkeys(configs))
    if BASELINE not in names:
        names.insert(0, BASELINE)  # speedup and equivalence are relative to it
    return names


def run_plan(plan: BenchPlan, say: Callable[[str], None] = print) -> dict:
    import torch

    from bench.models import load_models
    from bench.replay import ReplayTarget
    from codespec.core.prompts import stop_token_ids

    configs = check_configs(plan.configs)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    needs_draft = any(name in ("draft", "hf-assisted") for name in configs)
    started = time.perf_counter()
    models = load_models(plan.model, plan.model_shape, plan.draft, plan.device, plan.dtype, needs_draft)
    if needs_draft and models.draft_path is None:
        raise CodespecError(
            "configurations draft / hf-assisted need a draft model: pass --draft PATH "
            "(or a shape name: a random draft of that shape)"
        )
    raw = models.target
    end_ids = frozenset(raw.eos_token_ids | stop_token_ids(raw.tokenizer))
    # a random published shape: only the tokenizer's ids (its head's first rows) may be chosen
    limit = len(raw.tokenizer) if plan.model_shape and raw.vocab_size > len(raw.tokenizer) else None
    target = ReplayTarget(raw, end_ids, vocab_limit=limit)
    say(f"bench: target {models.description}; device {raw.device}; mode {plan.mode}")
    probe = MemoryProbe(raw.device)
    built = _Configs(configs, raw, models, plan, end_ids)

    first = RunSettings(
        plan.mode,
        plan.max_new_tokens[0],
        plan.draft_len[0],
        SamplingParams(plan.temperature[0], 0, plan.top_p[0], plan.seed),
    )
    report: dict = {
        "mode": plan.mode,
        "workloads": {},
        "configs": {},
        "sweeps": [],
        "load": None,
        "setup": _setup(plan, models, configs, first),
    }
    all_results: dict[str, list] = {name: [] for name in configs}
    workload_cases = {}
    renderer = PromptRenderer(target.tokenizer, target.prompt_format)  # as the server renders them
    for path in plan.workloads:
        from bench.workload import load_cases

        cases = load_cases(
            path, plan.max_requests, plan.max_chars, plan.stride, plan.token_budget, plan.max_new_tokens[0], renderer
        )
        workload_cases[path.stem] = cases
        index = built.index_for(cases)
        prepared = _prepare_all(target, cases, first, end_ids)
        say(f"bench: {path.stem}: {len(prepared)} requests x {len(configs)} configurations ({plan.mode})")
        codespec_configs = built.codespec(index)
        runners = make_runners(configs, target, codespec_configs, built.hf(), first, probe)
        _warm_up(runners, prepared[0])
        results = run_interleaved(prepared, runners, functools.partial(_say_for, say, path.stem))
        report["workloads"][path.stem] = {
            "records": len(prepared),
            "kind": prepared[0].case.kind,
            "prompt_tokens": [len(item.prompt_ids) for item in prepared],
            "configs": _table(results, not first.sampling.greedy),
        }
        if "auto" in codespec_configs:
            report["workloads"][path.stem]["auto_policy"] = codespec_configs["auto"].policy_summary()
        for name in configs:
            all_results[name].extend(results[name])
        if target.recordings:
            raise RuntimeError("replay recordings were left registered")
    report["configs"] = _table(all_results, not first.sampling.greedy)
    report["replay_forced_rows"] = target.biased_rows
    report["sweeps"] = _sweeps(plan, target, built, workload_cases, first, end_ids, probe, say)
    if plan.concurrency:
        from bench.load import run_load

        cases = [case for cases in workload_cases.values() for case in cases]
        report["load"] = run_load(target, raw, models, cases, plan, first, say)
    report["setup"]["wall_s"] = round(time.perf_counter() - started, 1)
    return report


class _Configs:
    """Configuration objects, built once per run (model proposers and policies persist)."""

    def __init__(self, configs, raw, models, plan: BenchPlan, end_ids) -> None:
        self.configs, self.raw, self.models, self.plan, self.end_ids = configs, raw, models, plan, end_ids
        self._hf: dict | None = None
        self._workspace = None
        if any(name in ("index", "auto") for name in configs) and plan.workspace is not None:
            from bench.sim_workload import load_workspace

            self._workspace = load_workspace(plan.workspace)

    def index_for(self, cases):
        if not any(name in ("index", "auto") for name in self.configs):
            return None
        from bench.sim_run import build_index

        return build_index(self.raw.tokenizer, self._workspace or [])

    def codespec(self, index, names: Sequence[str] | None = None) -> dict:
        from bench.engine import CodespecConfig

        wanted = [n for n in (names or self.configs) if n in CODESPEC_CONFIGS]
        return {
            name: CodespecConfig(name, self.raw, self.models.draft_path, index if name in ("index", "auto") else None)
            for name in wanted
        }

    def hf(self) -> dict:
        if self._hf is None:
            from bench.peers import HFConfig
            from codespec.proposers.early_exit import default_exit_layer

            exit_layer = default_exit_layer(self.raw.num_layers)
            stock = self.plan.peer_kernels == "stock"
            tokens = len(self.raw.tokenizer)
            limit = tokens if self.plan.model_shape and self.raw.vocab_size > tokens else None
            self._hf = {
                name: HFConfig(name, self.raw.model, self.end_ids, self.models.draft_hf, exit_layer, stock, limit)
                for name in self.configs
                if name in HF_CONFIGS
            }
        return self._hf


def _prepare_all(target, cases, settings: RunSettings, end_ids) -> list[Prepared]:
    prepared = [p for p in (prepare(target, case, settings, end_ids) for case in cases) if p is not None]
    if not prepared:
        raise CodespecError("every request's prompt is longer than the model's context")
    return prepared


def _warm_up(runners: dict, item: Prepared) -> None:
    """One short request per configuration first: the first forward of each code path allocates."""
    short = replace(item, max_new_tokens=min(4, item.max_new_tokens), recording=None)
    for run in runners.values():
        run(short)


def _say_for(say, stem: str, line: str) -> None:
    say(f"  {stem}: {line}")


def _table(results: dict[str, list], sampling: bool) -> dict:
    baseline = results.get(BASELINE)
    return {name: summarize(rows, baseline, sampling) for name, rows in results.items()}


def _sweeps(
    plan: BenchPlan, target, built: _Configs, workload_cases: dict, first: RunSettings, end_ids, probe, say
) -> list[dict]:
    """One point per extra value of each swept parameter, on a few requests, configurations
    ``SWEEP_CONFIGS`` (those of the run), everything else as in the main run."""
    points: list[tuple[str, float, RunSettings, int | None]] = []
    for value in plan.draft_len[1:]:
        points.append(("draft_len", value, replace(first, draft_len=value), None))
    for value in plan.max_new_tokens[1:]:
        points.append(("max_new_tokens", value, replace(first, max_new_tokens=value), None))
    for temperature in plan.temperature[1:]:
        points.append(
            (
                "temperature",
                temperature,
                replace(first, sampling=replace(first.sampling, temperature=temperature)),
                None,
            )
        )
    sampled = max(plan.temperature) or 1.0  # top-p only acts when sampling
    for top_p in plan.top_p[1:]:
        points.append(
            ("top_p", top_p, replace(first, sampling=replace(first.sampling, temperature=sampled, top_p=top_p)), None)
        )
    for chars in plan.context_chars:
        points.append(("context_chars", chars, first, chars))
    names = [n for n in built.configs if n in SWEEP_CONFIGS]
    sweeps = []
    for parameter, point_value, settings, point_chars in points:
        from bench.workload import load_cases

        for workload, cases in workload_cases.items():
            if point_chars is not None:
                path = next(p for p in plan.workloads if p.stem == workload)
                cases = load_cases(
                    path,
                    plan.max_requests,
                    point_chars,
                    plan.stride,
                    plan.token_budget,
                    settings.max_new_tokens,
                    PromptRenderer(target.tokenizer, target.prompt_format),
                )
            cases = cases[: plan.sweep_requests] if plan.sweep_requests else cases
            prepared = _prepare_all(target, cases, settings, end_ids)
            say(f"bench: sweep {parameter}={point_value} on {workload}: {len(prepared)} requests x {len(names)}")
            runners = make_runners(
                names, target, built.codespec(built.index_for(cases), names), built.hf(), settings, probe
            )
            results = run_interleaved(prepared, runners)
            sweeps.append(
                {
                    "parameter": parameter,
                    "value": point_value,
                    "workload": workload,
                    "records": len(prepared),
                    "configs": _table(results, not settings.sampling.greedy),
                }
            )
    return sweeps


def _setup(plan: BenchPlan, models, configs, first: RunSettings) -> dict:
    import torch

    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {_cpu_count()} CPUs, {platform.system()}",
        "cpu_model": _cpu_model(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "transformers": __import__("transformers").__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "model": models.description,
        "prompt_format": models.target.prompt_format.name,
        "draft": models.draft_description,
        "profile": plan.profile,
        "configs": list(configs),
        "peer_kernels": plan.peer_kernels,
        "packed_linears": getattr(models.target, "packed_linears", 0),
        "max_new_tokens": first.max_new_tokens,
        "draft_len": first.draft_len,
        "temperature": first.sampling.temperature,
        "top_p": first.sampling.top_p,
        "max_requests": plan.max_requests,
        "stride": plan.stride,
        "max_chars": plan.max_chars,
        "token_budget": plan.token_budget,
        "workloads": [str(p) for p in plan.workloads],
        "workspace": str(plan.workspace) if plan.workspace else None,
    }


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cpu_model() -> str:
    return cpu_model() or platform.processor()
