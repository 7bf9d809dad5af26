"""Where a sweep's wall time goes, printed at its end: named spans timed on the driver (Ray start, data,
pretraining, fine-tuning, report; fine-tuning runs beside pretraining, so those two overlap), the pretraining segments' time inside optimizer steps (from the loop's own
reports: each report window is steps x global batch tokens / tokens_per_s) and the fine-tuning trials' own time.
The rest of a stage is start-up, scheduling, evaluation, checkpoints and teardown."""

from __future__ import annotations

import time
from contextlib import contextmanager


def duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def step_seconds(history: list[dict], start: int, tokens_per_step: int) -> float:
    """Seconds inside optimizer steps of one segment's reports after `start`."""
    total, previous = 0.0, start
    for row in history:
        if row["step"] > previous and row.get("tokens_per_s"):
            total += (row["step"] - previous) * tokens_per_step / row["tokens_per_s"]
        previous = max(previous, row["step"])
    return total


class Clock:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.spans: dict[str, float] = {}
        self.segments = self.most_at_once = self.trials = 0
        self.in_steps = self.in_trials = 0.0

    @contextmanager
    def span(self, name: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.spans[name] = self.spans.get(name, 0.0) + time.perf_counter() - began

    def summary(self) -> str:
        parts = []
        for name, seconds in self.spans.items():
            text = f"{name} {duration(seconds)}"
            if name == "pretraining" and self.segments:
                rest = (f"{duration(seconds - self.in_steps)} start-up, evaluation, checkpoints and teardown"
                        if self.in_steps <= seconds  # else segments ran side by side: step time sums past the wall
                        else "summed over those running at once")
                text += (f" ({self.segments} segment(s), at most {self.most_at_once} at once: "
                         f"{duration(self.in_steps)} in optimizer steps, {rest})")
            if name == "fine-tuning" and self.trials:
                text += (f" ({self.trials} trial(s): {duration(self.in_trials)} inside trials, summed over those "
                         f"running at once; the rest start-up and scheduling"
                         + ("; beside pretraining, from the first checkpoint ready" if "pretraining" in self.spans
                            else "") + ")")
            parts.append(text)
        return f"time: {duration(time.perf_counter() - self.started)} in all: " + ", ".join(parts)
