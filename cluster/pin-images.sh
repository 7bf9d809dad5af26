#!/usr/bin/env bash
# Pins every container image the cluster files name by tag to the digest that tag points at now, so every node of
# every cluster runs the same bytes: `rayproject/ray:2.60.0-py311-gpu` becomes
# `rayproject/ray:2.60.0-py311-gpu@sha256:...` (Docker pulls by the digest; the tag stays for the reader).
#   cluster/pin-images.sh            resolve and rewrite cluster/aws.yaml, cluster/gcp.yaml, cluster/kuberay-rayjob.yaml
#   cluster/pin-images.sh FILE...    the same for these files
#   cluster/pin-images.sh --list     print "FILE IMAGE" for each image it would pin; no network, changes nothing
# Run it before `ray up` (and commit the result) after a change of the image tags. It reads the images on the lines
# `image:`, `head_image:`, `worker_image:` and the Dockerfile's `FROM` in the comments; an image already pinned is
# left as it is (to re-pin, put the tag back), and one named by a placeholder (YOUR_REGISTRY/...: your own image,
# whose digest `docker push` prints) is for you to pin. Needs crane or docker buildx, and the registry's network.
set -euo pipefail
cd "$(dirname "$0")/.."

list_only=false
if [[ ${1:-} == --list ]]; then
    list_only=true
    shift
fi
if (($# == 0)); then
    set -- cluster/aws.yaml cluster/gcp.yaml cluster/kuberay-rayjob.yaml
fi

# The images a file names by tag alone, one per line.
tagged_images() {
    local value='[[:space:]]*"?([^"[:space:]]+)"?[[:space:]]*$'
    sed -nE -e "s/^[[:space:]]*(-[[:space:]]+)?(head_image|worker_image|image):$value/\\3/p" \
        -e 's/^#[[:space:]]+FROM[[:space:]]+([^[:space:]]+).*$/\1/p' "$1" |
        grep -v -e '@sha256:' -e 'YOUR_' | sort -u || true
}

# The digest of the manifest (or multi-platform index) a tag points at.
resolve() {
    local digest
    if command -v crane >/dev/null 2>&1; then
        digest=$(crane digest "$1")
    elif docker buildx version >/dev/null 2>&1; then
        digest=$(docker buildx imagetools inspect "$1" --format '{{json .Manifest}}' |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"])')
    else
        echo "pin-images.sh: needs crane or docker buildx to read the registry" >&2
        exit 1
    fi
    if [[ ! $digest =~ ^sha256:[0-9a-f]{64}$ ]]; then
        echo "pin-images.sh: $1: not a digest: $digest" >&2
        exit 1
    fi
    echo "$digest"
}

for file in "$@"; do
    while IFS= read -r image; do
        [[ -n $image ]] || continue
        if $list_only; then
            echo "$file $image"
            continue
        fi
        digest=$(resolve "$image")
        # the image as a literal, followed by the end of its value (a quote, a space or the end of the line)
        literal=$(printf '%s' "$image" | sed 's/[][\.*^$/]/\\&/g')
        sed -i -E "s/${literal}([\"[:space:]]|$)/${literal}@${digest}\\1/" "$file"
        echo "$file: $image@$digest"
    done < <(tagged_images "$file")
done
