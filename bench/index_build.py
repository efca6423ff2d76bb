"""Timing and memory figures for docs/index.md (not a test: numbers depend on the machine).

    python -m bench.index_build --mb 50 --vocab 4096 --json out.json
    python -m bench.index_build --mb 50 --tokenizer DIR     # a saved tokenizer instead (e.g. 151,936 ids)

Builds a workspace of standard-library source (replicated to reach ``--mb``), then measures: build
rate including tokenization, resident bytes per indexed token, lookup latency, one-line edit time
in a 5,000-line file, and restart time (a fresh process, unchanged workspace). Latencies are
reported as wall time and as the calling thread's CPU time (``time.thread_time``): on a shared
machine the wall-time tail measures the scheduler as much as the index.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_workspace(root: Path, megabytes: float) -> int:
    """Copy stdlib .py files (site-packages excluded) into copy0/, copy1/, ... until the size."""
    sources = sorted(p for p in STDLIB.rglob("*.py") if "site-packages" not in p.parts)
    target, total, copy = megabytes * 1e6, 0, 0
    while total < target:
        for source in sources:
            if total >= target:
                break
            try:
                data = source.read_bytes()
                data.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(data) > 1_000_000 or b"\0" in data:
                continue
            destination = root / f"copy{copy}" / source.relative_to(STDLIB)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(data)
            total += len(data)
        copy += 1
    return total


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))  # as TargetModel.load reads a model's tokenizer


def restart_child(tokenizer_dir: str, db: str, root: str) -> None:
    """Runs in a fresh process: open the database, re-index the unchanged workspace."""
    from codespec.index import WorkspaceIndex

    tokenizer = load_tokenizer(Path(tokenizer_dir))
    before = rss_bytes()
    started = time.perf_counter()
    index = WorkspaceIndex(tokenizer, db_path=db)
    report = index.index_workspace([Path(root)])
    seconds = time.perf_counter() - started
    gc.collect()
    print(
        json.dumps(
            {
                "restart_s": seconds,
                "tokenized": report.tokenized,
                "reused": report.reused,
                "tokens": report.tokens,
                "rss_delta": rss_bytes() - before,
            }
        )
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50.0, help="workspace size in MB (default 50)")
    parser.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary size (default 4096)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a saved tokenizer directory to use instead of training a --vocab BPE",
    )
    parser.add_argument("--lookups", type=int, default=3000)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--restart-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.restart_child:
        restart_child(*args.restart_child)
        return 0

    from bench.shapes import build_tokenizer
    from codespec.index import WorkspaceIndex
    from codespec.index.tokens import TokenizerAdapter

    work = Path(tempfile.mkdtemp(prefix="codespec-index-bench-"))
    try:
        if args.tokenizer is not None:
            shutil.copytree(args.tokenizer, work / "tokenizer")
        else:
            corpus = [
                (STDLIB / n).read_text() for n in ("argparse.py", "typing.py", "dataclasses.py", "json/decoder.py")
            ]
            build_tokenizer(corpus, vocab_size=args.vocab).save_pretrained(work / "tokenizer")
        tokenizer = load_tokenizer(work / "tokenizer")
        args.vocab = len(tokenizer)
        root = work / "ws"
        size = make_workspace(root, args.mb)
        figures: dict = {"workspace_bytes": size, "vocab": args.vocab, "cpus": os.cpu_count()}
        adapter = TokenizerAdapter(tokenizer)
        figures.update(
            token_dtype=adapter.dtype.name, encoding=adapter.encoding, encoding_reason=adapter.encoding_reason
        )
        print(
            f"tokenizer: {args.vocab} ids, {adapter.dtype.name} token arrays, bulk encoding: {adapter.encoding} "
            f"({adapter.encoding_reason})",
            flush=True,
        )
        del adapter
        print(f"workspace: {size / 1e6:.1f} MB of stdlib source under {root}", flush=True)

        # Tokenizer throughput alone, on a 5 MB sample, for context.
        sample = [p.read_text() for p in sorted(root.rglob("*.py"))[:400]]
        sample_bytes = sum(len(t.encode()) for t in sample)
        started = time.perf_counter()
        tokenizer.backend_tokenizer.encode_batch_fast(sample, add_special_tokens=False)
        figures["tokenizer_only_mb_s"] = sample_bytes / 1e6 / (time.perf_counter() - started)
        del sample

        gc.collect()
        rss_before = rss_bytes()
        db = work / "index.db"
        index = WorkspaceIndex(tokenizer, db_path=db)
        started = time.perf_counter()
        report = index.index_workspace([root])
        index_s = time.perf_counter() - started
        index.flush(wait=True)  # the build is done when its rows are committed
        build_s = time.perf_counter() - started
        gc.collect()
        figures.update(
            build_s=build_s,
            build_mb_s=size / 1e6 / build_s,
            ready_for_lookup_s=index_s,
            files=report.files,
            tokens=report.tokens,
            bytes_per_token_text=size / report.tokens,
            rss_bytes_per_token=(rss_bytes() - rss_before) / report.tokens,
            structure_bytes_per_token=index.memory_bytes() / report.tokens,
            levels=len(index._levels.levels),
            tokenize_s=report.tokenize_seconds,
            table_s=report.table_seconds,
            build_mb_s_excluding_tokenizer=size / 1e6 / (build_s - report.tokenize_seconds),
        )
        print(
            f"build: {build_s:.1f} s = {figures['build_mb_s']:.2f} MB/s ({report.tokens} tokens); "
            f"RSS {figures['rss_bytes_per_token']:.1f} B/token",
            flush=True,
        )

        # A long session: every history kind full (its newest 128 k tokens are scanned per lookup).
        history_text = (STDLIB / "_pydecimal.py").read_text()
        for kind in ("accepted", "generated", "replaced"):
            start = 0
            while len(index._history.buffers[kind].tokens) < index._history.buffers[kind].max_tokens - 4000:
                index.add_history(kind, history_text[start : start + 2000])
                start = (start + 2000) % len(history_text)
        figures["history_tokens"] = sum(len(b.tokens) for b in index._history.buffers.values())

        # Lookups: contexts taken at random positions of random documents (hits), plus misses.
        rng = random.Random(0)
        uris = index.documents()
        latencies, cpu, hits = [], [], 0
        gc.disable()  # collector pauses are reported separately below, not mixed into latency
        for _ in range(args.lookups):
            uri = rng.choice(uris)
            tokens = index.document_tokens(uri)
            if len(tokens) < 40:
                continue
            cursor = rng.randrange(16, len(tokens) - 1)
            context = tokens[cursor - 16 : cursor]
            if rng.random() < 0.2:  # a novel context: random tokens
                context = [rng.randrange(args.vocab) for _ in range(16)]
            started, cpu_started = time.perf_counter(), time.thread_time()
            found = index.lookup(context, 32, uri=uri, cursor=cursor)
            latencies.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - cpu_started)
            hits += bool(found)
        figures.update(
            lookup_ms_p50=percentile(latencies, 0.5) * 1e3,
            lookup_ms_p99=percentile(latencies, 0.99) * 1e3,
            lookup_ms_max=max(latencies) * 1e3,
            lookup_hit_rate=hits / len(latencies),
            lookup_cpu_ms_p99=percentile(cpu, 0.99) * 1e3,
        )
        gc.enable()
        started = time.perf_counter()
        gc.collect()
        figures["gc_full_collect_ms"] = (time.perf_counter() - started) * 1e3
        print(f"lookup: p50 {figures['lookup_ms_p50']:.3f} ms, p99 {figures['lookup_ms_p99']:.3f} ms", flush=True)

        # One-line edits in a 5,000+-line file that lives in the big level (first edit moves it out).
        big = next(u for u in uris if u.endswith("copy0/_pydecimal.py"))
        text = index.document_text(big)
        lines = text.count("\n")
        edit_times, edit_cpu = [], []
        for n in range(300):
            text = index.document_text(big)
            line_no = rng.randrange(100, lines - 100)
            start = 0
            for _ in range(line_no):
                start = text.index("\n", start) + 1
            end = text.index("\n", start)
            new_line = text[start:end].replace("self", "this", 1) + f"  # edit {n}"
            started, cpu_started = time.perf_counter(), time.thread_time()
            index.update_document(big, start, end, new_line, version=n + 1)
            edit_times.append(time.perf_counter() - started)
            edit_cpu.append(time.thread_time() - cpu_started)
        figures.update(
            edit_file_lines=lines,
            edit_ms_first=edit_times[0] * 1e3,
            edit_ms_p50=statistics.median(edit_times[1:]) * 1e3,
            edit_ms_p99=percentile(edit_times[1:], 0.99) * 1e3,
            edit_cpu_ms_p99=percentile(edit_cpu[1:], 0.99) * 1e3,
        )
        index.flush_seconds = 1e9  # the same edits without the periodic database write
        quiet = []
        for n in range(100):
            text = index.document_text(big)
            start = text.index("\n", 200_000) + 1
            end = text.index("\n", start)
            started = time.perf_counter()
            index.update_document(big, start, end, text[start:end] + "#", version=1000 + n)
            quiet.append(time.perf_counter() - started)
        index.flush_seconds = 1.0
        figures["edit_ms_p99_without_db_write"] = percentile(quiet, 0.99) * 1e3
        print(
            f"edit ({lines} lines): first {figures['edit_ms_first']:.2f} ms, p50 {figures['edit_ms_p50']:.3f} ms, "
            f"p99 {figures['edit_ms_p99']:.3f} ms",
            flush=True,
        )
        context = index.document_tokens(big)[1000:1016]
        started = time.perf_counter()
        for _ in range(200):
            index.lookup(context, 32, uri=big, cursor=1016)
        figures["lookup_ms_in_edited_file"] = (time.perf_counter() - started) / 200 * 1e3
        index.add_document(big, (STDLIB / "_pydecimal.py").read_text(), version=0)  # restore the file's text
        index.close()

        # Restart in a fresh process, unchanged workspace.
        out = subprocess.run(
            [sys.executable, "-m", "bench.index_build", "--restart-child", str(work / "tokenizer"), str(db), str(root)],
            capture_output=True,
            text=True,
            check=True,
        )
        restart = json.loads(out.stdout.strip().splitlines()[-1])
        figures.update(
            restart_s=restart["restart_s"],
            restart_tokenized=restart["tokenized"],
            restart_rss_bytes_per_token=restart["rss_delta"] / restart["tokens"],
            db_bytes=db.stat().st_size + sum(p.stat().st_size for p in work.glob("index.db-*")),
        )
        print(
            f"restart: {restart['restart_s']:.2f} s, re-tokenized {restart['tokenized']} files, "
            f"RSS {figures['restart_rss_bytes_per_token']:.1f} B/token",
            flush=True,
        )
        print(json.dumps(figures, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
