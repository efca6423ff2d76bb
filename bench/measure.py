"""What one request of one configuration produced, and the per-request memory peak.

Configurations run interleaved in one process, so the process-lifetime peak (``ru_maxrss``) says
nothing about any one of them. On Linux the resident-set high-water mark can be reset
(``/proc/self/clear_refs`` <- "5") before each request and read (``VmHWM``) after it; elsewhere
the current RSS after the request is the fallback. On CUDA the allocator's peak is reset per request.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, field

from codespec.core.stats import RequestStats


@dataclass
class RunResult:
    output_ids: tuple[int, ...]
    stats: RequestStats
    peak_rss_mb: float = float("nan")
    cuda_peak_mb: float | None = None
    extra: dict = field(default_factory=dict)


class MemoryProbe:
    def __init__(self, device=None) -> None:
        self.cuda = device is not None and getattr(device, "type", str(device)) == "cuda"

    def start(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            pass
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()

    def stop(self) -> tuple[float, float | None]:
        """(peak RSS MB during the request, CUDA max allocated MB or None)."""
        rss = status_mb("VmHWM")
        if rss is None:
            rss = status_mb("VmRSS")
        if rss is None:  # not Linux: the lifetime peak is all there is
            scale = 1 if sys.platform == "darwin" else 1024
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
        cuda = None
        if self.cuda:
            import torch

            cuda = torch.cuda.max_memory_allocated() / 2**20
        return rss, cuda


def status_mb(key: str) -> float | None:
    """A /proc/self/status field (VmRSS, RssAnon, VmHWM, ...) in MB; None where there is none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024  # kB -> MB
    except OSError:
        return None
    return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
