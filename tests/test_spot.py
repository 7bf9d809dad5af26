"""A cloud's spot notice read from a real metadata server on 127.0.0.1 answering as AWS's IMDSv2 and GCP's
metadata do, and turned into one drain with the time left (the drain itself on a real Ray node:
tests/test_multinode.py)."""

from __future__ import annotations

import datetime
import http.server
import json
import threading

import pytest

from raybiphase import ray_internals, spot


class Metadata(http.server.BaseHTTPRequestHandler):
    """AWS: a token for PUT /latest/api/token, 404 for the notice until `reclaim_at` is set, then the action and its
    time (only with the token). GCP: `instance/preempted` FALSE, then TRUE (only with Metadata-Flavor)."""

    reclaim_at: datetime.datetime | None = None

    def log_message(self, *args):  # quiet
        pass

    def _answer(self, status: int, body: str = "") -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def do_PUT(self):
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._answer(200, "token-1") if ok else self._answer(400)

    def do_GET(self):
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                return self._answer(401)
            if self.reclaim_at is None:
                return self._answer(404)
            when = self.reclaim_at.strftime("%Y-%m-%dT%H:%M:%SZ")
            return self._answer(200, json.dumps({"action": "terminate", "time": when}))
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403)
            return self._answer(200, "TRUE" if self.reclaim_at else "FALSE")
        self._answer(404)


@pytest.fixture
def metadata():
    handler = type("Handler", (Metadata,), {"reclaim_at": None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_no_notice_until_the_cloud_schedules_a_reclaim_then_the_time_left(metadata):
    handler, url = metadata
    assert spot.aws_notice(url) is None and spot.gcp_notice(url) is None
    now = datetime.datetime(2026, 11, 28, 8, 0, 0, tzinfo=datetime.UTC)
    handler.reclaim_at = now + datetime.timedelta(seconds=120)
    assert spot.aws_notice(url, now=now.timestamp) == spot.Notice("aws", 120)
    assert spot.gcp_notice(url) == spot.Notice("gcp", spot.GCP_NOTICE_S)


def test_the_watch_drains_once_on_the_first_notice_and_says_so(metadata):
    handler, url = metadata
    drained, said, polls = [], [], []

    def poll():
        polls.append(1)
        if len(polls) == 3:  # the cloud schedules the reclaim between the second and third poll
            handler.reclaim_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=90)
        return spot.aws_notice(url)

    notice = spot.watch(poll, drained.append, every_s=0.01, say=said.append)
    assert len(polls) == 3 and drained == [notice] and notice.cloud == "aws" and 80 <= notice.seconds_left <= 90
    assert said == [f"spot-watch: aws reclaims this node in {notice.seconds_left} s; draining it through Ray"]


def test_an_unreachable_metadata_server_is_polled_again_not_a_notice():
    said, calls = [], []

    def poll():
        calls.append(1)
        if len(calls) == 1:
            return spot.gcp_notice("http://127.0.0.1:9", timeout_s=0.5)  # nothing listens on port 9
        return spot.Notice("gcp", 30)

    assert spot.watch(poll, lambda notice: None, every_s=0.01, say=said.append) == spot.Notice("gcp", 30)
    assert said[0].startswith("spot-watch: metadata not read (")


def test_the_drain_is_rays_preemption_drain_with_the_deadline():
    command = ray_internals.drain_node_command(42, "aws spot notice: 42 s left", node_id="ab" * 28)
    assert command[:2] == ["ray", "drain-node"]
    assert command[command.index("--reason") + 1] == "DRAIN_NODE_REASON_PREEMPTION"
    assert command[command.index("--deadline-remaining-seconds") + 1] == "42"
    assert command[command.index("--node-id") + 1] == "ab" * 28
