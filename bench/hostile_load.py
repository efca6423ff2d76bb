"""Hostile load on a real `codespec serve --http`: memory under huge bodies, small requests beside a
big one, over-long requests under a crowd (docs/benchmarks.md, "Hostile load").

    python -m bench.hostile_load --seed 0 --json docs/bench/hostile-load-shipped.json

Starts the server as a user does (a subprocess, the shipped model unless ``--model``), then:

- **sequential**: 12 prompts of 2 MB, one after the other (each is longer than the context: 400);
  the server's RSS before and after (settled), so what a refused request leaves resident shows;
- **parallel**: 8 bodies of 3.9 MB at once (under the 4 MiB body limit); the peak RSS
  (``VmHWM``, reset before the phase through ``/proc/PID/clear_refs``) and the statuses;
- **beside a big one**: a client sends an 8-token completion every 100 ms; for ``--window`` seconds
  alone, then for as long again while a second client sends big prompts back to back (2 MB, and
  a mid-size one under the character bound but over the context, which must be tokenized in part
  to be refused); the small ones' p50/p95 in each window;
- **crowd**: 64, then 128 clients sending short completions (a fifth of them cancelled by the
  client at a random moment) while one client sends over-long prompts; every request must be
  answered (429 with Retry-After counts as answered), and the over-long ones' latency is reported.

Client-side clocks (httpx); the server's RSS from ``/proc/PID/status``. Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

TOKEN = "bench-hostile"
SOURCE = Path(__file__).resolve().parents[1] / "codespec" / "service" / "engine" / "service.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rss_mb(pid: int) -> float:
    return round(status_kb(pid, "VmRSS") / 1024, 1)


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def peak_mb(pid: int) -> float:
    return round(status_kb(pid, "VmHWM") / 1024, 1)


@functools.cache
def source_text() -> str:
    return SOURCE.read_text()


def code_text(rng: random.Random, chars: int) -> str:
    """``chars`` characters of real code (this repository's engine module, from a seeded offset)."""
    source = source_text()
    start = rng.randrange(len(source))
    whole = source[start:] + source * (chars // len(source) + 2)
    return whole[:chars]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 1)


def raise_of(alone: list[float], beside: list[float]) -> float | None:
    before, after = pct(alone, 0.95), pct(beside, 0.95)
    return None if before is None or after is None else round(after - before, 1)


def median(values: list[float | None]) -> float | None:
    present = sorted(value for value in values if value is not None)
    return present[len(present) // 2] if present else None


def summary(latencies: list[float]) -> dict:
    return {"n": len(latencies), "p50_ms": pct(latencies, 0.5), "p95_ms": pct(latencies, 0.95)}


class Server:
    """`codespec serve --http` in a subprocess, on a free loopback port."""

    def __init__(self, model: str | None, extra: list[str]) -> None:
        self.port = free_port()
        self.command = [
            sys.executable,
            "-m",
            "codespec",
            "serve",
            "--http",
            "--port",
            str(self.port),
            "--token",
            TOKEN,
            "--quiet",
            *(["--model", model] if model else []),
            *extra,
        ]
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.process.stderr.read() if self.process.stderr else ''}")
            try:
                if httpx.get(self.url + "/v1/models", headers=headers(), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def headers() -> dict:
    return {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def completion(prompt: str, max_tokens: int) -> bytes:
    return json.dumps({"model": "codespec", "prompt": prompt, "max_tokens": max_tokens}).encode()


async def post(client, body: bytes) -> tuple[int, float, dict]:
    start = time.perf_counter()
    response = await client.post("/v1/completions", content=body, headers=headers())
    return response.status_code, time.perf_counter() - start, dict(response.headers)


def new_client(url: str, timeout_s: float = 120.0):
    import httpx

    return httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=httpx.Limits(max_connections=None))


async def settle(pid: int, seconds: float) -> float:
    await asyncio.sleep(seconds)
    return rss_mb(pid)


async def sequential(server: Server, rng: random.Random, count: int, chars: int) -> dict:
    pid = server.process.pid
    async with new_client(server.url) as client:
        before = await settle(pid, 1.0)
        statuses, latencies, after_each = [], [], []
        for _ in range(count):
            status, elapsed, _ = await post(client, completion(code_text(rng, chars), 8))
            statuses.append(status)
            latencies.append(elapsed)
            after_each.append(rss_mb(pid))
        after = await settle(pid, 2.0)
    return {
        "prompts": count,
        "prompt_chars": chars,
        "statuses": sorted(set(statuses)),
        "latency": summary(latencies),
        "rss_before_mb": before,
        "rss_after_each_mb": after_each,
        "rss_after_mb": after,
        "growth_mb": round(after - before, 1),
    }


async def parallel(server: Server, rng: random.Random, count: int, body_bytes: int) -> dict:
    pid = server.process.pid
    overhead = len(completion("", 8))
    bodies = [completion(code_text(rng, body_bytes - overhead), 8) for _ in range(count)]
    async with new_client(server.url) as client:
        before = await settle(pid, 1.0)
        reset_peak(pid)
        results = await asyncio.gather(*(post(client, body) for body in bodies))
        peak = peak_mb(pid)
        after = await settle(pid, 2.0)
    return {
        "bodies": count,
        "body_bytes": len(bodies[0]),
        "statuses": sorted({status for status, _, _ in results}),
        "latency": summary([elapsed for _, elapsed, _ in results]),
        "rss_before_mb": before,
        "peak_rss_mb": peak,
        "rss_after_mb": after,
    }


def sender_main(url: str, chars_list: list[int], seed: int, gap_s: float, active, stop, out) -> None:
    """A process of its own (its own GIL, connection and clock, so sending big bodies costs the
    measured clients nothing): while ``active`` is set, post prompts of ``chars_list``'s sizes in
    turn, ``gap_s`` apart; at ``stop``, put (chars, status, seconds, retry_after) for each on ``out``."""
    import httpx

    rng = random.Random(seed)
    bodies = [(chars, completion(code_text(rng, chars), 8)) for chars in chars_list]
    results: list[tuple[int, int | str, float, bool]] = []
    with httpx.Client(base_url=url, timeout=120.0) as client:
        index = 0
        while not stop.is_set():
            if not active.wait(0.05):
                continue
            chars, body = bodies[index % len(bodies)]
            index += 1
            start = time.perf_counter()
            try:
                response = client.post("/v1/completions", content=body, headers=headers())
                results.append(
                    (chars, response.status_code, time.perf_counter() - start, "retry-after" in response.headers)
                )
            except httpx.HTTPError as error:
                results.append((chars, f"unanswered ({type(error).__name__})", time.perf_counter() - start, False))
            stop.wait(gap_s)
    out.put(results)


class Sender:
    """:func:`sender_main` in a spawned process, started (and its bodies built) before it is needed."""

    def __init__(self, url: str, chars_list: list[int], seed: int, gap_s: float) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.active, self.stop, self.out = context.Event(), context.Event(), context.Queue()
        args = (url, chars_list, seed, gap_s, self.active, self.stop, self.out)
        self.process = context.Process(target=sender_main, args=args, daemon=True)
        self.process.start()

    def results(self) -> list[tuple[int, int | str, float, bool]]:
        self.active.clear()
        self.stop.set()
        results = self.out.get(timeout=300)
        self.process.join(timeout=30)
        return results


async def beside_big(server: Server, rng: random.Random, window_s: float, rounds: int, big_chars: int) -> dict:
    """Small completions every 100 ms through alternating windows: alone, then beside big prompts
    (one at a time, 0.5 s apart), ``rounds`` times; each window ``window_s`` long."""
    phases: dict[str, list[float]] = {"alone": [], "beside": []}
    per_round: list[dict[str, list[float]]] = [{"alone": [], "beside": []} for _ in range(rounds)]
    sender = Sender(server.url, [big_chars], rng.randrange(1 << 30), 0.5)
    await asyncio.sleep(3.0)  # the sender's start and its bodies, before any window
    async with new_client(server.url) as client:
        tasks = []
        for round_number in range(rounds):
            for label in ("alone", "beside"):
                if label == "beside":
                    sender.active.set()
                deadline = time.monotonic() + window_s
                # drawn from its own generator: how many a window sends depends on the clock, and
                # what the shared one draws next (the later phases' seeds) must not
                window_rng = random.Random(rng.randrange(1 << 30))
                while time.monotonic() < deadline:
                    # a prompt never sent before: a repeat would draft from its own earlier answer
                    body = completion(code_text(window_rng, window_rng.randint(200, 600)), 8)

                    async def one(label: str = label, round_number: int = round_number, body: bytes = body) -> None:
                        status, elapsed, _ = await post(client, body)
                        if status == 200:
                            phases[label].append(elapsed)
                            per_round[round_number][label].append(elapsed)

                    tasks.append(asyncio.ensure_future(one()))
                    await asyncio.sleep(0.1)
                sender.active.clear()
        await asyncio.gather(*tasks)
    big = await asyncio.to_thread(sender.results)
    alone, beside = summary(phases["alone"]), summary(phases["beside"])
    raised = (
        None if alone["p95_ms"] is None or beside["p95_ms"] is None else round(beside["p95_ms"] - alone["p95_ms"], 1)
    )
    return {
        "big_prompt_chars": big_chars,
        "big_requests": len(big),
        "big_statuses": sorted({str(status) for _, status, _, _ in big}),
        "big_latency": summary([elapsed for _, _, elapsed, _ in big]),
        "small_alone": alone,
        "small_beside": beside,
        "p95_raised_ms": raised,
        # each round's beside-minus-alone p95: the machine's load drifts less within a round
        "p95_raised_ms_by_round": [raise_of(r["alone"], r["beside"]) for r in per_round],
        "p95_raised_ms_median_of_rounds": median([raise_of(r["alone"], r["beside"]) for r in per_round]),
    }


async def crowd(server: Server, rng: random.Random, clients: int, seconds: float, long_chars: list[int]) -> dict:
    pid = server.process.pid
    counts: dict[str, int] = {}
    sender = Sender(server.url, long_chars, rng.randrange(1 << 30), 0.2)
    await asyncio.sleep(3.0)  # the sender's start and its bodies
    retry_after_missing = 0

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    async with new_client(server.url, timeout_s=120.0) as client:
        reset_peak(pid)
        deadline = time.monotonic() + seconds

        async def one_client(seed: int) -> None:
            nonlocal retry_after_missing
            local = random.Random(seed)
            while time.monotonic() < deadline:
                body = completion(code_text(local, local.randint(100, 1000)), local.randint(4, 32))
                cancel_after = local.uniform(0.0, 0.5) if local.random() < 0.2 else None
                try:
                    if cancel_after is None:
                        status, _, answer_headers = await post(client, body)
                        count(str(status))
                        if status == 429 and "retry-after" not in answer_headers:
                            retry_after_missing += 1
                            await asyncio.sleep(0.05)
                        elif status == 429:
                            await asyncio.sleep(local.uniform(0.05, 0.3))
                    else:
                        await asyncio.wait_for(post(client, body), cancel_after)
                        count("answered before the cancel")
                except TimeoutError:
                    count("cancelled")
                except Exception as error:  # no answer: what the target says must not happen
                    count(f"unanswered ({type(error).__name__})")

        sender.active.set()
        await asyncio.gather(*(one_client(rng.randrange(1 << 30)) for _ in range(clients)))
        long_results = await asyncio.to_thread(sender.results)
        peak = peak_mb(pid)
    return {
        "clients": clients,
        "seconds": seconds,
        "answers": dict(sorted(counts.items())),
        "unanswered": sum(value for key, value in counts.items() if key.startswith("unanswered")),
        "retry_after_missing": retry_after_missing,
        "over_long": {
            str(chars): {
                "statuses": dict(
                    sorted(collections.Counter(str(s) for c, s, _, _ in long_results if c == chars).items())
                ),
                "latency": summary([elapsed for c, _, elapsed, _ in long_results if c == chars]),
                "latency_400": summary([elapsed for c, s, elapsed, _ in long_results if c == chars and s == 400]),
            }
            for chars in long_chars
        },
        "peak_rss_mb": peak,
    }


async def run(args) -> dict:
    rng = random.Random(args.seed)
    server = Server(args.model, args.server_arg)
    try:
        await asyncio.to_thread(server.wait_ready)
        async with new_client(server.url) as client:  # warm: the first requests pay one-time costs
            for _ in range(3):
                await post(client, completion(code_text(rng, 300), 8))
        report: dict = {
            "command": " ".join(["python -m bench.hostile_load", *sys.argv[1:]]),
            "server": " ".join(server.command[2:]),
            "seed": args.seed,
            "cpus": os.cpu_count(),
            "rss_idle_mb": rss_mb(server.process.pid),
        }
        report["sequential"] = await sequential(server, rng, 12, 2_000_000)
        report["parallel"] = await parallel(server, rng, 8, 3_900_000)
        report["beside_big"] = [
            await beside_big(server, rng, args.window, args.rounds, chars) for chars in (2_000_000, args.mid_chars)
        ]
        report["crowd"] = [
            await crowd(server, rng, clients, args.crowd_seconds, [2_000_000, args.mid_chars])
            for clients in args.clients
        ]
        report["rss_end_mb"] = rss_mb(server.process.pid)
        report["server_alive"] = server.process.poll() is None
        return report
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="the server's --model (default: the shipped model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=float, default=3.0, help="seconds of each beside-big window")
    parser.add_argument("--rounds", type=int, default=3, help="alone / beside window pairs")
    parser.add_argument("--crowd-seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 128])
    parser.add_argument(
        "--mid-chars",
        type=int,
        default=40_000,
        help="an over-long prompt under the shipped model's character bound (it is tokenized in part)",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="one more argument for the server")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
