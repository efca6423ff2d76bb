"""What the robustness soak (``bench.soak``) sends and counts, shared by its stdio and websocket
halves: the server command, odd values and texts, JSON that ``json.dumps`` cannot write (deep
nesting), LSP frames, and the tally of what was owed and answered."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVE = [sys.executable, "-m", "codespec.commands.cli", "serve"]
SURROGATE_TEXT = "x = \ud800\ny = "


# ---- process -------------------------------------------------------------------------------
def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def tiny_model(directory: Path) -> Path:
    """The tests' tiny random model (tests/lsp/conftest.py), written to ``directory``."""
    import sysconfig

    from bench.shapes import save_random_model

    if (directory / "config.json").exists():
        return directory
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = [(stdlib / name).read_text(encoding="utf-8") for name in ("json/encoder.py", "textwrap.py", "shlex.py")]
    directory.mkdir(parents=True, exist_ok=True)
    return save_random_model(
        directory, corpus, shape=(64, 2, 4, 2, 128), vocab_size=384, seed=3, init_std=0.25, max_context=2048
    )


DEEP = re.compile(r'"@@deep:(\d+)@@"')


def encode(payload: Any) -> str:
    """JSON text of ``payload``; ``nested(n)`` placeholders become n levels of arrays (deeper than
    json.dumps itself can write)."""
    return DEEP.sub(lambda match: "[" * int(match.group(1)) + "1" + "]" * int(match.group(1)), json.dumps(payload))


def frame(payload: Any, header: str = "Content-Length", line_end: bytes = b"\r\n") -> bytes:
    body = payload if isinstance(payload, bytes) else encode(payload).encode()
    return b"%s: %d%s%s" % (header.encode(), len(body), line_end, line_end) + body


def answer_key(msg_id: Any) -> Any:
    return ("s", msg_id) if isinstance(msg_id, str) else ("i", msg_id)


WEIRD_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**31,
    2**63,
    -(2**40),
    1.5,
    float("inf"),
    "",
    "x",
    "\ud800",
    [],
    {},
    [1, 2],
    {"a": 1},
    "😀" * 3,
    "a" * 300,
]


def weird_value(rng, big: bool = True) -> Any:
    roll = rng.random()
    if big and roll < 0.04:
        return "é" * rng.choice([10_000, 300_000, 1_100_000])  # huge strings, some over maxDocumentBytes
    if roll < 0.10:
        return nested(rng.choice([5, 40, 70, 200, 1500]))
    return rng.choice(WEIRD_VALUES)


def nested(depth: int) -> Any:
    if depth > 100:
        return f"@@deep:{depth}@@"  # written out by encode()
    value: Any = 1
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def random_text(rng, size: int) -> str:
    pieces = [
        "def f(x):\n",
        "    return x + 1\n",
        "\n",
        "class A:\n    pass\n",
        "é",
        "😀",
        "\t",
        "\r\n",
        "中文",
        "x = 1  # note\n",
        "\x00",
        "\u2028",
        "'''",
        "\\",
        SURROGATE_TEXT,
    ]
    out, length = [], 0
    while length < size:
        piece = rng.choice(pieces)
        out.append(piece)
        length += len(piece)
    return "".join(out)


def position(rng, text: str | None) -> dict:
    lines = text.split("\n") if text else [""]
    roll = rng.random()
    if roll < 0.75:
        line = rng.randrange(len(lines))
        return {"line": line, "character": rng.randrange(len(lines[line]) + 2)}
    return {"line": rng.choice([-1, 0, len(lines) + 3, 2**31 - 1, 2**31]), "character": rng.choice([-5, 0, 3, 2**31])}


def mutate(rng, value: Any) -> Any:
    """``value`` (a JSON message) with one leaf or container replaced by a value of another type."""
    if not isinstance(value, (dict, list)) or not value or rng.random() < 0.15:
        return weird_value(rng)
    if isinstance(value, dict):
        key = rng.choice(list(value))
        out = dict(value)
        if rng.random() < 0.15:
            del out[key]
        else:
            out[key] = mutate(rng, value[key])
        return out
    index = rng.randrange(len(value))
    return [*value[:index], mutate(rng, value[index]), *value[index + 1 :]]


@dataclass
class Tally:
    sent: int = 0
    owed: int = 0
    answered: int = 0
    unanswered: int = 0
    duplicates: int = 0
    hangs: int = 0
    crashes: int = 0
    internal: int = 0  # answers that were internal errors (-32603 / "internal")
    batches: int = 0
    errors: dict = field(default_factory=dict)  # error code -> count
    peak_rss_mb: float = 0.0
    first_rss_mb: float = 0.0
    elapsed_s: float = 0.0
    failures: list = field(default_factory=list)  # (kind, id) of unanswered or duplicated requests
    pending: list = field(default_factory=list)  # (kind, id) not answered in time (hangs), settled at the end

    def as_dict(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key not in ("failures", "pending")} | {
            "failures": self.failures[:20]
        }
