"""Live progress on the driver's console (and so in `ray job logs -f`): a line per running segment every few
seconds, and the fine-tuning fan-out as trials done / total.

    pretraining: tiny-clm-0-400-8f7d5072 step 240/400, clm loss 5.83, 3.1k tok/s, ETA 52s
    fine-tuning: 12/48 trials done (3 stopped by ASHA), 2 running, ETA 1m20s

Workers never print to the driver (Ray's log forwarding is off, see raybiphase.raycluster): rank 0 of a segment
writes a small `progress.json` beside the segment's history every `every_s` seconds (`ProgressWriter`, called once
per optimizer step; it syncs the device only when it writes), and a driver thread (`Watch`) reads those files and
prints what moved. The files live in the sweep's storage, so this works the same from a bucket on a cluster. The
fine-tuning line (`trials_line`) is the sweep's scheduler's, as trials end. RAYBIPHASE_PROGRESS_S sets the
interval (default 10 s; 0 turns the lines off). Lines go to the driver's console (raybiphase.telemetry.console).
"""

from __future__ import annotations

import threading
import time

from raybiphase import storage
from raybiphase.errors import env_number
from raybiphase.telemetry.clock import duration
from raybiphase.telemetry.console import STDOUT, Console


def interval() -> float:
    """Seconds between progress lines (RAYBIPHASE_PROGRESS_S; 0 = no progress lines)."""
    return env_number("RAYBIPHASE_PROGRESS_S", 10.0)


def rate(tokens_per_s: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.1f}{unit} tok/s"
    return f"{tokens_per_s:.0f} tok/s"


def line(name: str, beat: dict) -> str:
    """One progress line of a segment from its latest beat."""
    text = f"pretraining: {name} step {beat['step']}/{beat['stop_at']}"
    if beat.get("loss") is not None:
        text += f", {beat['objective']} loss {beat['loss']:.2f}"
    text += f", {rate(beat['tokens_per_s'])}"
    if beat.get("mfu") is not None:
        text += f", MFU {100 * beat['mfu']:.0f}%"
    if beat["tokens_per_s"] > 0 and beat["step"] < beat["stop_at"]:
        text += f", ETA {duration((beat['stop_at'] - beat['step']) * beat['tokens_per_step'] / beat['tokens_per_s'])}"
    return text


LIFE_S = 60.0
"""Seconds between beats when progress lines are off: a beat is also the driver's sign that the fit is alive
(sweep.stall_s)."""


class ProgressWriter:
    """Rank 0 of a training loop: `beat(...)` after every optimizer step writes `progress.json` at most every
    `every_s` seconds (every LIFE_S when progress lines are off; the loss is read from the device only then)."""

    def __init__(self, location: str | None, *, stop_at: int, tokens_per_step: int, every_s: float):
        self.location, self.stop_at, self.tokens_per_step = location, stop_at, tokens_per_step
        self.every_s = every_s if every_s > 0 else LIFE_S
        self.last = self.window_start = time.perf_counter()
        self.window_steps = 0

    def beat(self, step: int, objective: str, loss, mfu_per_token_s: float | None = None) -> None:
        """`loss`: a callable giving this rank's loss of the step (called only when a beat is written)."""
        self.window_steps += 1
        now = time.perf_counter()
        if not self.location or (now - self.last < self.every_s and step < self.stop_at):
            return
        tokens_per_s = self.window_steps * self.tokens_per_step / max(now - self.window_start, 1e-9)
        beat = {"step": step, "stop_at": self.stop_at, "objective": objective, "loss": float(loss()),
                "tokens_per_s": tokens_per_s, "tokens_per_step": self.tokens_per_step, "time": time.time()}
        if mfu_per_token_s:
            beat["mfu"] = tokens_per_s * mfu_per_token_s
        try:
            storage.write_json(self.location, beat)
        except OSError:  # progress is a courtesy: a storage hiccup never stops training
            pass
        self.last, self.window_start, self.window_steps = now, now, 0


class Watch:
    """A driver thread printing each running segment's latest beat when it moved, every `every_s` seconds; the
    driver adds a segment's location to `locations` when it starts and drops it when it ends.

        with Watch({}, console) as watch:
            watch.locations[segment_id] = progress_location
    """

    def __init__(self, locations: dict[str, str], console: Console = STDOUT, *, every_s: float | None = None):
        self.locations, self.console = locations, console
        self.every_s = interval() if every_s is None else every_s
        self.seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the watch thread and the driver's `drop` both poll
        self._thread = threading.Thread(target=self._run, daemon=True, name="raybiphase-progress")

    def drop(self, name: str) -> None:
        """Stop watching a segment that ended, after printing where it ended (if no poll has yet)."""
        if self.every_s > 0:
            self.console.say(*self.poll(only=name))
        self.locations.pop(name, None)

    def poll(self, only: str | None = None) -> list[str]:
        """The lines of segments (or of `only`) whose step moved since the last poll."""
        lines = []
        with self._lock:
            for name, location in list(self.locations.items()):  # the driver adds and drops segments meanwhile
                if only is not None and name != only:
                    continue
                try:
                    beat = storage.read_json(location)
                except (OSError, ValueError):  # being written, or a storage hiccup: next time
                    continue
                if beat and beat.get("step", 0) > self.seen.get(name, 0):
                    self.seen[name] = beat["step"]
                    lines.append(line(name, beat))
        return lines

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.console.say(*self.poll())

    def __enter__(self) -> Watch:
        if self.every_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
            self.console.say(*self.poll())  # where each segment ended


def trials_line(done: int, total: int, stopped: int, running: int, per_trial: float | None,
                label: str = "fine-tuning") -> str:
    """The fan-out's tally; the ETA at `per_trial` seconds between trials ending (the recent pace: the time before
    the first trial ended, spent pretraining, is not a trial's), none before that pace is known."""
    text = f"{label}: {done}/{total} trials done"
    if stopped:
        text += f" ({stopped} stopped by ASHA)"
    text += f", {running} running"
    if per_trial is not None and 0 < done < total:
        text += f", ETA {duration(per_trial * (total - done))}"
    return text
