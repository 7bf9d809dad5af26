"""Hub datasets at a commit: where a hub-layout snapshot lies, the commit it was downloaded at, and the warning a
read at a moving revision gives. The pretraining corpus (raybiphase.data.pieces) and the fine-tuning datasets
(raybiphase.finetune.hub) both read through it.

RAYBIPHASE_DATASETS_DIR, when set, names a folder where `<dir>/<org>/<name>` is a snapshot of each repository,
made with `hf download --repo-type dataset ID --revision REV --local-dir <dir>/ID`, which records the commit beside
every file (`.cache/huggingface/download/*.metadata`, `snapshot_commit`).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from raybiphase.errors import UserError

DATASETS_DIR_ENV = "RAYBIPHASE_DATASETS_DIR"
COMMIT = re.compile(r"[0-9a-f]{40}")
"""A full commit hash: the only revision that pins what a dataset holds (a branch or tag moves)."""


class UnpinnedDatasetWarning(UserWarning):
    """A hub dataset read at a moving revision: two reads months apart may see different data."""


def snapshot_root() -> str | None:
    """The folder of hub-layout snapshots (RAYBIPHASE_DATASETS_DIR), None to read the hub itself."""
    return os.environ.get(DATASETS_DIR_ENV) or None


def snapshot_commit(path: str) -> str | None:
    """The commit a hub-layout snapshot was downloaded at, None when it records none; UserError when its files
    mix commits."""
    commits = {p.read_text().splitlines()[0].strip()
               for p in Path(path, ".cache", "huggingface", "download").glob("**/*.metadata")}
    if len(commits) > 1:
        raise UserError(f"the snapshot at {path} mixes commits {', '.join(sorted(commits))}; download it again at "
                        f"one revision")
    return commits.pop() if commits else None


def checked_commit(dataset_id: str, path: str | None, pinned: str | None, *, key: str) -> str | None:
    """The commit `dataset_id` is read at: `pinned` (the setting `key` names it), checked against its snapshot at
    `path` when it is read from one (UserError, one line, saying how to download it, when the snapshot is at
    another), else the snapshot's own commit; None when neither says. A read at no commit is warned of."""
    found = snapshot_commit(path) if path else None
    if path and pinned and found != pinned:
        hint = f"it is at commit {found}" if found else "it records no commit"
        raise UserError(f"{key}: revision {pinned} of {dataset_id} is not the snapshot at {path} ({hint}); make it "
                        f"with hf download --repo-type dataset {dataset_id} --revision {pinned} --local-dir {path}")
    commit = pinned or found
    if commit is None or not COMMIT.fullmatch(commit):
        warnings.warn(f"{dataset_id} is read unpinned (at {commit or 'its default branch'}); name its commit in "
                      f"{key}", UnpinnedDatasetWarning, stacklevel=3)
    return commit
