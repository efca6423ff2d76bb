"""The robustness soak's websocket half (``bench.soak``): `codespec serve --ws` as a subprocess,
random and broken messages from several connections, every request owed a final answer."""

from __future__ import annotations

import json
import random
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.soak_values import SERVE, SURROGATE_TEXT, Tally, answer_key, encode, memory_mb, mutate, position, random_text


class WsServer:
    """`codespec serve --ws` as a subprocess (its port read from stderr)."""

    def __init__(
        self, model: Path, token: str = "soak-token", max_message_bytes: int = 1 << 20, stderr_path: Path | None = None
    ) -> None:
        self.token = token
        self.stderr_path = stderr_path or Path(tempfile.mkstemp(prefix="codespec-ws-", suffix=".log")[1])
        self._stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            [
                *SERVE,
                "--ws",
                "--port",
                "0",
                "--token",
                token,
                "--model",
                str(model),
                "--device",
                "cpu",
                "--max-message-bytes",
                str(max_message_bytes),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        self.url = self._wait_for_port()

    def _wait_for_port(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"ws://([^\s/]+)/", self.stderr_path.read_text(errors="replace"))
            if match:
                return f"ws://{match.group(1)}/"
            if self.process.poll() is not None:
                raise RuntimeError(f"codespec serve --ws exited: {self.stderr_path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError("codespec serve --ws did not start")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def memory(self) -> dict[str, float]:
        return memory_mb(self.process.pid)

    def close(self) -> None:
        if self.alive:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._stderr.close()


@dataclass
class WsSend:
    text: str
    must: Any = None  # id that gets exactly one final message (done / cancelled / error / stats)
    kind: str = ""


def ws_message(rng, counter: list[int], max_message_bytes: int) -> WsSend:
    counter[0] += 1
    msg_id: Any = counter[0] if rng.random() < 0.5 else f"w-{counter[0]}"
    roll = rng.random()
    if roll < 0.55:
        kind = rng.choice(["complete", "complete", "edit", "stats"])
        if kind == "complete":
            body: dict[str, Any] = (
                {"prefix": random_text(rng, rng.choice([5, 80, 900])), "suffix": "\n"}
                if rng.random() < 0.6
                else {"document": (text := random_text(rng, 200)), "position": position(rng, text)}
            )
            body.update(rng.choice([{}, {"max_tokens": 4}, {"stop": ["\n"]}, {"temperature": 0.5, "max_tokens": 3}]))
        elif kind == "edit":
            body = {"text": random_text(rng, rng.choice([10, 60])), "max_tokens": 6}
        else:
            body = {}
        message = {"type": kind, "id": msg_id, **body}
        if rng.random() < 0.15:
            mutated = mutate(rng, message)
            text = encode(mutated if isinstance(mutated, dict) else message)
            return WsSend(text, kind=f"mutated:{kind}")  # answered, but maybe without its id (or the id mutated)
        return WsSend(json.dumps(message), msg_id, kind)
    if roll < 0.65:
        return WsSend(json.dumps({"type": "cancel", "id": rng.choice([msg_id, counter[0] - 1, "nope"])}), kind="cancel")
    fault = rng.choice(
        ["surrogate", "oversize", "not-json", "deep", "unknown-type", "no-id", "big-int", "array", "wrong-type"]
    )
    if fault == "surrogate":
        return WsSend(json.dumps({"type": "complete", "id": msg_id, "prefix": SURROGATE_TEXT}), msg_id, fault)
    if fault == "oversize":
        return WsSend(
            json.dumps({"type": "complete", "id": msg_id, "prefix": "x" * (max_message_bytes + 10)}), msg_id, fault
        )
    if fault == "not-json":
        return WsSend('{"type": "complete", "id": ' + json.dumps(msg_id) + ', "prefix": "x"', msg_id, fault)
    if fault == "deep":
        return WsSend(
            '{"type": "complete", "id": ' + json.dumps(msg_id) + ', "x": ' + "[" * 3000 + "]" * 3000 + "}",
            msg_id,
            fault,
        )
    if fault == "unknown-type":
        return WsSend(json.dumps({"type": "teleport", "id": msg_id}), msg_id, fault)
    if fault == "no-id":
        return WsSend(json.dumps({"type": "complete", "prefix": "x"}), kind=fault)
    if fault == "big-int":
        return WsSend(
            '{"type": "complete", "id": ' + json.dumps(msg_id) + ', "max_tokens": 1' + "0" * 5000 + "}", msg_id, fault
        )
    if fault == "array":
        return WsSend("[1, 2, 3]", kind=fault)
    return WsSend(
        json.dumps(
            {
                "type": "complete",
                "id": msg_id,
                "prefix": rng.choice([5, None, [1]]),
                "max_tokens": rng.choice([0, -1, "x", 10**9]),
            }
        ),
        msg_id,
        fault,
    )


FINAL_TYPES = {"done", "cancelled", "error", "stats"}


async def ws_connection(url: str, token: str, sends: list[WsSend], answer_timeout: float) -> tuple[dict, int]:
    """Send ``sends`` on one connection; return {id: [final messages]} for owed ids, and how many
    messages arrived in all."""
    import asyncio

    from websockets.asyncio.client import connect

    owed = {answer_key(send.must) for send in sends if send.must is not None}
    finals: dict[Any, list] = {}
    received = 0
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=64 << 20) as ws:
        for send in sends:
            await ws.send(send.text)
        deadline = asyncio.get_running_loop().time() + answer_timeout
        while not owed <= set(finals):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), left))
            except TimeoutError:
                break
            received += 1
            if message.get("type") in FINAL_TYPES and message.get("id") is not None:
                if message.get("type") == "error" and message.get("code") in ("unknown_id", "duplicate_id"):
                    continue  # a cancel that came late, or an id reused by a mutated message: not a final
                finals.setdefault(answer_key(message["id"]), []).append(message)
    return finals, received


def soak_ws(
    model: Path, messages: int, seed: int, batch: int = 12, connections: int = 2, answer_timeout: float = 120, log=print
) -> Tally:
    import asyncio

    rng = random.Random(seed)
    max_message_bytes = 64 << 10
    server = WsServer(model, max_message_bytes=max_message_bytes)
    tally = Tally()
    started = time.monotonic()
    counter = [0]
    try:
        tally.first_rss_mb = server.memory().get("VmRSS", 0.0)
        while tally.sent < messages and server.alive:
            plans = [[ws_message(rng, counter, max_message_bytes) for _ in range(batch)] for _ in range(connections)]
            results = asyncio.run(_gather(server, plans, answer_timeout))
            tally.batches += 1
            for plan, (finals, _) in zip(plans, results):
                tally.sent += len(plan)
                for send in plan:
                    if send.must is None:
                        continue
                    tally.owed += 1
                    got = finals.get(answer_key(send.must), [])
                    if not got:  # the connection waited answer_timeout: a hang, and (closed since) unanswered
                        tally.unanswered += 1
                        tally.hangs += 1
                        tally.failures.append(("unanswered", send.kind, send.must))
                        continue
                    tally.answered += 1
                    if len(got) > 1:
                        tally.duplicates += 1
                        tally.failures.append(("duplicate", send.kind, send.must))
                    code = got[0].get("code") or got[0].get("type")
                    tally.errors[str(code)] = tally.errors.get(str(code), 0) + 1
                    if code == "internal":
                        tally.internal += 1
                        tally.failures.append(("internal", send.kind, send.must, str(got[0].get("message"))[:300]))
            tally.peak_rss_mb = max(tally.peak_rss_mb, server.memory().get("VmHWM", 0.0))
            if tally.batches % 25 == 0:
                log(f"ws: {tally.sent} messages, {tally.unanswered} unanswered, peak {tally.peak_rss_mb:.0f} MiB")
    finally:
        tally.elapsed_s = time.monotonic() - started
        if not server.alive:
            tally.crashes += 1
        server.close()
    return tally


async def _gather(server: WsServer, plans, answer_timeout: float):
    import asyncio

    return await asyncio.gather(*(ws_connection(server.url, server.token, plan, answer_timeout) for plan in plans))
