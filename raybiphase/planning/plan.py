"""The sweep planner (pure, no Ray): a grid of runs -> a tree of shared segments, each run once.

Two runs take the same optimizer step t when everything that shapes the weights is equal (model, data, seed,
batch, optimizer settings, masking probabilities: the run's *base*) and every step up to t is the same step: the
same kind (objective, optimizer reset, frozen blocks, masking range), masking ratio and learning rate
(raybiphase.planning.steps). Under WSD a 42k-step run is therefore, until its decay starts, the same run as its 12k and
22k siblings, and a CLM->MLM run is a CLM run until its switch. The planner compares runs exactly, piece by piece of
their schedules (raybiphase.phases), and builds a trie: a segment covers steps [start, end) of every run below it,
starts from its parent's checkpoint at `start`, and leaves one at `end`. Executing a run as a chain of segments gives
the same weights as running it alone (tests/sweep/test_driver.py). A segment's id hashes the base and every step up
to its end, so a changed spec finds the segments it already has.

Continued pretraining: `model.init_from: "@NAME"` names another run of the sweep (by its name without the hash,
e.g. `@610m-clm-42k`, or by its full name where several runs share that); the continuing run's tree hangs below that
run's last segment.

    plan = make_plan(load(SweepSpec, "sweeps/split_grid.yaml"))
    plan.naive_steps, plan.planned_steps   # 380000, 206000
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field

from raybiphase.config import ConfigError, FinetuneGrid, RunConfig, SweepSpec, from_dict, to_dict, weights_settings
from raybiphase.config.estimates import resolve_checkpoint_every
from raybiphase.config.identity import digest
from raybiphase.naming import run_name, steps_label
from raybiphase.phases import Schedule
from raybiphase.planning.cost import (
    checkpoint_finetune_gpu_hours,
    finetune_basis_text,
    gpu_hours_text,
    segment_gpu_hours,
)
from raybiphase.planning.grids import check_export_grids, checkpoint_grid, grid_lines, grid_trials
from raybiphase.planning.replicate_cost import replicate_lines
from raybiphase.planning.steps import first_difference, id_bytes, step_order, step_tag, step_value
from raybiphase.pretrain.budget import budget_lines, data_budget

# per-step settings: the planner compares them step by step, so they stay out of a run's base
_PER_STEP = {"phases": {"plan"}, "optim": {"lr", "warmup_steps", "decay_steps"}}


@dataclass
class Run:
    name: str
    config: RunConfig
    schedule: Schedule  # what each step does, piece by piece
    base: str
    source: str | None = None  # the run this one continues (init_from '@NAME'), by name
    segments: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return self.schedule.total_steps

    @functools.cached_property
    def finetune_steps(self) -> list[int]:
        """The checkpoints fine-tuned: the final one and the requested intermediate ones (train.export_steps)."""
        return sorted({*[s for s in self.config.train.export_steps if s < self.steps], self.steps})


@dataclass
class Segment:
    id: str
    start: int
    end: int
    parent: str | None  # segment whose checkpoint at `start` this one resumes from
    after_run: str | None  # for the first segment of a continued run: the source run (weights only)
    runs: list[str]  # runs passing through this segment
    config: RunConfig  # the first run's config: what trains on [start, end) is identical for every run
    ends_runs: list[str] = field(default_factory=list)  # runs whose last step is `end`
    exports: list[int] = field(default_factory=list)
    """Steps in (start, end] exported as HF folders: the union of what its runs fine-tune (Run.finetune_steps), not
    only what `config`'s run asks for (a shared segment exports every member run's steps)."""

    @property
    def steps(self) -> int:
        return self.end - self.start


@dataclass
class Control:
    """The untrained step-0 weights that runs start from (same model, seed and data): exported once, fine-tuned
    once as the control (`pretrain_step` 0) the pretrained runs are measured against."""

    name: str  # "<size>-init-<hash>"
    config: RunConfig  # the first of its runs' config (step 0 does not depend on phases or schedule)
    runs: list[str]


@dataclass
class Plan:
    runs: dict[str, Run]
    segments: dict[str, Segment]  # in dependency order
    controls: dict[str, Control] = field(default_factory=dict)

    @property
    def naive_steps(self) -> int:
        return sum(r.steps for r in self.runs.values())

    @property
    def planned_steps(self) -> int:
        return sum(s.steps for s in self.segments.values())

    def gpu_hours(self, spec: SweepSpec, *, planned: bool = True) -> float:
        """Estimated GPU-hours at spec.sweep.mfu of spec.sweep.gpu_peak_tflops (vocabulary: Llama-3's 128,256
        unless a tokenizer is trained, then data.vocab_size)."""
        items = self.segments.values() if planned else self.runs.values()
        return sum(segment_gpu_hours(item, spec) for item in items)

    def checkpoints(self) -> dict[tuple[str, int], list[str]]:
        """Every fine-tuned checkpoint, (segment id, step), with the runs whose weights it holds at that step, in
        plan order: one set of trials each (an export inside a shared prefix is one checkpoint, however
        many runs pass through it)."""
        out: dict[tuple[str, int], list[str]] = {}
        for run in self.runs.values():
            chain = iter(self.segments[s] for s in run.segments)  # in step order, as are the steps
            segment = next(chain)
            for step in run.finetune_steps:
                while not segment.start < step <= segment.end:
                    segment = next(chain)
                out.setdefault((segment.id, step), []).append(run.name)
        return out

    def grids(self, spec: SweepSpec) -> dict[tuple[str, int], FinetuneGrid]:
        """Each fine-tuned checkpoint's grid: the full one, or finetune.exports' for an intermediate step
        (raybiphase.planning.grids)."""
        return {(segment, step): checkpoint_grid([self.runs[n] for n in names], step, spec.finetune)
                for (segment, step), names in self.checkpoints().items()}

    def finetune_trials(self, spec: SweepSpec, *, distinct: bool = True) -> int:
        """Fine-tuning trials, every one run to its end: each checkpoint's grid (`grids`) and each control's full
        grid, tasks sharing a training task trained once (raybiphase.planning.grids.grid_trials); with
        `distinct=False`, as if every run's checkpoint and every task were fine-tuned apart (what sharing saves)."""
        runs = self.checkpoints()
        controls = len(self.controls) * grid_trials(spec.finetune.grid(), distinct=distinct)
        return controls + sum((1 if distinct else len(runs[key])) * grid_trials(grid, distinct=distinct)
                              for key, grid in self.grids(spec).items())

    def finetune_gpu_hours(self, spec: SweepSpec, *, evaluation_only: bool = False) -> float:
        """An upper bound on the fan-out's GPU-hours: every trial of each distinct checkpoint's grid and each
        control's (no ASHA stop), its steps and evaluations as raybiphase.planning.cost.trial_count counts them.
        `evaluation_only`: the evaluations' share alone."""
        runs = self.checkpoints()
        sized = [(self.runs[runs[key][0]].config.model.size, grid) for key, grid in self.grids(spec).items()]
        sized += [(c.config.model.size, spec.finetune.grid()) for c in self.controls.values()]
        return sum(checkpoint_finetune_gpu_hours(size, spec, grid, evaluation_only=evaluation_only)
                   for size, grid in sized)


def expand(spec: SweepSpec) -> list[RunConfig]:
    """The grid's cross product plus the explicit runs, each a validated RunConfig (`train.checkpoint_every: auto`
    resolved for it); errors name the swept key."""
    resolve_checkpoint_every(spec.run, spec.sweep)  # a base run that cannot resolve 'auto' is said as the base's error
    base = to_dict(spec.run)
    keys = list(spec.sweep.grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*spec.sweep.grid.values())] if keys else [{}]
    configs = []
    for combo, origin in zip(combos + [dict(run) for run in spec.sweep.runs], origins(spec)):
        try:
            configs.append(resolve_checkpoint_every(from_dict(RunConfig, base, _with_shorthand(combo, base)),
                                                    spec.sweep))
        except ConfigError as err:
            where = origin or "sweep.grid (" + ", ".join(f"{k}={v}" for k, v in combo.items()) + ")"
            raise ConfigError(f"{where}: {err}") from None
    return configs


def origins(spec: SweepSpec) -> list[str | None]:
    """Where each of `expand`'s runs comes from: None for the grid (or the base run), 'sweep.runs.<i>' for a run."""
    grid = 1
    for values in spec.sweep.grid.values():
        grid *= len(values)
    return [None] * grid + [f"sweep.runs.{i}" for i in range(len(spec.sweep.runs))]


def _with_shorthand(combo: dict, base: dict) -> dict:
    """Sweeping clm_steps over a base that sets clm_share (or the reverse) replaces it rather than clashing."""
    out = dict(combo)
    phases = base.get("phases", {})
    if "phases.clm_steps" in combo and phases.get("clm_share") is not None:
        out["phases.clm_share"] = None
    if "phases.clm_share" in combo and phases.get("clm_steps") is not None:
        out["phases.clm_steps"] = None
    return out


def base_key(cfg: RunConfig, source: str | None) -> str:
    """What two runs must share to share any step: the settings that shape the weights (raybiphase.config.run),
    less the per-step ones the planner compares (raybiphase.planning.steps), with a continued run's source named by its run."""
    data = weights_settings(cfg)
    for section, keys in _PER_STEP.items():
        data[section] = {k: v for k, v in data[section].items() if k not in keys}
    data["model"] = {**data["model"], "init_from": source or cfg.model.init_from}
    return digest(data, 12)


def init_key(cfg: RunConfig) -> str:
    """What fixes a run's step-0 weights: the model settings, the seed and the data (its tokenizer sets the
    vocabulary); runs that share it start from identical weights."""
    settings = weights_settings(cfg)
    return digest({"model": settings.get("model"), "seed": cfg.train.seed, "data": settings.get("data")}, 6)


def plan_controls(runs: dict[str, Run]) -> dict[str, Control]:
    """One control per distinct step-0 init among runs trained from scratch (a continued run, or one initialised
    from a decoder, starts from trained weights: no control)."""
    controls: dict[str, Control] = {}
    for run in runs.values():
        if run.source is not None or run.config.model.init_from:
            continue
        name = f"{run.config.model.size}-init-{init_key(run.config)}"
        controls.setdefault(name, Control(name, run.config, [])).runs.append(run.name)
    return controls


def shared_steps(a: Run, b: Run) -> int:
    """How many first steps runs `a` and `b` take alike (their bases aside): where the planner parts them."""
    return first_difference(a.schedule, b.schedule, 0, min(a.steps, b.steps))


def _short(name: str) -> str:
    return name.rsplit("-", 1)[0]


def make_plan(spec: SweepSpec) -> Plan:
    """The sweep's runs and the tree of segments they share (module docstring), in dependency order."""
    runs = plan_runs(expand(spec), origins(spec))
    _check_exports(runs)
    check_export_grids(runs, spec.finetune)
    segments: dict[str, Segment] = {}
    for continued in (False, True):  # runs from scratch first: a continued run hangs below its source's last segment
        group = [r for r in runs.values() if (r.source is not None) == continued]
        for _, members in itertools.groupby(sorted(group, key=lambda r: r.base), key=lambda r: r.base):
            members = list(members)
            _share(members, 0, None, members[0].source, segments, hashlib.sha256(members[0].base.encode()))
    ordered = _dependency_order(segments, runs)
    return Plan(runs=runs, segments=ordered, controls=plan_controls(runs) if spec.finetune.control else {})


def plan_runs(configs: list[RunConfig], origin: list[str | None] | None = None) -> dict[str, Run]:
    """Each distinct run under its name; a run continued from another (`model.init_from: "@<run>"`) is named after
    its source's last phase and steps, and knows its source. `origin` (from `origins`) names where each config comes
    from: two sweep.runs entries that make the same run are an error (`_add`; the grid may repeat a run: pure CLM at
    two mask ratios is one run)."""
    origin = origin or [None] * len(configs)
    runs: dict[str, Run] = {}
    entries: dict[str, str] = {}  # run name -> the sweep.runs entry that made it
    by_short: dict[str, list[str]] = {}
    pending = []
    for cfg, where in zip(configs, origin):
        if cfg.model.init_from and cfg.model.init_from.startswith("@"):
            pending.append((cfg, where))
            continue
        run = Run(run_name(cfg), cfg, Schedule.from_config(cfg), base_key(cfg, None))
        if _add(runs, entries, run, where):
            by_short.setdefault(_short(run.name), []).append(run.name)
    for cfg, where in pending:
        source = runs[_source(cfg.model.init_from[1:], runs, by_short, where)]
        name = run_name(cfg, source_label=step_tag(source.schedule, source.steps - 1), source_steps=source.steps)
        run = Run(name, cfg, Schedule.from_config(cfg), base_key(cfg, source.name), source=source.name)
        _add(runs, entries, run, where)
    return runs


def _add(runs: dict[str, Run], entries: dict[str, str], run: Run, where: str | None) -> bool:
    """Add `run` unless it is planned already (False). A sweep.runs entry making a run another entry made is an
    error, and so is one repeating a run of the grid (or the base run) with other settings: those would be lost."""
    if where is not None:
        if run.name in entries:
            raise ConfigError(f"{where}: the same run as {entries[run.name]} ({run.name}): they differ only in "
                              "settings that do not change the weights; merge the two entries")
        if run.name in runs and runs[run.name].config != run.config:
            raise ConfigError(f"{where}: the same run as one of sweep.grid or the base run ({run.name}), with "
                              "settings that do not change the weights: they would be lost; set them on the base run")
        entries[run.name] = where
    if run.name in runs:
        return False
    runs[run.name] = run
    return True


def _source(short: str, runs: dict[str, Run], by_short: dict[str, list[str]], where: str | None) -> str:
    """The run from scratch an `@NAME` reference names: by its name without the hash, or by its full name."""
    prefix = f"{where}: " if where else ""
    if short in runs and runs[short].source is None:
        return short
    if short not in by_short:
        known = ", ".join(sorted(by_short)) or "none"
        raise ConfigError(f"{prefix}model.init_from: '@{short}' names no run of this sweep; runs: {known}")
    if len(by_short[short]) > 1:
        raise ConfigError(f"{prefix}model.init_from: '@{short}' matches {len(by_short[short])} runs of this sweep: "
                          f"{', '.join(by_short[short])}; name one in full (with its hash)")
    return by_short[short][0]


def _check_exports(runs: dict[str, Run]) -> None:
    """train.export_steps apply to the runs that reach them (a sweep's short runs skip the later ones), but a step
    no run reaches is a mistake."""
    longest = max(r.steps for r in runs.values())
    for run in runs.values():
        for i, step in enumerate(run.config.train.export_steps):
            if step > longest:
                raise ConfigError(f"train.export_steps.{i}: {step} is beyond the last step of every run (phases.steps"
                                  f" of the longest: {longest})")


def _share(group: list[Run], start: int, parent: str | None, after_run: str | None,
           segments: dict[str, Segment], prefix) -> None:
    """Add to `segments` the segment the runs of `group` share from `start` (as far as their steps agree), then the
    segments of those that go on past it, depth first; a group that disagrees at a step splits by that step.
    `prefix` is a sha256 of the base and steps [0, start), which every run of `group` takes alike. A stack, not
    recursion: a grid's trie may be deeper than Python's recursion limit."""
    todo = [(group, start, parent, after_run, prefix, None)]
    while todo:
        group, start, parent, after_run, prefix, parted = todo.pop()
        parted = _parted(group, start) if parted is None else parted  # where each run parts from the longest
        end = min([*parted.values(), *(r.steps for r in group)])
        if end == start:  # the group disagrees at `start`: split it by the step, listed in the order of step_order
            for members in reversed(_split(group, start, parted)):  # the longest run's part keeps its comparisons
                kept = {r.name: parted[r.name] for r in members if r.name in parted}
                todo.append((members, start, parent, after_run, prefix, kept if len(kept) == len(members) - 1 else None))
            continue
        seg, hashed = _segment(group, start, end, parent, after_run, prefix)
        segments[seg.id] = seg
        rest = [r for r in group if r.steps > end]
        if rest:  # the longest run goes on: what was compared with it holds
            todo.append((rest, end, seg.id, None, hashed, {r.name: parted[r.name] for r in rest if r.name in parted}))


def _segment(group: list[Run], start: int, end: int, parent: str | None, after_run: str | None, prefix):
    """The segment `group` shares on [start, end), and the sha256 of the base and steps [0, end) its id ends with;
    each run of the group lists it."""
    first = group[0]
    hashed = prefix.copy()
    hashed.update(id_bytes(first.schedule, start, end))
    seg_id = (f"{first.config.model.size}-{step_tag(first.schedule, end - 1)}-{steps_label(start)}-"
              f"{steps_label(end)}-{hashed.hexdigest()[:8]}")
    seg = Segment(seg_id, start, end, parent, after_run, [r.name for r in group], first.config)
    for r in group:
        r.segments.append(seg.id)
    seg.ends_runs = [r.name for r in group if r.steps == end]
    seg.exports = sorted({s for r in group for s in r.finetune_steps if start < s <= end})
    return seg, hashed


def _split(group: list[Run], start: int, parted: dict[str, int]) -> list[list[Run]]:
    """`group` by its runs' step `start`, the parts in the order of step_order and each in the group's order; a run
    that parts from the longest run later than `start` takes the longest run's step there."""
    longest = next(r for r in group if r.name not in parted)
    same = step_value(longest.schedule, start)
    parts: dict[tuple, list[Run]] = {}
    for run in group:
        value = same if parted.get(run.name, start + 1) > start else step_value(run.schedule, start)
        parts.setdefault(value, []).append(run)
    return [members for _, members in sorted(parts.items(), key=lambda part: step_order(part[0]))]


def _parted(group: list[Run], start: int) -> dict[str, int]:
    """For each run of `group` but its longest (the first of the longest), the first step from `start` where the two
    part (or the run's end). The group's shared steps end at the least of these, whichever run they are measured
    from, as runs that agree with one run up to two different steps agree with each other up to the earlier; and
    the longest run stays in the group until its end, so its comparisons serve every segment below."""
    longest = max(group, key=lambda r: r.steps)
    return {r.name: first_difference(longest.schedule, r.schedule, start, r.steps) for r in group if r is not longest}


def _dependency_order(segments: dict[str, Segment], runs: dict[str, Run]) -> dict[str, Segment]:
    """The segments by their depth below a root (each waits for at most one: `dependencies`), in the order they were
    made within a depth: each after the one it waits for."""
    depth: dict[str, int] = {}
    for seg in segments.values():  # parents come before their children, and a source run's segments before its heirs
        depth[seg.id] = max((depth[d] + 1 for d in dependencies(seg, runs)), default=0)
    order = {sid: i for i, sid in enumerate(segments)}
    return {sid: segments[sid] for sid in sorted(segments, key=lambda sid: (depth[sid], order[sid]))}


def dependencies(segment: Segment, runs: dict[str, Run]) -> list[str]:
    """Segments that must finish before this one starts."""
    if segment.parent:
        return [segment.parent]
    if segment.after_run:
        return [runs[segment.after_run].segments[-1]]
    return []


def describe(plan: Plan, spec: SweepSpec) -> str:
    """The tree, naive and planned steps, and the GPU-hour estimate, as text."""
    lines = [f"sweep {spec.sweep.name}: {len(plan.runs)} runs, {len(plan.segments)} segments"]
    children: dict[str | None, list[Segment]] = {}
    for seg in plan.segments.values():
        key = seg.parent or (plan.runs[seg.after_run].segments[-1] if seg.after_run else None)
        children.setdefault(key, []).append(seg)

    def walk(parent: str | None, depth: int) -> None:
        for seg in children.get(parent, []):
            ends = f"  -> {', '.join(seg.ends_runs)}" if seg.ends_runs else ""
            lines.append(f"{'  ' * depth}{seg.id}  steps {seg.start}-{seg.end} ({seg.steps}){ends}")
            walk(seg.id, depth + 1)

    walk(None, 1)
    lines += budget_lines(data_budget(plan, spec))  # per run, the tokens it reads against what its source holds
    saved = 1 - plan.planned_steps / plan.naive_steps
    lines.append(f"steps: naive {plan.naive_steps:,}, planned {plan.planned_steps:,} ({saved:.0%} saved)")
    lines.append(f"estimate: {gpu_hours_text(plan.gpu_hours(spec))} GPU-hours planned vs "
                 f"{gpu_hours_text(plan.gpu_hours(spec, planned=False))} naive at {spec.sweep.mfu:.0%} MFU of "
                 f"{spec.sweep.gpu_peak_tflops:g} TFLOP/s")
    res, ft = spec.run.resources, spec.finetune
    counts = res.worker_counts  # an elastic segment: as many as it can place between min and max
    workers = counts[0] if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    lines.append(f"resources: each pretraining segment holds {workers} Train worker(s) x {res.cpus_per_worker:g} "
                 f"CPU, {res.gpus_per_worker:g} GPU (up to {res.max_concurrent} segment(s) at once); each fine-tuning "
                 f"trial holds {ft.cpus_per_trial:g} CPU, {ft.gpus_per_trial:g} GPU")
    if ft.tasks:
        for control in plan.controls.values():
            lines.append(f"control: {control.name}  step 0 (untrained), the start of {len(control.runs)} run(s)")
        checkpoints = plan.checkpoints()
        pairs = sum(len(runs) for runs in checkpoints.values())
        lines.append(f"fine-tuning: {len(checkpoints):,} distinct checkpoints for {pairs:,} run checkpoints (shared "
                     f"ones fine-tuned once), {len(plan.controls)} control(s): {plan.finetune_trials(spec):,} trials "
                     f"(full grid; {plan.finetune_trials(spec, distinct=False):,} without de-duplication), at most "
                     f"{gpu_hours_text(plan.finetune_gpu_hours(spec), 1)} GPU-hours "
                     f"({gpu_hours_text(plan.finetune_gpu_hours(spec, evaluation_only=True), 1)} of them evaluation; "
                     f"{finetune_basis_text(spec)}) beside "
                     f"pretraining's {gpu_hours_text(plan.gpu_hours(spec))}")
    lines += grid_lines(plan, spec) + replicate_lines(plan, spec)
    return "\n".join(lines)
