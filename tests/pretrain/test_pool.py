"""Kept worker groups (raybiphase.pretrain.pool): the board that hands a group its segments, in plain asyncio (no
Ray), and a segment that fails every try on a real group, given up with its workers' error. That a kept group's
segments end with the weights of their runs trained alone is checked by the sweeps that use it
(tests/sweep/test_driver.py, tests/sweep/test_beyond_study.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from raybiphase import storage
from raybiphase.pretrain.pool import JobBoard, committed_step


def _board(attempts: int = 3, committed: dict | None = None) -> JobBoard:
    """A board whose jobs' newest committed checkpoint is read from `committed` (job -> step), as the real one
    reads the job's folder."""
    committed = {} if committed is None else committed
    return JobBoard(attempts, progress=lambda job: committed.get(job, -1))


async def _take(board: JobBoard, group: int):
    """What a group's rank 0 does: the next job, then its start (None: nothing to train)."""
    item = await board.next(group)
    return item if item is not None and await board.start(group, item[0]) else None


def test_a_group_takes_the_jobs_in_order_and_a_restarted_group_takes_the_unfinished_one_again():
    async def scenario():
        board = _board()
        await board.give("a")
        await board.give("b")
        group = await board.join()
        assert await _take(board, group) == (0, "a")
        await board.done(0)
        assert await _take(board, group) == (1, "b")
        restarted = await board.join()  # a worker died: Ray Train restarted the group mid-job
        assert await _take(board, restarted) == (1, "b")
        await board.done(1)
        assert await board.wait(0) is None and await board.wait(1) is None

    asyncio.run(scenario())


def test_a_call_of_a_group_that_died_takes_nothing_and_a_closed_board_gives_nothing():
    async def scenario():
        board = _board(attempts=1)
        old = await board.join()
        waiting = asyncio.create_task(board.next(old))  # its caller dies while it waits; it returns to no one
        await asyncio.sleep(0)
        await board.give("a")
        assert await asyncio.wait_for(waiting, 1) == (0, "a")
        assert not await board.taken(0)  # not started: the one try is still the live group's
        new = await board.join()
        assert not await board.start(old, 0)  # a call of the dead group is stale
        assert await _take(board, new) == (0, "a")
        await board.done(0)
        await board.give("b")  # handed over, then the pool closes before any group takes it
        ended = asyncio.create_task(board.wait(1))
        await board.close()
        assert await board.next(new) is None
        assert "closed before the segment ended" in await asyncio.wait_for(ended, 1)
        assert not await board.taken(1)

    asyncio.run(scenario())


def test_a_job_is_given_up_after_its_tries_from_one_checkpoint_and_progress_starts_the_count_again():
    async def scenario():
        committed = {}
        board = _board(attempts=2, committed=committed)
        await board.give("a")
        for step in (None, 4, None, None):  # two tries from the start, the second commits step 4; two from it
            assert await _take(board, await board.join()) == (0, "a")
            if step:
                committed["a"] = step
            await board.failed(0, f"ValueError: loss is nan after step {committed.get('a', 0)}")
            await board.failed(0, "RuntimeError: a peer rank hung up")  # another rank's, after the first
        ended = asyncio.create_task(board.wait(0))
        assert await _take(board, await board.join()) is None  # a third try from step 4: given up, the pool closes
        assert await asyncio.wait_for(ended, 1) == "ValueError: loss is nan after step 4"
        assert board.closed

    asyncio.run(scenario())


def test_a_bucket_unreachable_past_its_outage_budget_gives_the_job_up_at_once():
    """A restart would wait the same outage out again: the first such error ends the job, with its one line."""
    async def scenario():
        board = _board(attempts=3)
        await board.give("a")
        assert await _take(board, await board.join()) == (0, "a")
        ended = asyncio.create_task(board.wait(0))
        line = "storage: s3://b/runs/a/history.json unreachable for 15 min (sweep.storage_outage_s = 900 s; ...)"
        await board.failed(0, line, final=True)
        assert await asyncio.wait_for(ended, 1) == f"stopped: {line}"
        assert await _take(board, await board.join()) is None  # the restarted group gets nothing: no second try

    asyncio.run(scenario())


def test_a_restart_that_grows_an_elastic_group_is_no_try_and_a_lost_group_is_said_as_lost():
    async def scenario():
        board = _board(attempts=1)
        await board.give("a")
        assert await _take(board, await board.join(1)) == (0, "a")  # started on the one node there was room on
        assert await _take(board, await board.join(2)) == (0, "a")  # room for two: Ray Train restarted it larger
        assert await _take(board, await board.join(1)) is None  # then a node went, saying nothing: given up
        assert "worker group was lost" in await board.wait(0)

    asyncio.run(scenario())


def test_the_board_counts_progress_from_the_newest_committed_checkpoint_of_the_segments_folder(tmp_path):
    """A checkpoint without its meta (a save cut short) is no progress; a segment with no folder yet has none."""
    run_dir = tmp_path / "run"
    job = SimpleNamespace(run_dir=str(run_dir))
    assert committed_step(job) == -1
    for step, committed in ((2, True), (4, False)):
        folder = run_dir / storage.checkpoint_name(step)
        folder.mkdir(parents=True)
        if committed:
            (folder / storage.META).write_text("{}")
    assert committed_step(job) == 2


@pytest.mark.ray
@pytest.mark.slow
def test_a_segment_that_fails_every_try_is_given_up_with_its_workers_error(small_data, tmp_path):
    """On a real group: the segment's shards are missing, so every try fails as its Worker is built; the restarted
    group is given the same segment, and after the last try the driver's call raises the workers' error; the
    group's Ray Train folder is removed once it has ended."""
    from raybiphase.pretrain.job import SegmentJob
    from raybiphase.pretrain.pool import WorkerPools
    from tests.conftest import tiny_config

    spec = tiny_config(tmp_path, small_data, **{"resources.num_workers": 1})
    job = SegmentJob(run=spec.run, name="broken", run_dir=str(tmp_path / "runs" / "broken"),
                     data_dir=str(tmp_path / "no-shards"), kept_group=True)
    pools = WorkerPools(str(tmp_path / "pools"), segments=1, attempts=2)
    with pytest.raises(RuntimeError, match=r"(?s)the workers of broken failed 2 times.*UserError: data: no "
                                           r"prepared dataset at .*no-shards"):
        pools.train(job)
    pools.close()
    assert not pools.open and not list((tmp_path / "runs").glob("broken/step-*"))
    assert not (tmp_path / "pools").exists() or not any((tmp_path / "pools").iterdir())
