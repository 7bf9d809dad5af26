"""The driver's console: every line a command prints while it runs (the plan, progress, the fine-tuning tally,
the report's path) goes through one `Console`, so a caller chooses where all of them go in one place.

    console = Console()                 # standard output, read at each line (pytest's capture sees it)
    console = Console(io.StringIO())    # a test or a benchmark keeps the lines
    console.say("pretraining: 2/4 segments")

Lines are flushed as they are written: under `ray job submit` they reach `ray job logs -f` at once. Threads share
one console (a segment's watcher, the Tuner's callbacks): `print` of one line is atomic enough for a console.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Console:
    """Where a driver's lines go: `stream`, or standard output as it is when a line is written."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream

    def say(self, *lines: str) -> None:
        for line in lines:
            print(line, file=self.stream or sys.stdout, flush=True)

    def __getstate__(self):  # a pickled console (inside Tune's experiment state) prints to standard output
        return {"stream": None}


STDOUT = Console()
"""Standard output: the default of every function that prints."""
