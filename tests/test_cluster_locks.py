"""Reproducible cluster nodes (cluster/): every package a node installs pinned and hashed within the project's
ranges, every image pinned by digest or one cluster/pin-images.sh pins. No network: seconds."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.test_cluster import AUTOSCALER_CONFIGS, CLUSTER, DIGEST, LOCKS, ROOT, kuberay_documents, load

# --- Reproducible nodes: the locks and the images ---------------------------------------------------------------


def parse_lock(name: str) -> dict[str, tuple[Requirement, list[str]]]:
    """Each requirement of a lock, by its canonical name, with its hashes (pip's continuation lines joined)."""
    text = (CLUSTER / name).read_text().replace("\\\n", " ")
    locked = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split(" --hash=")
        parsed = Requirement(requirement.strip())
        assert canonicalize_name(parsed.name) not in locked, f"{name}: {parsed.name} twice"
        locked[canonicalize_name(parsed.name)] = (parsed, [option.strip() for option in options])
    return locked


def input_requirements(lock: str) -> list[Requirement]:
    """What the lock must hold: pyproject's dependencies (and the lock's extras), its build backend, and for the
    head's lock the cloud clients."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lines = [*pyproject["project"]["dependencies"], *pyproject["build-system"]["requires"]]
    for extra in LOCKS[lock]:
        lines += pyproject["project"]["optional-dependencies"][extra]
    inputs = ["requirements-build.in"] + (["requirements-head.in"] if lock == "requirements-cpu.lock" else [])
    for name in inputs:
        lines += [line for line in (CLUSTER / name).read_text().splitlines() if line and not line.startswith("#")]
    return [Requirement(line) for line in lines]


def constraints() -> list[Requirement]:
    """constraints.txt's pins, each without a local version label: the nodes' torch is PyPI's CUDA build of the
    version a development machine pins as `+cpu` (cluster/lock.sh drops the label the same way)."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    return [Requirement(re.sub(r"^([^=]+==[^+;\s]+)\+[\w.]+", r"\1", line)) for line in lines if line]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_locked_package_is_pinned_hashed_and_within_the_projects_ranges(lock):
    locked = parse_lock(lock)
    for name, (requirement, hashes) in locked.items():
        (spec,) = requirement.specifier
        assert spec.operator == "==" and not requirement.marker, f"{lock}: {requirement} is not one pinned version"
        assert "+" not in spec.version, f"{lock}: {requirement}: a local build (the nodes take PyPI's)"
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{lock}: {name} unhashed"
    for requirement in [*input_requirements(lock), *constraints()]:
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{lock}: {requirement} is missing"
        version = Version(next(iter(locked[name][0].specifier)).version)
        assert requirement.specifier.contains(version, prereleases=True), f"{lock}: {name} {version} not {requirement}"


def test_the_locks_are_for_the_nodes_python_and_the_gpu_lock_has_cudas_torch():
    import ray

    script = (CLUSTER / "lock.sh").read_text()
    image_python = re.search(r"-py(\d)(\d+)-", load("gcp.yaml")["docker"]["worker_image"]).groups()
    assert f"python_version={'.'.join(image_python)}" in script and "platform=x86_64-manylinux" in script
    for lock in LOCKS:
        locked = parse_lock(lock)
        assert str(locked["ray"][0].specifier) == f"=={ray.__version__}", "the nodes run the Ray you submit from"
        # PyPI's Linux torch is the CUDA build: it brings NVIDIA's CUDA libraries (the CPU wheel has none)
        assert any(name.startswith("nvidia-") for name in locked), f"{lock}: no CUDA libraries beside torch"


def config_images() -> dict[str, set[str]]:
    """Every container image the cluster files name, by file: the autoscaler configs' docker images, the RayJob's
    containers and the FROM line of the image's Dockerfile in its comments."""
    images = {name: {load(name)["docker"][k] for k in ("head_image", "worker_image")} for name in AUTOSCALER_CONFIGS}
    cluster = kuberay_documents()["RayJob"]["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    dockerfile = re.findall(r"^#\s+FROM\s+(\S+)", (CLUSTER / "kuberay-rayjob.yaml").read_text(), re.M)
    images["kuberay-rayjob.yaml"] = {c["image"] for t in templates for c in t["spec"]["containers"]} | set(dockerfile)
    return images


def test_every_image_is_pinned_by_digest_or_is_a_tag_pin_images_pins():
    listed = subprocess.run(["bash", str(CLUSTER / "pin-images.sh"), "--list"], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    to_pin = {tuple(line.split(" ")) for line in listed if line}
    images_by_file = config_images()
    for name, images in images_by_file.items():
        for image in images:
            if "YOUR_" in image:  # the user's own image: pinned by the digest their push prints (docs/cluster.md)
                assert name == "kuberay-rayjob.yaml", image
            elif not DIGEST.search(image):
                assert (f"cluster/{name}", image) in to_pin, f"{name}: {image}: not pinned, nor one the script pins"
            else:
                assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), f"{name}: {image} lost its tag"
    assert {image for _, image in to_pin} <= set().union(*images_by_file.values())


# --- GPU hosts: the driver each cluster boots runs the lock's CUDA ---------------------------------------------


def host_images(name: str) -> set[str]:
    """The machine image every node type of an autoscaler config boots."""
    node_configs = [t["node_config"] for t in load(name)["available_node_types"].values()]
    if name == "aws.yaml":
        return {config["ImageId"] for config in node_configs}
    return {disk["initializeParams"]["sourceImage"] for config in node_configs for disk in config["disks"]}


def driver_runs(driver: str, needed: Version) -> bool:
    """Whether `driver` (a full version, or a branch such as "580": its first release) is `needed` or newer."""
    version = Version(driver)
    return version >= needed if len(version.release) > 1 else version.major >= needed.major


def test_every_gpu_host_has_a_driver_the_locks_cuda_runs_on():
    """PyPI's torch brings its CUDA libraries but not the driver: the hosts' driver must be one the lock's CUDA major
    runs on (CUDA 13: 580 or newer; torch 2.13's wheels on a 570 driver find no usable GPU). Each config boots the
    image cluster/gpu-drivers.json states, and a Deep Learning VM family's name agrees with the driver given."""
    table = json.loads((CLUSTER / "gpu-drivers.json").read_text())
    cuda = Version(next(iter(parse_lock("requirements-gpu.lock")["nvidia-cuda-runtime"][0].specifier)).version)
    needed = Version(table["cuda_min_driver"][str(cuda.major)])
    assert set(table["hosts"]) == set(AUTOSCALER_CONFIGS)
    for name, host in table["hosts"].items():
        assert host_images(name) == {host["image"]}, f"{name}: boots another image than cluster/gpu-drivers.json's"
        assert driver_runs(host["driver"], needed), f"{name}: driver {host['driver']} cannot run CUDA {cuda}"
        if family := re.search(r"-nvidia-(\d+)$", host["image"]):
            assert family[1] == host["driver"].split(".")[0], f"{name}: the image family installs driver {family[1]}"
    for name in table["unmanaged"]:  # hosts the file does not choose: it says what they need
        assert f"driver {needed.major} or newer" in (CLUSTER / name).read_text(), name


@pytest.mark.parametrize("driver, runs", [("570", False), ("570.172.08", False), ("575.51.03", False),
                                          ("580", True), ("580.105.08", True), ("595.91.07", True)])
def test_a_driver_below_580_is_refused_for_cuda_13(driver, runs):
    """The pairing the check exists for: torch 2.13's CUDA 13 wheels on the driver-570 images the configs booted."""
    assert driver_runs(driver, Version("580.65.06")) is runs
