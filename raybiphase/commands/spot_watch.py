"""`raybiphase spot-watch --cloud aws|gcp`: on a worker node, turn the cloud's spot notice into a Ray drain.

Started beside `ray start` on every worker node of the cluster configs; it polls the instance metadata until the
cloud announces a reclaim, drains the node with the time left, and exits (raybiphase.spot).
"""

from __future__ import annotations

import argparse
import functools

from raybiphase import ray_internals, spot


def main() -> int:
    parser = argparse.ArgumentParser(prog="raybiphase spot-watch", description=__doc__.split("\n")[0])
    parser.add_argument("--cloud", required=True, choices=sorted(spot.NOTICES), help="whose metadata to poll")
    parser.add_argument("--endpoint", help="the metadata server (default: the cloud's own)")
    parser.add_argument("--node-id", help="the Ray node to drain (default: the node this runs on)")
    parser.add_argument("--address", help="the Ray cluster (default: the one this node belongs to)")
    parser.add_argument("--every-s", type=float, default=2.0, help="seconds between polls (default 2)")
    args = parser.parse_args()
    ray_internals.check()  # `ray drain-node` must be there before a notice comes
    poll = spot.NOTICES[args.cloud]
    if args.endpoint:
        poll = functools.partial(poll, args.endpoint)
    spot.watch(poll, functools.partial(spot.run_drain, node_id=args.node_id, address=args.address),
               every_s=args.every_s, say=lambda line: print(line, flush=True))
    return 0
