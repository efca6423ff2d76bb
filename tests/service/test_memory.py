"""Freed heap memory goes back to the system after large work (glibc's malloc_trim): the pages of
many freed mid-size blocks, held in the heap behind a few live ones, leave the process's RSS."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from codespec.service.engine.memory import release_free_memory


def resident_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_heap_pages_leave_the_process_after_a_trim():
    if not release_free_memory():
        pytest.skip("not glibc")
    blocks = [bytes(100_000) for _ in range(3000)]  # under glibc's mmap threshold: heap blocks, ~290 MB
    kept = blocks[::100]  # a few live ones pin the heap: free() alone cannot give the rest back
    del blocks
    before = resident_mb()
    assert release_free_memory()
    after = resident_mb()
    assert before - after > 150, (before, after)
    assert len(kept) == 30
