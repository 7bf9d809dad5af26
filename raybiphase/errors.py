"""The two kinds of bad input, at the bottom of the import order so every layer can raise them; the commands turn
either into one line on stderr and exit code 2 (raybiphase.commands.run_main); and the one reader of numeric
settings from the environment, which says a bad one the same way."""

from __future__ import annotations

import math
import os


class UserError(RuntimeError):
    """Bad input the user can fix: a missing shard, an unreachable bucket, an unknown task."""


class LeaseLost(UserError):
    """A write to a sweep folder whose lease this process's driver no longer holds (another driver took the sweep
    over): refused, so two drivers never write one sweep."""


class ConfigError(ValueError):
    """A configuration problem, reported as one line that names the dotted key."""


class DamagedFile(UserError, ValueError):
    """A JSON file of a sweep that is not JSON (cut short, emptied, overwritten): one line naming it. Also a
    ValueError, as `json.loads` raises, so readers that pass over an unreadable file still do. `location`: the
    file, where the reader knows it (`raybiphase repair` moves it aside)."""

    def __init__(self, message: str, location: str = ""):
        super().__init__(message)
        self.location = location


def env_number(name: str, default: float, *, minimum: float = 0.0) -> float:
    """The environment variable `name` as a finite number >= `minimum`, `default` when unset or empty; a UserError
    naming the variable otherwise (read when used, so a bad value is said by the command, in one line)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= minimum):
        raise UserError(f"{name}: {raw!r} is not a number >= {minimum:g}")
    return value
