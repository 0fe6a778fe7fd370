"""``vertumnus.gcfreeze``: a serving process's start-up heap leaves the collector's walks.

Run in a child process: freezing here would freeze the test runner's own objects."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
import vertumnus.sim.engine  # a heap worth freezing: the simulator and numpy
gc.collect()
before = len(gc.get_objects())
from vertumnus.gcfreeze import freeze_startup
frozen = freeze_startup()
after = len(gc.get_objects())
garbage = []
garbage.append(garbage)  # a cycle made after the freeze is still collected
del garbage
print(json.dumps({"before": before, "frozen": frozen, "after": after,
                  "collected": gc.collect()}))
"""


def test_the_startup_heap_is_frozen_and_later_cycles_are_still_collected():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120
    )
    got = json.loads(out.stdout)
    assert got["before"] > 20_000
    assert got["frozen"] >= 0.9 * got["before"]
    # What a full collection walks now: only what was made after the freeze.
    assert got["after"] < got["before"] / 10
    assert got["collected"] >= 1
