"""Segments trained in the test's own process: a `make_trainer` for `run_sweep(..., make_trainer=InProcessTrainer)`.

The studies a test runs end to end (several sizes, many segments, hundreds of trials) would spend most of their time
starting a Ray Train worker group per segment on a 2-core machine. This trainer runs a segment's production loop
(raybiphase.pretrain.loop.train_loop) in the process that fits it, as one rank, and does for it what Ray Train does
for a worker: it takes the loop's reports (`ray.train.report`), copies each reported checkpoint into the segment's
run folder under its checkpoint_dir_name, and hands back the `ray.train.Result` Ray Train would. Its torch
threads are those Ray gives a worker of resources.cpus_per_worker (OMP_NUM_THREADS: the CPUs, at least one), so a
segment ends with the weights a worker group of one trains, bit for bit. It neither restarts nor drains: a test about restarts, preemption or several workers runs real worker groups.

Ray Train's training-function utilities are one object per process, and a model draws its initial weights from
torch's process-wide generator: the sweep's scheduler fits segments from threads side by side, so these fits take
turns (one at a time in the process), each under utilities of its own.
"""

from __future__ import annotations

import threading
from pathlib import Path

import ray.train
import torch
from ray.train.v2._internal.execution import train_fn_utils as ray_fn_utils

from raybiphase import storage, transfer

_ONE_AT_A_TIME = threading.Lock()


class _FitUtils(ray_fn_utils.LocalTrainFnUtils):
    """One fit's utilities: each reported checkpoint copied into its run folder and registered with its report."""

    def __init__(self, name: str, run_dir: str):
        super().__init__(experiment_name=name)
        self.run_dir, self.registered = run_dir, []

    def report(self, metrics, checkpoint=None, checkpoint_dir_name=None, **_):
        if checkpoint is not None:
            location = storage.join(self.run_dir, checkpoint_dir_name)
            transfer.upload(Path(checkpoint.path), location)
            checkpoint = ray.train.Checkpoint(location)
            self.registered.append((checkpoint, dict(metrics)))
        super().report(metrics, checkpoint=checkpoint)


class InProcessTrainer:
    """`make_trainer(job, max_failures=..., callbacks=..., train_fn=...)`'s stand-in: `fit()` trains the
    SegmentJob in this process (with `train_fn`, else the production loop) and returns the `ray.train.Result` Ray
    Train would: the loop's return value, the last report and checkpoint, and every checkpoint as
    `best_checkpoints` (the sweep keeps them all)."""

    def __init__(self, job, *, max_failures: int = 0, callbacks=(), train_fn=None):
        self.job, self.train_fn = job, train_fn

    def fit(self) -> ray.train.Result:
        from raybiphase.pretrain.loop import train_loop

        with _ONE_AT_A_TIME:
            utils, saved = _FitUtils(self.job.name, self.job.run_dir), ray_fn_utils._train_fn_utils
            threads = torch.get_num_threads()
            ray_fn_utils.set_train_fn_utils(utils)
            torch.set_num_threads(max(1, int(self.job.run.resources.cpus_per_worker)))  # as Ray sets a worker's
            try:
                value = (self.train_fn or train_loop)({"job": self.job})
            finally:
                ray_fn_utils.set_train_fn_utils(saved)
                torch.set_num_threads(threads)
        checkpoint, metrics = utils.registered[-1] if utils.registered else (None, utils._get_last_metrics())
        return ray.train.Result(metrics=metrics, checkpoint=checkpoint, error=None, path=self.job.run_dir,
                                best_checkpoints=utils.registered, return_value=value)
