"""GGUF on llama.cpp, side by side in one run (docs/gguf.md, "Measured"): codespec's drafting on
llama.cpp against llama-cpp-python's own greedy decoding and its ``LlamaPromptLookupDecoding``,
and against codespec on PyTorch fp32, on the same checkpoint and the same prompt ids.

    python -P bench/gguf.py prepare --dir /tmp/gguf-bench            # checkpoint + f16/q8_0/q4_k_m
    python -P bench/gguf.py run --dir /tmp/gguf-bench --workload edits --out docs/bench/gguf-edits.json

Replay mode (bench/replay.py): every forward runs for real and the recorded output (the commit's
edited text, the completion's real continuation) is forced by a logit bias, so a random-weight
model of a published shape costs what the real one costs and every configuration emits the same
tokens (the report checks that they do). The bias reaches llama-cpp-python as a logits processor,
applied at every position it samples, drafted or not. Configurations run interleaved, request by
request; rates are tokens after the first over the time from the first to the last (decode), and
whole-request tokens over wall time (end to end, prefill included).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "workloads"
WORKLOADS = {"edits": "edits-httpx.jsonl", "completions": "completions-httpx.jsonl"}
TYPES = ("q8_0", "q4_k_m")
PLD_TOKENS = 10  # LlamaPromptLookupDecoding's default num_pred_tokens


def prepare(directory: Path, shape: str, seed: int = 0) -> None:
    from bench.shapes import save_shape
    from codespec.core.gguf_export import export_gguf, quantize

    directory.mkdir(parents=True, exist_ok=True)
    checkpoint = directory / "checkpoint"
    if not (checkpoint / "config.json").is_file():
        save_shape(shape, checkpoint, dtype="float32", seed=seed)
    f16 = directory / "model-f16.gguf"
    if not f16.is_file():
        export_gguf(checkpoint, f16, "f16")
    for kind in TYPES:
        if not (directory / f"model-{kind}.gguf").is_file():
            quantize(f16, directory / f"model-{kind}.gguf", kind)
    print(f"prepared {directory}: {sorted(p.name for p in directory.iterdir())}")


class ReplayBias:
    """llama-cpp-python logits processor: the recorded token at each output position gets the bias.

    llama-cpp-python hands a processor every token evaluated so far (drafted ones included), not
    the sampled position's prefix; it samples the output positions in order, one call each, so a
    counter is the output position."""

    def __init__(self, output_ids: list[int], end_id: int, strength: float) -> None:
        self.output_ids, self.end_id, self.strength = output_ids, end_id, strength
        self.calls = 0

    def __call__(self, _input_ids, scores):
        index, self.calls = self.calls, self.calls + 1
        token = self.output_ids[index] if index < len(self.output_ids) else None
        if index == len(self.output_ids):
            token = self.end_id
        if token is not None:
            scores[token] += self.strength
        return scores


def llama_cpp_run(model, prompt_ids: list[int], recording, end_id: int, max_new: int) -> tuple[list[int], list[float]]:
    """llama-cpp-python's generate (temperature 0) with the replay bias; token times."""
    from llama_cpp import LogitsProcessorList

    from bench.replay import REPLAY_BIAS

    bias = ReplayBias(list(recording.output_ids), end_id, REPLAY_BIAS)
    output, times = [], []
    for token in model.generate(prompt_ids, temp=0.0, reset=True, logits_processor=LogitsProcessorList([bias])):
        output.append(int(token))
        times.append(time.perf_counter())
        if len(output) >= max_new or token == end_id:
            break
    return output, times


def codespec_run(
    target, prompt_ids, proposer, max_new: int, max_draft: int = 64
) -> tuple[list[int], list[float], dict]:
    from codespec.core.config import GenerationLimits, SamplingParams
    from codespec.core.decode import Finished, StepEvent, generate

    output, times, stats = [], [], {}
    limits = GenerationLimits(max_new, (), max_draft_len=max_draft if proposer is not None else 0)
    for event in generate(target, prompt_ids, proposer, SamplingParams(), limits):
        if isinstance(event, StepEvent):
            now = time.perf_counter()
            for token in event.token_ids:
                output.append(int(token))
                times.append(now)
        elif isinstance(event, Finished):
            stats = event.stats.summary()
    return output, times, stats


def run(args) -> dict:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from bench.replay import Recording, ReplayTarget
    from bench.workload import load_cases
    from codespec.core.llama_cpp_target import LlamaCppTarget
    from codespec.core.prompts import PromptRenderer
    from codespec.proposers.assembly import ProposerAssembly
    from codespec.proposers.setup import RequestContext

    directory = Path(args.dir)
    threads = args.threads
    targets = {kind: LlamaCppTarget(directory / f"model-{kind}.gguf", threads=threads) for kind in args.types}
    first = next(iter(targets.values()))
    renderer = PromptRenderer(first.tokenizer, first.prompt_format)
    cases = load_cases(
        SHARED / WORKLOADS[args.workload], args.requests + args.warm_up, args.max_chars, args.stride, renderer=renderer
    )
    end_id = min(first.eos_token_ids)
    workspace = None
    if args.workload == "completions":
        from bench.sim_workload import load_workspace
        from codespec.index import WorkspaceIndex

        workspace = WorkspaceIndex(first.tokenizer, None)
        for uri, text in load_workspace(SHARED / "workspace-httpx.jsonl"):
            workspace.add_document(uri, text)
    peers = {}
    for kind in args.types:
        path = str(directory / f"model-{kind}.gguf")
        common = dict(n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False, flash_attn=False)
        peers[f"llama-greedy/{kind}"] = Llama(path, **common)
        peers[f"llama-pld/{kind}"] = Llama(
            path, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS), logits_all=True, **common
        )
    torch_target = None
    if args.torch:
        from codespec.core.model import TargetModel

        torch_target = ReplayTarget(
            TargetModel.load(str(directory / "checkpoint")), vocab_limit=first.tokenizer.vocab_size
        )
    replayed = {kind: ReplayTarget(target, vocab_limit=None) for kind, target in targets.items()}
    configs = [*peers, *(f"codespec-{p}/{k}" for k in args.types for p in ("none", "auto"))]
    if torch_target is not None:
        configs.append("codespec-auto/torch-fp32")
    # one assembly per configuration, as a server has one: auto's cost fits and acceptance
    # statistics carry over from request to request (proposers/assembly.py)
    assemblies = {
        name: ProposerAssembly(
            torch_target if name.endswith("torch-fp32") else replayed[name.partition("/")[2]], shipped_draft=False
        )
        for name in configs
        if name.startswith("codespec-auto")
    }
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for number, case in enumerate(cases):
        prompt_ids = first.encode(case.prompt)[: first.max_context - args.max_new - 1]
        output_ids = first.encode(case.output)[: args.max_new]
        recording = Recording(tuple(prompt_ids), tuple(output_ids), end_id)
        request = RequestContext(
            reference=case.reference,
            reference_start=case.reference_start,
            index=workspace,
            uri=case.uri if workspace is not None else None,
            cursor=case.cursor if workspace is not None else None,
        )
        shift = number % len(configs)
        for name in [*configs[shift:], *configs[:shift]]:
            start = time.perf_counter()
            stats: dict = {}
            if name in peers:
                output, times = llama_cpp_run(peers[name], prompt_ids, recording, end_id, args.max_new)
            else:
                proposer_name, _, kind = name.removeprefix("codespec-").partition("/")
                target = torch_target if kind == "torch-fp32" else replayed[kind]
                assert target is not None  # a configuration is run only where its target was built
                for each in (torch_target, *replayed.values()):
                    if each is not None:
                        each.recordings = type(each.recordings)()
                target.recordings.add(recording)
                proposer = assemblies[name].create("auto", request) if proposer_name == "auto" else None
                output, times, stats = codespec_run(target, prompt_ids, proposer, args.max_new)
            end = time.perf_counter()
            if number < args.warm_up:
                continue  # a warm-up request: the policy learns the costs, nothing is recorded
            decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
            results[name].append(
                {
                    "tokens": len(output),
                    "output": output,
                    "ttft_ms": (times[0] - start) * 1e3 if times else None,
                    "decode_tokens_per_s": (len(output) - 1) / decode_s if decode_s > 0 else None,
                    "e2e_tokens_per_s": len(output) / (end - start),
                    "tokens_per_forward": stats.get("tokens_per_forward"),
                }
            )
        print(f"request {number + 1}/{len(cases)}: {len(prompt_ids)} prompt tokens", file=sys.stderr, flush=True)
    return report(args, cases, results)


def equivalence(args) -> dict:
    """Real mode (no bias): codespec's greedy with drafts against llama-cpp-python's own greedy, per
    request; at a first difference, the logit gap between the two tokens from a fresh prefill
    (how near a tie the batched and one-token kernels disagreed)."""
    from llama_cpp import Llama

    from bench.workload import load_cases
    from codespec.core.config import GenerationLimits, SamplingParams
    from codespec.core.decode import generate_all
    from codespec.core.llama_cpp_target import LlamaCppTarget
    from codespec.core.prompts import PromptRenderer
    from codespec.proposers.assembly import ProposerAssembly
    from codespec.proposers.setup import RequestContext

    rows = []
    for kind in args.types:
        path = Path(args.dir) / f"model-{kind}.gguf"
        target = LlamaCppTarget(path, threads=args.threads)
        peer = Llama(str(path), n_ctx=4096, n_threads=args.threads, verbose=False, flash_attn=False)
        renderer = PromptRenderer(target.tokenizer, target.prompt_format)
        cases = load_cases(
            SHARED / WORKLOADS[args.workload], args.requests, args.max_chars, args.stride, renderer=renderer
        )
        assembly = ProposerAssembly(target, shipped_draft=False)
        for case in cases:
            prompt_ids = target.encode(case.prompt)
            own: list[int] = []
            for token in peer.generate(prompt_ids, temp=0.0, reset=True):
                own.append(int(token))
                if len(own) >= args.max_new or token in target.eos_token_ids:
                    break
            proposer = assembly.create("auto", RequestContext(reference=case.reference))
            limits = GenerationLimits(args.max_new, (), max_draft_len=64)
            got = list(generate_all(target, prompt_ids, proposer, SamplingParams(), limits).token_ids)
            differ = next((i for i, (a, b) in enumerate(zip(got, own)) if a != b), None)
            gap = None
            if differ is not None:
                logits = target.forward([*prompt_ids, *own[:differ]], target.new_cache())[0]
                gap = abs(float(logits[got[differ]] - logits[own[differ]]))
            rows.append({"type": kind, "id": case.id, "tokens": len(own), "first_difference": differ, "logit_gap": gap})
            print(f"{kind} {case.id}: difference at {differ} (gap {gap})", file=sys.stderr, flush=True)
    return {
        "workload": args.workload,
        "mode": "real",
        "requests": rows,
        "identical": sum(row["first_difference"] is None for row in rows),
        "of": len(rows),
    }


def report(args, cases, results: dict[str, list[dict]]) -> dict:
    def median(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    table = {}
    for name, rows in results.items():
        kind = name.partition("/")[2]
        baseline = results.get(f"llama-greedy/{kind}") or results[next(iter(results))]
        ratios = [
            r["decode_tokens_per_s"] / b["decode_tokens_per_s"]
            for r, b in zip(rows, baseline)
            if r["decode_tokens_per_s"] and b["decode_tokens_per_s"]
        ]
        e2e = [r["e2e_tokens_per_s"] / b["e2e_tokens_per_s"] for r, b in zip(rows, baseline)]
        table[name] = {
            "decode_tokens_per_s_p50": median([r["decode_tokens_per_s"] for r in rows]),
            "decode_vs_llama_greedy_p50": median(ratios),
            "e2e_vs_llama_greedy_p50": median(e2e),
            "ttft_ms_p50": median([r["ttft_ms"] for r in rows]),
            "tokens_per_forward_p50": median([r["tokens_per_forward"] for r in rows]),
            "identical_to_llama_greedy": sum(r["output"] == b["output"] for r, b in zip(rows, baseline)),
            "requests": len(rows),
        }
    return {
        "workload": args.workload,
        "requests": len(cases) - args.warm_up,
        "warm_up_requests": args.warm_up,
        "max_new_tokens": args.max_new,
        "max_chars": args.max_chars,
        "threads": args.threads,
        "machine": f"{platform.processor() or platform.machine()}, {args.cores} cores",
        "mode": "replay",
        "configs": table,
    }


LABELS = {"llama-pld": "LlamaPromptLookupDecoding", "codespec-none": "codespec plain", "codespec-auto": "codespec auto"}


def plot(reports: list[tuple[str, dict]], path: Path) -> None:
    """Decode rate against llama.cpp greedy (median over requests), a group of bars per report and
    quantization: what docs/gguf.md's tables say, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = []
    for title, report in reports:
        kinds = dict.fromkeys(name.partition("/")[2] for name in report["configs"])
        groups += [(f"{title}\n{kind.upper()}", report["configs"], kind) for kind in kinds]
    figure, axes = plt.subplots(figsize=(2.4 * len(groups) + 1.5, 4.2))
    width = 0.8 / len(LABELS)
    for number, (config, label) in enumerate(LABELS.items()):
        values = [
            table.get(f"{config}/{kind}", {}).get("decode_vs_llama_greedy_p50") or 0.0 for _, table, kind in groups
        ]
        positions = [index + (number - (len(LABELS) - 1) / 2) * width for index in range(len(groups))]
        bars = axes.bar(positions, values, width, label=label)
        axes.bar_label(bars, fmt="%.2f", fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(groups)), [name for name, _, _ in groups], fontsize=8)
    axes.set_ylabel("decode tokens/s vs llama.cpp greedy (median)")
    axes.set_title("0.5B shape on llama.cpp, 2 cores, replay mode (docs/gguf.md)", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare")
    prep.add_argument("--dir", required=True, type=Path)
    prep.add_argument("--shape", default="qwen2.5-coder-0.5b")
    go = sub.add_parser("run")
    go.add_argument("--dir", required=True)
    go.add_argument("--workload", choices=tuple(WORKLOADS), default="edits")
    go.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    go.add_argument("--requests", type=int, default=8)
    go.add_argument("--stride", type=int, default=7)
    go.add_argument("--max-new", type=int, default=128)
    go.add_argument("--max-chars", type=int, default=1500)
    go.add_argument("--threads", type=int, default=2)
    go.add_argument("--warm-up", type=int, default=1, help="requests run first and not recorded")
    go.add_argument("--torch", action="store_true", help="also codespec auto on PyTorch fp32 (the same checkpoint)")
    go.add_argument("--out", type=Path, default=None)
    go.add_argument("--equivalence", action="store_true", help="real mode: codespec vs llama.cpp greedy tokens")
    draw = sub.add_parser("plot", help="a bar chart of run reports (TITLE=FILE.json ...)")
    draw.add_argument("reports", nargs="+", help="TITLE=FILE.json, one group of bars per report and quantization")
    draw.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.dir, args.shape)
        return 0
    if args.command == "plot":
        pairs = [item.partition("=") for item in args.reports]
        plot([(title, json.loads(Path(file).read_text())) for title, _, file in pairs], args.out)
        return 0
    if args.torch and os.environ.get("OMP_WAIT_POLICY") != "PASSIVE":
        # torch's OpenMP threads spin after each PyTorch forward and slow the llama.cpp forwards
        # that follow in this process (auto then priced drafts from those times and drafted none,
        # docs/gguf.md); passive threads sleep instead. The policy is read when OpenMP loads: re-run.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "bench.gguf", *(sys.argv[1:] if argv is None else argv)])
    args.cores = len(os.sched_getaffinity(0))
    result = equivalence(args) if args.equivalence else run(args)
    result["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY")
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
