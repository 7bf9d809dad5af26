"""Kept worker groups: one Ray Train worker group trains one sweep segment after another.

Starting a worker group costs a Train controller, a placement group, worker processes that import torch,
transformers and the loop, and their process group: several seconds a segment (benchmarks/bench_segment_start.py
measures it), paid by every segment of a sweep's tree. A *pool* is one fit whose train function (`pool_loop`) asks
a `Board` actor for its next `SegmentJob`, trains it with a fresh `Worker` (model, optimizer, restore, data stream:
nothing is carried from the job before but the processes and their process group), and asks again; the driver
hands it the next ready segment of the same resource shape (`WorkerPools`), and closes it as soon as none is
ready, so that an idle group never holds the slots fine-tuning could use.

What a segment trained by a pool keeps of a fit of its own:
- Checkpoints land in the segment's folder, committed as always: the workers upload their shards there themselves
  (`SegmentJob.kept_group`), since Ray Train's run folder is the pool's; resuming reads the segment's newest
  committed checkpoint (raybiphase.pretrain.loop.restore), so restarts and later invocations resume exactly.
- Failures: when a worker or a whole node is lost, or a preemption notice ends the step, Ray Train restarts the
  group (elastic ones with the workers left, or more once room appears), and the restarted group asks the board
  again: it is given the same segment, which resumes from its newest committed checkpoint. A segment is tried at
  most `ATTEMPTS` times from the same checkpoint (a try that committed a newer one made progress; a restart that
  grew an elastic group is no try); then the board gives up on it and the driver raises the workers' last error,
  for that segment alone.
- Weights: the same, bit for bit, as a fit of its own (the segment's config, data and resume point are the same).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import time
import traceback
import uuid
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raybiphase import storage
from raybiphase.config import ResourcesConfig
from raybiphase.outages import StorageOutage
from raybiphase.pretrain.checkpoint import latest_committed
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.loop import Worker, rank_world
from raybiphase.pretrain.trainer import group_trainer

ATTEMPTS = 3
"""Tries per segment from one checkpoint: the first and two restarts."""
WAIT_S = 0.5
"""How often a driver thread waiting on a segment looks whether its pool's fit has ended."""


class JobBoard:
    """One pool's jobs, in the order the driver hands them: the group takes the first job not finished (after a
    restart: the same one again), and reports it finished; the driver waits on each job's end. The board counts a
    job's tries since its newest committed checkpoint (`progress`: a try that committed one made progress; a
    restart that only grew an elastic group is no try) and gives the job up after `attempts`. An async actor:
    waiting calls do not block the others."""

    def __init__(self, attempts: int = ATTEMPTS, progress=None):
        self.jobs: list[SegmentJob] = []
        self.finished = 0
        self.tries: dict[int, int] = {}
        self.progress_at: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        self.given_up: dict[int, str] = {}
        self.closed = False
        self.group, self.world, self.grew = 0, 0, False
        self.attempts = attempts
        self.progress = progress or committed_step
        self.changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def give(self, job: SegmentJob) -> int:
        """Queue `job` for the group; its index (what `wait` takes)."""
        self.jobs.append(job)
        await self._notify()
        return len(self.jobs) - 1

    async def join(self, world: int = 1) -> int:
        """A (re)started group of `world` workers; its number: calls of an earlier group still waiting in `next`
        return None."""
        under_way = self.finished in self.tries and self.finished < len(self.jobs)
        self.grew, self.world = under_way and 0 < self.world < world, world
        self.group += 1
        await self._notify()
        return self.group

    async def next(self, group: int) -> tuple[int, SegmentJob] | None:
        """The first job not finished, once there is one (None: the pool is closed or a later group joined). A
        group's rank 0 then `start`s it: a call of a group that died while it waited takes nothing."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.closed or group != self.group or len(self.jobs) > self.finished)
        if self.closed or group != self.group:
            return None
        return self.finished, self.jobs[self.finished]

    async def start(self, group: int, index: int) -> bool:
        """Group `group` starts job `index`: one more try, counted anew when the job's newest committed checkpoint
        is newer than at its last try, not counted when the restart only grew the group. False: the call is stale,
        or the job was tried `attempts` times since its newest checkpoint and is given up (the pool closes)."""
        job = self.jobs[index]
        try:
            step = await asyncio.to_thread(self.progress, job)  # storage reads: the other calls go on meanwhile
        except Exception:  # unreadable now: counted as no progress
            step = -1
        if self.closed or group != self.group or index != self.finished:
            return False
        progressed = step > self.progress_at.get(index, -1)
        if progressed:  # the last try committed a checkpoint: tries count anew
            self.progress_at[index], self.tries[index] = step, 0
        if progressed or not self.grew:
            self.tries[index] = self.tries.get(index, 0) + 1
        self.grew = False
        if self.tries[index] > self.attempts:
            self.given_up[index] = self.errors.get(index, "the worker group was lost (a worker or its node died)")
            self.closed = True
            await self._notify()
            return False
        self.errors.pop(index, None)  # a new try: its own first error is the one said
        return True

    async def taken(self, index: int) -> bool:
        """Whether a group has started job `index`."""
        return index in self.tries

    async def failed(self, index: int, error: str, *, final: bool = False) -> None:
        """A worker's error while training job `index` (the group restarts, or the fit ends): the try's first
        error is kept (the other ranks' follow from it). `final`: another try cannot help (the bucket stayed
        unreachable for the whole outage budget, which a restart would only wait out again): the job is given up."""
        self.errors.setdefault(index, error)
        if final and index not in self.given_up:
            self.given_up[index] = f"stopped: {error}"
            self.closed = True
            await self._notify()

    async def done(self, index: int) -> None:
        self.finished = max(self.finished, index + 1)
        await self._notify()

    async def close(self) -> None:
        self.closed = True
        await self._notify()

    async def wait(self, index: int) -> str | None:
        """Once job `index` has finished (None) or was given up or left when the pool closed (why)."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.finished > index or self.closed)
        if self.finished > index:
            return None
        return self.given_up.get(index, "the worker group was closed before the segment ended")


def committed_step(job: SegmentJob) -> int:
    """The step of the job's newest committed checkpoint in its own folder (-1: none)."""
    location = latest_committed(job.run_dir)
    return -1 if location is None else storage.step_of(location)


Board = ray.remote(num_cpus=0)(JobBoard)


# ------------------------------------------------------------------------------------------------ the workers


def pool_loop(loop_config: dict) -> None:
    """A kept group's train function: the board's jobs in turn until it closes. Rank 0 asks the board and every
    rank trains what rank 0 was given; each job's end is reported once every rank has finished it."""
    board = loop_config["board"]
    rank, world = rank_world()
    group = ray.get(board.join.remote(world)) if rank == 0 else 0
    while True:
        item = [ray.get(board.next.remote(group)) if rank == 0 else None]
        if item[0] is not None and not ray.get(board.start.remote(group, item[0][0])):
            item = [None]
        if world > 1:
            dist.broadcast_object_list(item, src=0)
        if item[0] is None:
            return
        index, job = item[0]
        try:
            Worker(job).train()
        except StorageOutage as err:  # said in one line; no restart: it would wait the same outage out again
            ray.get(board.failed.remote(index, str(err), final=True))
            raise
        except BaseException as err:
            ray.get(board.failed.remote(index, "".join(traceback.format_exception(err)).strip()))
            raise
        if world > 1:
            dist.barrier()  # every rank is through the job (and its last checkpoint) before the next is taken
        if rank == 0:
            ray.get(board.done.remote(index))
        torch._dynamo.reset()  # a compiled job's graphs hold its model: the next model is another one
        gc.collect()  # the job's model, optimizer and stream go before the next job's are built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()  # each segment reports its own peak


# ------------------------------------------------------------------------------------------------ the driver


def shape(res: ResourcesConfig) -> tuple:
    """What a worker group is made of: jobs of the same shape can share it."""
    return res.num_workers, res.cpus_per_worker, res.gpus_per_worker, res.resize_check_s


def new_board(attempts: int):
    """A board on the driver's node: it outlives any worker node the group loses."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return Board.options(scheduling_strategy=here).remote(attempts)


class Untaken(RuntimeError):
    """A group's fit ended before the group took the job handed to it."""


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
        """Hand the group `job` and wait for its end; raises why it did not finish (`Untaken`: the fit ended
        before the group took it)."""
        index = ray.get(self.board.give.remote(job))
        ended = self.board.wait.remote(index)
        while not ray.wait([ended], timeout=WAIT_S)[0] and self.thread.is_alive():
            pass
        if not ray.wait([ended], timeout=WAIT_S)[0]:  # the fit ended first
            if not ray.get(self.board.taken.remote(index)):
                raise Untaken(f"the worker group for {job.name} ended before taking it: {self.error}")
            raise self.error or RuntimeError(f"the worker group of {job.name} ended before the segment did")
        error = ray.get(ended)
        if error is not None and error.startswith("stopped: "):
            raise RuntimeError(f"the workers of {job.name} {error}")
        if error is not None:
            head = f"the workers of {job.name} failed {self.attempts} times from the same checkpoint"
            raise RuntimeError(f"{head}\n{error}" if "Traceback" in error else f"{head}: {error}")

    def close(self) -> None:
        """End the group: its fit returns once the job under way, if any, is through."""
        ray.get(self.board.close.remote())


class WorkerPools:
    """The driver's kept worker groups. A segment's thread `train`s its job on the pool it was handed (`claim`,
    from the driver's main thread as the segment starts) or on a new one; once the driver has seen it end, the pool
    is `free`d for the next segment of its shape, and closed by `release` when none took it. Ray Train run folders
    go under `folder` (the sweep's storage: every node writes there) and are removed as their pools close.

    Ray Train's own failure budget is the group's, not a segment's: `attempts` for every segment of the sweep, so
    that no segment has fewer restarts than `attempts - 1` (the board's count per checkpoint decides before it)."""

    def __init__(self, folder: str, *, segments: int, attempts: int = ATTEMPTS):
        self.folder, self.attempts = folder, attempts
        self.max_failures = attempts * max(1, segments)
        self.token = uuid.uuid4().hex[:8]  # a later invocation never takes an earlier one's Ray Train run
        self.numbers = itertools.count()
        self.lock = threading.Lock()
        self.finished: dict[str, Pool] = {}  # segment name -> the pool that trained it, until the driver frees it
        self.idle: list[Pool] = []
        self.open: list[Pool] = []
        self.removals: list[threading.Thread] = []

    def claim(self, res: ResourcesConfig) -> Pool | None:
        with self.lock:
            pool = next((p for p in self.idle if p.shape == shape(res)), None)
            if pool is not None:
                self.idle.remove(pool)
            return pool

    def train(self, job: SegmentJob, pool: Pool | None = None) -> None:
        """Train `job` on `pool` (a kept group) or a new group; a kept group that ended before taking it is
        replaced by a new one."""
        kept = pool is not None
        pool = pool or self._start(job)
        try:
            pool.train(job)
        except Untaken:
            self.end(pool)
            if not kept:
                raise
            self.train(job)
            return
        except BaseException:
            self.end(pool)
            raise
        with self.lock:
            self.finished[job.name] = pool

    def _start(self, job: SegmentJob) -> Pool:
        name = f"{self.token}-{next(self.numbers)}"
        pool = Pool(shape(job.run.resources), new_board(self.attempts), storage.join(self.folder, name), self.attempts)
        pool.start(job.run.resources, name, self.max_failures)
        with self.lock:
            self.open.append(pool)
        return pool

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
            self.end(pool)

    def close(self, timeout_s: float = 120.0) -> None:
        """Close every pool, then wait, `timeout_s` in all, until their fits have returned and their Ray Train
        folders are removed (a group mid-segment returns once the segment is through)."""
        with self.lock:
            pools, self.idle, self.finished = list(self.open), [], {}
        for pool in pools:
            self.end(pool)
        deadline = time.monotonic() + timeout_s
        for removal in list(self.removals):
            removal.join(max(0.0, deadline - time.monotonic()))

    def end(self, pool: Pool) -> None:
        """Close `pool` (once) and remove its Ray Train folder when its fit has returned."""
        with self.lock:
            if pool not in self.open:
                return
            self.open.remove(pool)
        try:
            pool.close()
        except Exception:  # its board is gone (it lives on the driver's node: only with Ray itself)
            pass
        removal = threading.Thread(target=_remove, args=(pool,), daemon=True)
        removal.start()
        with self.lock:
            self.removals.append(removal)


def _remove(pool: Pool) -> None:
    pool.thread.join()
    try:
        storage.delete(pool.folder)  # Ray Train's own records of the group: no checkpoint is kept there
    except OSError:  # a bucket hiccup leaves a few small files; the next invocation removes them
        pass
