#!/usr/bin/env bash
# Creates, once per Google Cloud project, the two service accounts cluster/gcp.yaml's nodes run as, and their roles:
#   raybiphase-head    roles/compute.instanceAdmin.v1 on the project (Ray's autoscaler creates and deletes the
#                      workers' VMs), roles/iam.serviceAccountUser on raybiphase-worker alone (it may launch VMs as
#                      that account and as no other), roles/storage.objectAdmin on the sweep's bucket alone
#   raybiphase-worker  roles/storage.objectAdmin on the sweep's bucket alone; nothing on the project
#   cluster/gcp-roles.sh YOUR_PROJECT_ID YOUR_BUCKET
# Safe to run again: an existing account is kept, and a binding that exists is left as it is. Needs gcloud with
# credentials that may manage IAM in the project and on the bucket.
set -euo pipefail

if (($# != 2)) || [[ ! $1 =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]$ ]] || [[ ! $2 =~ ^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$ ]]
then
    echo "usage: cluster/gcp-roles.sh PROJECT BUCKET   (the project's id; the bucket as in gs://BUCKET/raybiphase)" >&2
    exit 2
fi
project=$1
bucket=$2
head="raybiphase-head@$project.iam.gserviceaccount.com"
worker="raybiphase-worker@$project.iam.gserviceaccount.com"

# The service account NAME (its email EMAIL), created unless it exists.
ensure_account() {
    if ! gcloud iam service-accounts describe "$2" --project "$project" >/dev/null 2>&1; then
        gcloud iam service-accounts create "$1" --project "$project" --display-name "$3"
    fi
}
# A binding naming an account created seconds ago can be refused until IAM has propagated it: try for a minute.
retry() {
    local attempt
    for attempt in 1 2 3 4 5 6; do
        "$@" && return 0
        echo "retrying in 10 s ($attempt/6)" >&2
        sleep 10
    done
    "$@"
}

ensure_account raybiphase-head "$head" "raybiphase Ray head: launches the workers"
ensure_account raybiphase-worker "$worker" "raybiphase Ray workers: the sweep's bucket"

retry gcloud projects add-iam-policy-binding "$project" --member "serviceAccount:$head" \
    --role roles/compute.instanceAdmin.v1 --condition None --format none
retry gcloud iam service-accounts add-iam-policy-binding "$worker" --project "$project" \
    --member "serviceAccount:$head" --role roles/iam.serviceAccountUser --format none
for account in "$head" "$worker"; do
    retry gcloud storage buckets add-iam-policy-binding "gs://$bucket" --member "serviceAccount:$account" \
        --role roles/storage.objectAdmin --format none
done
echo "raybiphase-head and raybiphase-worker: project $project, bucket gs://$bucket"
