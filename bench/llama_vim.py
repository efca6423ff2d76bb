"""llama.vim against `codespec serve --http`, for real: headless Neovim, the plugin loaded from a
folder outside this repository, a recording proxy between the two (a run by hand, not a test).

    git clone https://github.com/ggml-org/llama.vim /tmp/llama.vim
    python -m bench.llama_vim --plugin /tmp/llama.vim --commit SHA --out tests/http_api/data/llama_vim_record.json

Starts `codespec serve --http` on the shipped model, a proxy that forwards every request to it and
writes down the request (method, path, headers the plugin sets, JSON body) and the answer (status,
JSON body), and Neovim running bench/llama_vim_driver.lua (open two files, wait, type, wait for the
ghost text, <Tab>). The record it writes is what tests/http_api/test_llama_vim_record.py replays
against a real server in CI. The token in the record is written as ``<token>``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKEN = "llama-vim-run-token"
# What the plugin reads of an /infill answer (autoload/llama.vim: s:fim_on_response, s:fim_render).
READ_BY_PLUGIN = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_second",
    "tokens_cached",
    "truncated",
]
HELPER = '''"""Areas and perimeters of the shapes the drawing module places on a page."""

import math

UNIT = "mm"


def square_area(side: float) -> float:
    """The area of a square with sides of length ``side``."""
    return side * side


def rectangle_area(width: float, height: float) -> float:
    """The area of a rectangle, in square units."""
    return width * height


def rectangle_perimeter(width: float, height: float) -> float:
    """The length of a rectangle's border."""
    return 2 * (width + height)


def circle_area(radius: float) -> float:
    """The area of a circle of this radius."""
    return math.pi * radius * radius


def circle_perimeter(radius: float) -> float:
    """The length of a circle's border."""
    return 2 * math.pi * radius
'''
MAIN = '''"""Labels for the shapes on a page."""

from helper import UNIT, rectangle_area


def label(width: float, height: float) -> str:
    """A rectangle's label: its size and its area."""
    area = rectangle_area(width, height)
    return f"{width} x {height} {UNIT}: {area} {UNIT}2"


def short_label(width: float, height: float) -> str:
    """A rectangle's label without its unit."""
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Recorder(BaseHTTPRequestHandler):
    """Forwards to the server, writes down each exchange."""

    protocol_version = "HTTP/1.1"
    upstream = 0
    exchanges: list[dict] = []
    lock = threading.Lock()

    def log_message(self, format, *args) -> None:  # quiet
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {
            key: value for key, value in self.headers.items() if key.lower() in ("content-type", "authorization")
        }
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=300)
        connection.request(self.command, self.path, body=raw or None, headers=headers)
        answer = connection.getresponse()
        payload = answer.read()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() in ("content-type", "content-length"):
                self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)
        shown = {k: ("Bearer <token>" if k.lower() == "authorization" else v) for k, v in headers.items()}
        with self.lock:
            self.exchanges.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": shown,
                    "body": json.loads(raw) if raw else None,
                    "status": answer.status,
                    "response": json.loads(payload) if payload else None,
                    "elapsed_ms": round(elapsed_ms, 1),
                }
            )

    do_GET = do_POST = _forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", type=Path, required=True, help="llama.vim's source folder (outside this repo)")
    parser.add_argument("--commit", required=True, help="the llama.vim commit in that folder")
    parser.add_argument("--out", type=Path, default=REPO / "tests/http_api/data/llama_vim_record.json")
    parser.add_argument("--typed", default="\rarea = rect", help="what is typed at the end of the row")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="llama-vim-"))
    (scratch / "helper.py").write_text(HELPER)
    (scratch / "shapes.py").write_text(MAIN)
    upstream = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "codespec.commands.cli",
            "serve",
            "--http",
            "--http-port",
            str(upstream),
            "--token",
            TOKEN,
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", upstream, timeout=5)
                connection.request("GET", "/health", headers={"Authorization": f"Bearer {TOKEN}"})
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("codespec serve did not start")
            time.sleep(0.2)
        Recorder.upstream = upstream
        proxy = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        out = scratch / "seen.json"
        run = {
            "plugin": str(args.plugin),
            "url": f"http://127.0.0.1:{proxy.server_address[1]}",
            "token": TOKEN,
            "helper": str(scratch / "helper.py"),
            "file": str(scratch / "shapes.py"),
            "row": MAIN.count("\n"),
            "typed": args.typed,
            "out": str(out),
        }
        subprocess.run(
            ["nvim", "--headless", "--clean", "-S", str(REPO / "bench/llama_vim_driver.lua")],
            env={**os.environ, "LLAMA_VIM_RUN": json.dumps(run)},
            timeout=300,
            check=False,
        )
        time.sleep(1.0)  # the plugin's last curl finishes
        proxy.shutdown()
        seen = json.loads(out.read_text())
    finally:
        server.terminate()
        server.wait(30)
    record = {
        "what": "llama.vim in headless Neovim against codespec serve --http (shipped model), via a recording proxy",
        "plugin": {"repository": "ggml-org/llama.vim", "commit": args.commit},
        "neovim": seen.get("nvim"),
        "setting": {"endpoint_fim": "http://127.0.0.1:PORT/infill", "api_key": "<token>"},
        "files": {"helper.py": HELPER, "shapes.py": MAIN},
        "typed": {"row": run["row"], "keys": args.typed},
        "outcome": {
            "ghost_text": seen.get("shown"),
            "shown_after_ms": seen.get("shown_after_ms"),
            "accepted_lines": seen.get("accepted_lines"),
            "ghost_after_accept": seen.get("ghost_after_accept"),
            "failure": seen.get("failure"),
        },
        "read_by_plugin": READ_BY_PLUGIN,
        "exchanges": Recorder.exchanges,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, ensure_ascii=False).replace(f"{scratch}/", "")  # names as in the folder
    args.out.write_text(text + "\n")
    print(json.dumps(record["outcome"], indent=1))
    print(f"{len(Recorder.exchanges)} exchanges: {[(e['path'], e['status']) for e in Recorder.exchanges]}")
    return 0 if seen.get("failure") is None else 1


if __name__ == "__main__":
    sys.exit(main())
