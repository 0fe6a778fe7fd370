"""Tie a process's life to another's: call back when process ``pid`` ends.

Ranks use it to end with the process that owns their pool (their parent is
the multiprocessing forkserver, which outlives a host killed with SIGKILL, so
the parent's death signal never comes), and ``vertumnus serve --exit-with``
to stop with the ``vertumnus up`` that started it.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

__all__ = ["on_exit_of"]


def on_exit_of(pid: int, callback: Callable[[], None]) -> None:
    """Run ``callback`` in a daemon thread as soon as process ``pid`` has ended.

    Waits on the process's pidfd (Linux ≥ 5.3: no polling, no pid reuse race);
    elsewhere polls once a second."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            select.select([fd], [], [])
        else:
            while True:
                time.sleep(1.0)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
        callback()

    threading.Thread(target=watch, name=f"exit-with-{pid}", daemon=True).start()
