"""The lock of the CPU environment the README's CPU figures are measured in, and its digest for the records.

    python benchmarks/environment.py lock --torch-wheel PATH   # rewrite benchmarks/requirements-cpu.lock from here
    python benchmarks/environment.py check                     # this environment against the lock; its sha256

`lock` pins every package installed here that the README's setup (`pip install -c constraints.txt -e '.[dev]'`)
brings, at the version installed here, with the hashes of PyPI's files for this machine's platform and Python
(`uv pip compile --generate-hashes`, uv from PyPI). torch is the CPU build (`+cpu`), which PyPI does not serve: its
one hash is that of the wheel installed here, given by `--torch-wheel`. The lock reproduces an environment:

    pip install --require-hashes --no-deps -r benchmarks/requirements-cpu.lock \\
        --extra-index-url https://download.pytorch.org/whl/cpu
    pip install --no-deps -e .

A record made in an environment that matches the lock names it (`environment`: the lock's path and sha256, from
`environment()`); `check` exits 1 naming the packages that differ.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "benchmarks" / "requirements-cpu.lock"
PLATFORM = "x86_64-manylinux_2_28"  # the Linux wheels' tag uv resolves for, this machine's kind
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """{package: version} of this environment, the project itself left out (it installs from the checkout)."""
    found = {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    found.pop("raybiphase", None)
    return found


def locked(text: str) -> dict[str, str]:
    return {canonical(name): version for name, version in PIN.findall(text)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compile_lock(torch_wheel: Path) -> str:
    """The lock's text: uv's hash-pinned resolution of the project's `dev` install at this environment's versions,
    kept to the packages installed here (PyPI's torch would add CUDA packages the CPU build does not need), torch's
    entry the installed CPU wheel's."""
    versions = installed()
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "pins.txt"  # the local label (+cpu) off: the resolution runs against PyPI
        pins.write_text("".join(f"{n}=={v.split('+')[0]}\n" for n, v in sorted(versions.items())))
        out = Path(tmp) / "out.lock"
        subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--generate-hashes",
                        "--python-version", ".".join(platform.python_version_tuple()[:2]), "--python-platform",
                        PLATFORM, "--constraints", str(pins), "--extra", "dev", "--custom-compile-command",
                        "python benchmarks/environment.py lock", "--output-file", str(out), "pyproject.toml"],
                       cwd=REPO, check=True)
        blocks = re.split(r"\n(?=\S)", out.read_text())
    kept = []
    for block in blocks:
        pin = PIN.match(block)
        if pin is None:  # the header's comments
            kept.append(block)
        elif canonical(pin[1]) == "torch":
            kept.append(f"torch=={versions['torch']} \\\n    --hash=sha256:{sha256(torch_wheel)}\n"
                        "    # the CPU build, from PyTorch's CPU index (https://download.pytorch.org/whl/cpu)")
        elif canonical(pin[1]) in versions:
            kept.append(block)
    return "\n".join(kept).rstrip("\n") + "\n"


def differences(lock: Path = LOCK) -> list[str]:
    """The packages whose installed version is not the lock's, as 'name: installed X, lock Y'."""
    have, want = installed(), locked(lock.read_text())
    return [f"{name}: installed {have.get(name, 'none')}, lock {version}"
            for name, version in sorted(want.items()) if have.get(name) != version]


def environment() -> dict | str:
    """What a record says of the environment that made it: the lock's path and sha256 when every locked package is
    installed at the lock's version, else a sentence saying the environment matches no committed lock."""
    if LOCK.exists() and not differences():
        return {"lock": LOCK.relative_to(REPO).as_posix(), "sha256": sha256(LOCK)}
    return "unknown: this environment does not match benchmarks/requirements-cpu.lock"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lock = commands.add_parser("lock", help="rewrite the lock from this environment")
    lock.add_argument("--torch-wheel", type=Path, required=True, help="the torch CPU wheel installed here")
    commands.add_parser("check", help="this environment against the lock")
    args = parser.parse_args()
    if args.command == "lock":
        LOCK.write_text(compile_lock(args.torch_wheel))
        print(f"wrote {LOCK.relative_to(REPO)} (sha256 {sha256(LOCK)})")
        return 0
    differ = differences()
    for line in differ:
        print(line)
    print(f"{LOCK.relative_to(REPO)} sha256 {sha256(LOCK)}: " + ("this environment matches it" if not differ else
                                                                  f"{len(differ)} package(s) differ"))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
