#!/bin/sh
# Creates this machine's Ray cluster token once: 256 random bits, hex, in ~/.raybiphase/ray-token (or $1), readable
# by you alone. `ray up` carries it to every node (file_mounts in aws.yaml and gcp.yaml); for Kubernetes,
# the first lines of cluster/kuberay-rayjob.yaml make a Secret of it. It is never printed: the script says only where it is. Run it again and
# the existing token is kept (a cluster started with it keeps accepting your jobs); delete the file to make a new one.
set -eu
token_file="${1:-$HOME/.raybiphase/ray-token}"
if [ -s "$token_file" ]; then
    echo "Ray token: kept $token_file"
    exit 0
fi
mkdir -p "$(dirname "$token_file")"
umask 077
# no newline: the file is exactly the token, as Ray reads it (RAY_AUTH_TOKEN_PATH) and as kubectl stores it
python3 -c 'import secrets, sys; sys.stdout.write(secrets.token_hex(32))' > "$token_file.partial"
mv "$token_file.partial" "$token_file"
echo "Ray token: wrote $token_file (mode 600)"
