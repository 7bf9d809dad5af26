#!/usr/bin/env bash
# Creates, once per AWS account, the two roles cluster/aws.yaml's nodes run as, each with an instance profile of
# its name, both limited to the sweep's bucket:
#   raybiphase-head    the bucket (aws-policy.json) and the EC2 calls Ray's autoscaler makes (aws-head-policy.json)
#   raybiphase-worker  the bucket (aws-policy.json), nothing else
# and EC2's service-linked role for spot instances, which the spot worker groups need.
#   cluster/aws-roles.sh YOUR_BUCKET
# Safe to run again: what exists is kept, and the two policies are replaced by the files' current text (edit them,
# run this, and the roles follow). Needs the AWS CLI with credentials that may manage IAM.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# != 1)) || [[ ! $1 =~ ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ ]]; then
    echo "usage: cluster/aws-roles.sh BUCKET   (the bucket's name, as in s3://BUCKET/raybiphase)" >&2
    exit 2
fi
bucket=$1
account=$(aws sts get-caller-identity --query Account --output text)
trust='{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
  "Principal": {"Service": "ec2.amazonaws.com"}}]}'

# A policy file of cluster/ with this bucket and account in place of its placeholders.
policy() {
    sed -e "s/YOUR_BUCKET/$bucket/g" -e "s/YOUR_ACCOUNT_ID/$account/g" "cluster/$1"
}

for role in raybiphase-head raybiphase-worker; do
    if ! aws iam get-role --role-name "$role" >/dev/null 2>&1; then
        aws iam create-role --role-name "$role" --assume-role-policy-document "$trust" >/dev/null
        echo "created role $role"
    fi
    aws iam put-role-policy --role-name "$role" --policy-name raybiphase-bucket \
        --policy-document "$(policy aws-policy.json)"
    if ! aws iam get-instance-profile --instance-profile-name "$role" >/dev/null 2>&1; then
        aws iam create-instance-profile --instance-profile-name "$role" >/dev/null
        echo "created instance profile $role"
    fi
    roles=$(aws iam get-instance-profile --instance-profile-name "$role" \
        --query 'InstanceProfile.Roles[].RoleName' --output text)
    if ! tr '\t' '\n' <<<"$roles" | grep -qx "$role"; then
        aws iam add-role-to-instance-profile --instance-profile-name "$role" --role-name "$role"
    fi
done
aws iam put-role-policy --role-name raybiphase-head --policy-name raybiphase-launch \
    --policy-document "$(policy aws-head-policy.json)"

if ! aws iam get-role --role-name AWSServiceRoleForEC2Spot >/dev/null 2>&1; then
    aws iam create-service-linked-role --aws-service-name spot.amazonaws.com >/dev/null
    echo "created role AWSServiceRoleForEC2Spot"
fi
echo "raybiphase-head and raybiphase-worker: bucket $bucket in account $account"
