"""Kept worker groups: one Ray Train worker group trains one sweep segment after another.

A `TorchTrainer.fit()` per segment starts a Train controller, a placement group and worker processes that import
torch, transformers and the loop again: about 10 s a segment on 2 cores (benchmarks/bench_segment_start.py), paid
by every segment of a sweep's tree. A *pool* is one fit whose train function (`pool_loop`) asks a `Board` actor
for its next `SegmentJob`, trains it with a fresh `Worker` (model, optimizer, restore, data stream: nothing is
carried from the job before but the processes and their process group), and asks again; the driver hands it the
next ready segment of the same resource shape (`WorkerPools`), and closes it as soon as none is ready, so that an
idle group never holds the slots fine-tuning could use.

What a segment run by a pool keeps of a fit of its own:
- Checkpoints land in the segment's folder, committed as always: the workers upload their shards there themselves
  (`SegmentJob.kept_group`), since Ray Train's run folder is the pool's; resuming reads the segment's newest
  committed checkpoint (raybiphase.pretrain.loop.restore), so restarts and later invocations resume exactly.
- Failures: when a worker or a whole node is lost, or a preemption notice ends the step, Ray Train restarts the
  group (elastic ones with the workers left, or more once room appears), and the restarted group asks the board
  again: it is given the same segment, which resumes from its newest committed checkpoint. A segment is tried at
  most `ATTEMPTS` times from the same checkpoint (a fit per segment allowed two restarts in all; a kept group's
  restarts also come from elastic growth, which is no failure, and one from a newer checkpoint made progress);
  then the board gives up on it and the driver raises the workers' last error, for that segment alone.
- Weights: bit-identical to a fit per segment (checked by bench_segment_start.py and the quickstart's record).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import traceback
import uuid
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raybiphase import storage
from raybiphase.config import ResourcesConfig
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.loop import Worker, rank_world
from raybiphase.pretrain.trainer import group_trainer

ATTEMPTS = 3
"""Tries per segment: the first and two restarts (what `max_failures=2` gave a fit per segment)."""
WAIT_S = 0.5
"""How often a driver thread waiting on a segment looks whether its pool's fit has ended."""


class JobBoard:
    """One pool's jobs, in the order the driver hands them: the group takes the first job not finished (after a
    restart: the same one again), counts its tries, and reports it finished; the driver waits on each job's end.
    An async actor: waiting calls do not block the others."""

    def __init__(self, attempts: int = ATTEMPTS):
        self.jobs: list[SegmentJob] = []
        self.finished = 0
        self.tries: dict[int, int] = {}
        self.resumed_at: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        self.given_up: dict[int, str] = {}
        self.closed = False
        self.group = 0
        self.attempts = attempts
        self.changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def give(self, job: SegmentJob) -> int:
        """Queue `job` for the group; its index (what `wait` takes)."""
        self.jobs.append(job)
        await self._notify()
        return len(self.jobs) - 1

    async def join(self) -> int:
        """A (re)started group's number: calls of an earlier group still waiting in `next` return None."""
        self.group += 1
        await self._notify()
        return self.group

    async def next(self, group: int) -> tuple[int, SegmentJob] | None:
        """The first job not finished, once there is one (None: the pool is closed, a later group joined, or this
        job was tried `attempts` times: it is given up and the pool closes)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.closed or group != self.group or len(self.jobs) > self.finished)
        if self.closed or group != self.group:
            return None
        index = self.finished
        self.tries[index] = self.tries.get(index, 0) + 1
        if self.tries[index] > self.attempts:
            self.given_up[index] = self.errors.get(index, "the worker group was lost (a worker or its node died)")
            self.closed = True
            await self._notify()
            return None
        return index, self.jobs[index]

    async def resumed(self, index: int, step: int) -> None:
        """Job `index` was restored at `step`: a try from a newer checkpoint than the last one made progress, and
        counts as the first again."""
        if step > self.resumed_at.get(index, -1):
            self.resumed_at[index], self.tries[index] = step, 1

    async def failed(self, index: int, error: str) -> None:
        """A worker's error while training job `index` (the group restarts, or the fit ends)."""
        self.errors[index] = error

    async def done(self, index: int) -> None:
        self.finished = max(self.finished, index + 1)
        await self._notify()

    async def close(self) -> None:
        self.closed = True
        await self._notify()

    async def wait(self, index: int) -> str | None:
        """Once job `index` has finished (None) or was given up (the workers' last error)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.finished > index or index in self.given_up)
        return self.given_up.get(index)


Board = ray.remote(num_cpus=0)(JobBoard)


# ------------------------------------------------------------------------------------------------ the workers


def pool_loop(loop_config: dict) -> None:
    """A kept group's train function: the board's jobs in turn until it closes. Rank 0 asks the board and every
    rank trains what rank 0 was given; each job's end is reported once every rank has finished it."""
    board = loop_config["board"]
    rank, world = rank_world()
    group = ray.get(board.join.remote()) if rank == 0 else 0
    while True:
        item = [ray.get(board.next.remote(group)) if rank == 0 else None]
        if world > 1:
            dist.broadcast_object_list(item, src=0)
        if item[0] is None:
            return
        index, job = item[0]
        try:
            worker = Worker(job)
            if rank == 0:
                ray.get(board.resumed.remote(index, worker.step))
            worker.train()
            del worker
        except BaseException as err:
            ray.get(board.failed.remote(index, "".join(traceback.format_exception(err)).strip()))
            raise
        if world > 1:
            dist.barrier()  # every rank is through the job (and its last checkpoint) before the next is taken
        if rank == 0:
            ray.get(board.done.remote(index))
        gc.collect()  # the job's model, optimizer and stream go before the next job's are built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # a compiled job's graphs: the next model is another one


# ------------------------------------------------------------------------------------------------ the driver


def shape(res: ResourcesConfig) -> tuple:
    """What a worker group is made of: jobs of the same shape can share it."""
    return res.num_workers, res.cpus_per_worker, res.gpus_per_worker, res.resize_check_s


def new_board(attempts: int):
    """A board on the driver's node: it outlives any worker node the group loses."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return Board.options(scheduling_strategy=here).remote(attempts)


@dataclass(eq=False)
class Pool:
    """One kept worker group: its board and its fit, running in a driver thread of its own."""

    shape: tuple
    board: object
    folder: str
    attempts: int = ATTEMPTS
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self, res: ResourcesConfig, name: str, max_failures: int) -> None:
        trainer = group_trainer(res, pool_loop, {"board": self.board}, name=name,
                                storage_path=storage.parent(self.folder), max_failures=max_failures)
        self.thread = threading.Thread(target=self._fit, args=(trainer,), daemon=True, name=f"pool {name}")
        self.thread.start()

    def _fit(self, trainer) -> None:
        try:
            trainer.fit()
        except Exception as err:  # raised in the thread of the segment it was training
            self.error = err

    def train(self, job: SegmentJob) -> None:
        """Hand the group `job` and wait for its end; raises what ended it otherwise."""
        ended = self.board.wait.remote(ray.get(self.board.give.remote(job)))
        while True:
            ready, _ = ray.wait([ended], timeout=WAIT_S)
            if ready:
                error = ray.get(ready[0])
                if error is not None:
                    raise RuntimeError(f"the workers of {job.name} failed {self.attempts} times from the same "
                                       f"checkpoint; the last error:\n{error}")
                return
            if not self.thread.is_alive():
                raise self.error or RuntimeError(f"the worker group of {job.name} ended before the segment did")

    def close(self) -> None:
        """End the group (its fit returns once the job under way, if any, is through)."""
        ray.get(self.board.close.remote())


class WorkerPools:
    """The driver's kept worker groups. A segment's thread `train`s its job on the pool it was handed (`claim`,
    from the driver's main thread as the segment starts) or on a new one; once the driver has seen it end, the pool
    is `free`d for the next segment of its shape, and closed by `release` when none took it. Ray Train run folders
    go under `folder` (the sweep's storage: every node writes there) and are removed as their pools close."""

    def __init__(self, folder: str, *, segments: int, attempts: int = ATTEMPTS):
        self.folder, self.attempts = folder, attempts
        self.max_failures = attempts * segments  # Ray Train's count is the group's: the board counts per segment
        self.token = uuid.uuid4().hex[:8]  # a later invocation never takes an earlier one's Ray Train run
        self.numbers = itertools.count()
        self.lock = threading.Lock()
        self.finished: dict[str, Pool] = {}  # segment name -> the pool that trained it, until the driver frees it
        self.idle: list[Pool] = []
        self.open: list[Pool] = []

    def claim(self, res: ResourcesConfig) -> Pool | None:
        with self.lock:
            pool = next((p for p in self.idle if p.shape == shape(res)), None)
            if pool is not None:
                self.idle.remove(pool)
            return pool

    def train(self, job: SegmentJob, pool: Pool | None = None) -> None:
        if pool is not None and not pool.thread.is_alive():  # its fit ended while it waited: a fresh group
            self._end(pool)
            pool = None
        if pool is None:
            name = f"{self.token}-{next(self.numbers)}"
            pool = Pool(shape(job.run.resources), new_board(self.attempts), storage.join(self.folder, name), self.attempts)
            pool.start(job.run.resources, name, self.max_failures)
            with self.lock:
                self.open.append(pool)
        try:
            pool.train(job)
        except BaseException:
            self._end(pool)
            raise
        with self.lock:
            self.finished[job.name] = pool

    def free(self, name: str) -> None:
        """The driver has seen segment `name` end: its pool may take the next segment."""
        with self.lock:
            pool = self.finished.pop(name, None)
            if pool is not None:
                self.idle.append(pool)

    def release(self) -> None:
        """Close the pools no segment took."""
        with self.lock:
            idle, self.idle = self.idle, []
        for pool in idle:
            self._end(pool)

    def close(self, timeout_s: float = 120.0) -> None:
        """Close every pool and wait for its fit to return."""
        with self.lock:
            pools, self.idle, self.finished = list(self.open), [], {}
        for pool in pools:
            self._end(pool)
        for pool in pools:
            pool.thread.join(timeout_s)

    def _end(self, pool: Pool) -> None:
        with self.lock:
            if pool not in self.open:
                return
            self.open.remove(pool)
        try:
            pool.close()
        except Exception:  # the board went with a failed fit
            pass
        threading.Thread(target=self._remove, args=(pool,), daemon=True).start()

    @staticmethod
    def _remove(pool: Pool) -> None:
        pool.thread.join()
        storage.delete(pool.folder)  # Ray Train's own records of the group: no checkpoint is kept there
