"""A cloud's spot notice turned into a Ray drain of this node, with the notice's deadline.

A spot or preemptible VM under Docker gets no SIGTERM its training processes see: the cloud announces the
reclaim in its instance metadata (AWS: `spot/instance-action`, about 2 minutes ahead; GCP: `instance/preempted`,
about 30 seconds ahead) and then stops the machine. `watch` polls that metadata on a worker node and, on a notice,
asks Ray to drain the node for preemption with the time left (`ray drain-node`, the call Ray's own autoscaler
makes). Ray Train's preemption watcher then tells the segment's workers (`raybiphase.pretrain.preemption`): they
checkpoint at the step under way and Ray Train restarts the group elsewhere at the deadline, counted apart from the
segment's failures. Every cluster config starts it beside `ray start` on worker nodes (`raybiphase spot-watch`).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from raybiphase import ray_internals

AWS_METADATA = "http://169.254.169.254"
GCP_METADATA = "http://metadata.google.internal"
GCP_NOTICE_S = 30  # GCP preempts 30 s after it sets `preempted` (its documented shutdown period)


@dataclass(frozen=True)
class Notice:
    """A reclaim the cloud announced: which cloud said it and the seconds left before the machine goes."""

    cloud: str
    seconds_left: int


def _get(url: str, headers: dict[str, str], timeout_s: float, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def aws_notice(endpoint: str = AWS_METADATA, *, now: Callable[[], float] = time.time,
               timeout_s: float = 2.0) -> Notice | None:
    """AWS's spot interruption notice (IMDSv2: a session token, then `spot/instance-action`, which answers 404 until
    a stop or terminate is scheduled, then {"action": ..., "time": "2026-11-28T08:22:00Z"})."""
    status, token = _get(f"{endpoint}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"},
                         timeout_s, method="PUT")
    if status != 200:
        return None
    status, body = _get(f"{endpoint}/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": token},
                        timeout_s)
    if status != 200 or not body:
        return None
    action = json.loads(body)
    when = datetime.datetime.fromisoformat(action["time"].replace("Z", "+00:00")).timestamp()
    return Notice("aws", max(0, int(when - now())))


def gcp_notice(endpoint: str = GCP_METADATA, *, timeout_s: float = 2.0) -> Notice | None:
    """GCP's preemption notice: `instance/preempted` turns TRUE when the VM is being preempted."""
    status, body = _get(f"{endpoint}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"}, timeout_s)
    return Notice("gcp", GCP_NOTICE_S) if status == 200 and body.strip().upper() == "TRUE" else None


NOTICES = {"aws": aws_notice, "gcp": gcp_notice}


def watch(poll: Callable[[], Notice | None], drain: Callable[[Notice], None], *, every_s: float = 2.0,
          say: Callable[[str], None] = print) -> Notice:
    """Poll until the cloud announces a reclaim, drain once and return the notice. A metadata server that does not
    answer is polled again (the machine may still be starting); nothing else stops the watch."""
    while True:
        try:
            notice = poll()
        except (OSError, ValueError, KeyError) as err:  # unreachable or garbled metadata: not a notice
            say(f"spot-watch: metadata not read ({err}); polling again")
            notice = None
        if notice is not None:
            say(f"spot-watch: {notice.cloud} reclaims this node in {notice.seconds_left} s; draining it through Ray")
            drain(notice)
            return notice
        time.sleep(every_s)


def run_drain(notice: Notice, node_id: str | None = None, address: str | None = None) -> None:
    """Drain through Ray's CLI; its refusal (an unknown node, a node already draining) is said, not raised: the
    machine goes anyway, and Ray Train restarts from the last checkpoint."""
    command = ray_internals.drain_node_command(notice.seconds_left, f"{notice.cloud} spot notice: "
                                               f"{notice.seconds_left} s left", node_id, address)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"spot-watch: ray drain-node failed ({done.returncode}): {done.stderr.strip()[-500:]}", flush=True)
