"""What prepared shards were made from: the data settings they depend on, their fingerprint (the name of a
sweep's or the cache's shard folder), and the check that shards found at a given `data.dir` were made as the
config asks. A dataset whose folder the settings do not name is never reused silently: a run that trained on
other shards than its config says would report a corpus, a vocabulary or a length it never saw.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from raybiphase.config import DataConfig
from raybiphase.config.identity import DECONTAMINATION_FIELDS
from raybiphase.data import decontam, sources
from raybiphase.data.stream import FORMAT_VERSION
from raybiphase.errors import UserError

VERSION_KEYS = {"format": "the shard format", "offline_corpus": "the offline corpus"}  # set by the code, not data.*


def shard_settings(data: DataConfig) -> dict:
    """Everything that determines the shards, as JSON would hold it: not where they lie, how many passes a run may
    make nor the order it reads them in; decontamination only as it holds tasks out (with the rule's version)."""
    keys = {k: v for k, v in asdict(data).items()
            if k not in ("dir", "max_epochs", "row_order", *DECONTAMINATION_FIELDS)
            and not (k == "hf_revision" and v is None)}  # unpinned shards keep the fingerprint they had before it
    if data.decontamination():
        keys["decontamination"] = {**data.decontamination(), "rule": decontam.RULE_VERSION}
    if data.source == "offline":  # what the offline corpus holds changes with the code (held-out evaluation text)
        keys["offline_corpus"] = sources.OFFLINE_CORPUS_VERSION
    keys["format"] = FORMAT_VERSION
    return json.loads(json.dumps(keys, sort_keys=True))


def fingerprint(data: DataConfig) -> str:
    """Short hash of `shard_settings(data)`."""
    return _digest(shard_settings(data))


def _digest(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def check_made_as_asked(data: DataConfig, manifest: dict, location: str) -> None:
    """UserError naming the first setting whose value differs between `data` and the shards at `location`
    (decontamination first, in its own words); a manifest that predates the recorded settings names none."""
    decontam.check_prepared(data, manifest, location)
    made, asked = manifest.get("settings"), shard_settings(data)
    if manifest.get("fingerprint") == _digest(asked):
        return
    keep = "leave data.dir empty or prepare the data elsewhere"
    if made is None:
        raise UserError(f"data.dir: the shards at {location} were made with other data settings than this "
                        f"config's (fingerprint {manifest.get('fingerprint')}, not {_digest(asked)}); {keep}")
    name = min(k for k in {*made, *asked} if made.get(k) != asked.get(k))
    if name in VERSION_KEYS:
        raise UserError(f"data.dir: the shards at {location} hold {VERSION_KEYS[name]} of another raybiphase "
                        f"version ({made.get(name)}, this one makes {asked.get(name)}); {keep}")
    raise UserError(f"data.{name}: the shards at {location} were made with {made.get(name)!r}, unlike this "
                    f"config ({asked.get(name)!r}); {keep}")
