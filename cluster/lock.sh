#!/usr/bin/env bash
# Regenerates the hash-checked locks every cluster node installs from (cluster/aws.yaml, cluster/gcp.yaml and the
# KubeRay image): run from anywhere after changing pyproject.toml's dependencies or constraints.txt, and commit the
# locks. Needs uv (`pip install uv`) and a package index; the locks are resolved for the nodes, not this machine:
# Linux x86_64 (manylinux_2_28) and the Python of the nodes' image (rayproject/ray:*-py311-*).
#   requirements-cpu.lock  the head (the -cpu image): the project, its build backend, the launchers' cloud clients
#   requirements-gpu.lock  the GPU workers (the -gpu image): the project with its `gpu` extra and build backend
# torch comes from PyPI, whose Linux x86_64 wheel is the CUDA build, on every node; constraints.txt pins its
# version, and a local version label there (`+cpu`, the CPU wheel a development machine installs) is dropped so
# the nodes get the CUDA build of the same torch.
set -euo pipefail
cd "$(dirname "$0")/.."

python_version=3.11
platform=x86_64-manylinux_2_28

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
sed -E 's/^([A-Za-z0-9._-]+==[^+[:space:]]+)\+[[:alnum:].]+/\1/' constraints.txt > "$constraints"

compile() {
    local output=$1
    shift
    uv pip compile --quiet --generate-hashes --only-binary :all: \
        --python-version "$python_version" --python-platform "$platform" --constraints "$constraints" \
        --custom-compile-command cluster/lock.sh --output-file "$output" "$@"
    # the annotations name the constraints by the file a reader has, not the temporary copy
    sed -i "s|$constraints|constraints.txt|" "$output"
    echo "wrote $output"
}

compile cluster/requirements-cpu.lock pyproject.toml cluster/requirements-build.in cluster/requirements-head.in
compile cluster/requirements-gpu.lock pyproject.toml cluster/requirements-build.in --extra gpu
