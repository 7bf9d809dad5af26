"""A sweep staged by size (sweep.stages: by_size): the driver's gate holds a size back until the smaller ones and
their fine-tuning are done, skips the arms the smaller sizes' rows decide, writes the decision down once and reads
it back on resume; the dry run prices the full and the staged plan. Results rows are built directly: no training."""

from __future__ import annotations

import io

import pytest

from raybiphase import storage
from raybiphase.config import load
from raybiphase.config.sweep import SweepSpec
from raybiphase.planning.cost import checkpoint_finetune_gpu_hours, segment_gpu_hours
from raybiphase.planning.plan import make_plan
from raybiphase.planning.stage_forecast import stage_lines, staged_gpu_hours
from raybiphase.results.rows import FINETUNE_KEY
from raybiphase.results.stats.staging import Skip, StageDecision
from raybiphase.results.store import append_rows, read_rows
from raybiphase.storage import FINETUNE_FILE, STAGES_FILE, SweepPaths
from raybiphase.sweep.size_gate import SizeStages, with_sources
from raybiphase.telemetry.console import Console
from tests.results.test_staging import study_rows


def _spec(tmp_path, stages: str = "by_size") -> SweepSpec:
    """Three sizes of the quickstart's three arms at 420 steps (MLM, CLM 100 then MLM, CLM), named as the rows of
    tests.results.test_predict name them."""
    return load(SweepSpec, "sweeps/quickstart.yaml", overrides=[
        f"sweep.storage={tmp_path}", f"sweep.stages={stages}", "phases.steps=420", "model.size=micro",
        "sweep.grid={'model.size': ['micro', 'tiny', 'mini'], 'phases.clm_share': [0.0, 0.2380952380952381, 1.0]}"])


def _gate(spec: SweepSpec) -> SizeStages:
    plan = make_plan(spec)
    return SizeStages(SweepPaths.of(spec.sweep.storage, spec.sweep.name), plan, spec.sweep.decide_probability,
                      console=Console(io.StringIO()))


def _by_size(gate: SizeStages) -> dict[str, list]:
    out: dict[str, list] = {}
    for segment in gate.plan.segments.values():
        out.setdefault(gate.size_of[segment.id], []).append(segment)
    return out


def test_a_by_size_sweep_skips_the_arm_the_smaller_sizes_decide_and_a_resume_decides_the_same(tmp_path) -> None:
    spec = _spec(tmp_path)
    paths = SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    append_rows(paths.table(FINETUNE_FILE), study_rows(("micro", "tiny")), key=FINETUNE_KEY)
    done: set[str] = set()
    gate = _gate(spec)
    sizes = _by_size(gate)
    assert all(gate.ready(s, done) for s in sizes["micro"])  # the smallest size: everything, at once
    assert not any(gate.ready(s, done) for s in sizes["tiny"] + sizes["mini"])  # micro not done yet
    done |= {s.id for s in sizes["micro"]}
    assert all(gate.ready(s, done) for s in sizes["tiny"])  # two sizes needed to predict: tiny launches whole
    done |= {s.id for s in sizes["tiny"]}
    assert not any(gate.ready(s, done, finetuning_open=True) for s in sizes["mini"])  # tiny's fine-tuning still runs
    clm = next(r for r in gate.plan.runs if r.startswith("mini-clm-420-"))
    ready = {s.id: gate.ready(s, done) for s in sizes["mini"]}
    # CLM serves finding 1 only, decided by micro and tiny: its own segment never starts; the prefix it shares
    # with the split run (which serves the open finding 4) does
    assert ready == {s.id: s.runs != [clm] for s in sizes["mini"]} and not all(ready.values())
    rows = read_rows(paths.table(STAGES_FILE))
    assert set(rows.loc[~rows["launched"], "run"]) == {clm} and len(rows) == 9
    assert rows.loc[~rows["launched"], "findings"].iloc[0].startswith("1. MLM beats CLM")

    # a resumed sweep reads the decision back, whatever the rows say now (without them, a fresh decision would
    # launch every arm)
    storage.delete(paths.table(FINETUNE_FILE))
    again = _gate(spec)
    assert {s.id: again.ready(s, set(done)) for s in sizes["mini"]} == ready
    assert len(read_rows(paths.table(STAGES_FILE))) == 9  # nothing written twice


def test_the_dry_run_prices_the_full_and_the_staged_plan(tmp_path) -> None:
    spec = _spec(tmp_path)
    plan = make_plan(spec)
    (before,) = stage_lines(plan, spec)
    assert before.startswith("staging: by_size at decide_probability 0.9: the full plan ")
    assert "micro, tiny always run; before any rows, each arm of mini launches with prior probability 0.5" in before
    full, staged, _ = staged_gpu_hours(plan, spec)
    mini = [s for s in plan.segments.values() if s.runs[0].startswith("mini-")]
    assert full > staged > full - sum(segment_gpu_hours(s, spec) for s in mini) - 3 * checkpoint_finetune_gpu_hours(
        "mini", spec)
    paths = SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    append_rows(paths.table(FINETUNE_FILE), study_rows(("micro", "tiny")), key=FINETUNE_KEY)
    full, staged, known = staged_gpu_hours(plan, spec)  # what the line says once the rows are there
    assert known == ["mini from micro, tiny: 2 of 3 run(s) launch"]
    clm = next(r for r in plan.runs.values() if r.name.startswith("mini-clm-420-"))
    own = [plan.segments[s] for s in clm.segments if plan.segments[s].runs == [clm.name]]
    finetuning = checkpoint_finetune_gpu_hours("mini", spec)  # its final checkpoint, the full grid
    assert staged == pytest.approx(full - sum(segment_gpu_hours(s, spec) for s in own) - finetuning)


@pytest.mark.parametrize("stages", ["all"])
def test_a_sweep_not_staged_has_no_staging_line(tmp_path, stages) -> None:
    spec = _spec(tmp_path, stages)
    assert stage_lines(make_plan(spec), spec) == []


def test_a_launched_continued_run_launches_the_run_it_continues() -> None:
    plan = make_plan(load(SweepSpec, "sweeps/paper.yaml"))
    continued = "610m-clm-dec42k-mlm40-44k-723811"
    source = plan.runs[continued].source
    decision = StageDecision("610m", (continued,), (Skip(source, "1. MLM beats CLM on SC and QA 99%", ""),), (), "")
    after = with_sources(decision, plan)
    assert set(after.launch) == {continued, source} and after.skipped == ()


class _Fit:
    """A segment as a job of the one scheduler (raybiphase.sweep.segments.SegmentFit's interface), trained at once;
    `order` gets its size as it starts."""

    def __init__(self, gate: SizeStages, segment, order: list[str]):
        from raybiphase.planning.plan import dependencies

        self.gate, self.segment, self.id, self.order = gate, segment, segment.id, order
        self.after, self.chain = frozenset(dependencies(segment, gate.plan.runs)), 0.0
        self.table, self.key = None, ()

    def fit(self, restarts) -> list:
        return []

    def committed(self) -> int:
        return -1

    def last_sign(self) -> float:
        return 0.0

    def stop(self) -> bool:
        return False

    def started(self, running) -> None:
        self.order.append(self.gate.size_of[self.id])

    def rows(self, value) -> list:
        return value

    def ended(self, seconds, running, done) -> None:
        pass

    def sources(self) -> list:
        return []

    def try_over(self) -> None:
        pass


def test_the_scheduler_runs_the_sizes_in_order_and_ends_with_the_skipped_segment_never_started(tmp_path) -> None:
    from raybiphase.sweep.scheduler import Scheduler

    spec = _spec(tmp_path)
    append_rows(SweepPaths.of(spec.sweep.storage, spec.sweep.name).table(FINETUNE_FILE), study_rows(("micro", "tiny")),
                key=FINETUNE_KEY)
    gate, order = _gate(spec), []
    scheduler = Scheduler(None, slots=2, console=Console(io.StringIO()), gate=gate)
    scheduler.run([_Fit(gate, segment, order) for segment in gate.plan.segments.values()], lambda: [])
    sizes = _by_size(gate)
    assert order == sorted(order, key=["micro", "tiny", "mini"].index)  # smallest first
    never = {s.id for s in gate.plan.segments.values()} - scheduler.done
    assert len(never) == 1 and [s.runs for s in sizes["mini"] if s.id in never][0][0].startswith("mini-clm-420-")


class _Processes:
    """The scheduler's trial runner, reduced to what it is told about keeping trials' processes."""

    def __init__(self):
        self.told: list[str] = []

    def settle(self) -> None:
        self.told.append("reuse")

    def unsettle(self) -> None:
        self.told.append("fresh")


def test_trials_reuse_their_processes_only_while_every_pending_segment_waits_on_its_sizes_gate(tmp_path) -> None:
    """While a size's segments wait for the smaller sizes' fine-tuning, no segment can take a slot before the trials
    end: trials keep their processes then; once a size's gate opens and its segments train, trials start their own
    again (a process Tune kept would hold what a segment's workers ask for); with no segment left, they keep them."""
    from raybiphase.finetune.fanout import Fanout
    from raybiphase.sweep.scheduler import Job, Scheduler

    spec = _spec(tmp_path)
    gate, runner = _gate(spec), _Processes()
    scheduler = Scheduler(Fanout.of(spec), slots=2, console=Console(io.StringIO()), gate=gate,
                          trials=lambda capacity, ended: runner)
    sizes = {size: [_Fit(gate, s, []) for s in segments] for size, segments in _by_size(gate).items()}
    scheduler.pending = [fit for fits in sizes.values() for fit in fits]
    scheduler.settle()  # micro's segments are ready
    scheduler.running = {fit.id: 0.0 for fit in sizes["micro"]}
    scheduler.pending = sizes["tiny"] + sizes["mini"]
    scheduler.settle()  # micro trains
    scheduler.running, scheduler.done = {}, {fit.id for fit in sizes["micro"]}
    scheduler.jobs = {1: Job(1, "micro@420", work=None)}  # micro's checkpoints still fine-tuned: tiny waits
    scheduler.settle()
    scheduler.jobs = {1: Job(1, "bert@0", work=None, own=False)}  # only a public encoder's trials: tiny may start
    scheduler.settle()
    scheduler.jobs, scheduler.pending = {}, []  # every segment done
    scheduler.settle()
    assert runner.told == ["fresh", "fresh", "reuse", "fresh", "reuse"]
