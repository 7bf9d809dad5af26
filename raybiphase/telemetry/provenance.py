"""Which code wrote a result: the package version plus the git commit when the package runs from a checkout; stamped
into every checkpoint's meta and the report's header."""

from __future__ import annotations

import subprocess
from pathlib import Path

from raybiphase import __version__


def code_version() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__
