"""Exit when the editor that launched the server is gone (LSP's ``--clientProcessId``).

An editor that crashes never sends ``shutdown``/``exit``; without this check its language server
would stay behind holding the model's memory.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


def exit_when_gone(pid: int, interval_s: float = 2.0) -> threading.Thread | None:
    """Watch ``pid`` in a daemon thread; when it has exited, end this process. None for pid <= 0."""
    if pid <= 0:
        return None

    def watch() -> None:
        while process_alive(pid):
            time.sleep(interval_s)
        print(f"codespec: client process {pid} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(0)

    thread = threading.Thread(target=watch, name="codespec-parent-watch", daemon=True)
    thread.start()
    return thread
