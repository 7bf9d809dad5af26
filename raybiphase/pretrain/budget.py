"""The data budget (no Ray, never prepares data): per run, the training blocks it reads against what its source
holds, so no run trains past the end of its data without a word. A sweep checks every run of its plan
(`data_budget`), `raybiphase pretrain` its one run (`check_run_budget`), both through `run_budget` and
`check_budget`, before anything starts and again once the data is prepared.

Run r reads the global samples [data_start, data_end), data_end = data_start + steps x rows per step
(RunConfig.data_end; raybiphase.data.stream); a continued run starts where its source stopped
(CheckpointMeta.data_end), so its blocks are ones neither source model saw, as the paper's unique tokens are. Sample g
lies in epoch g // N (N = training blocks): a run whose data_end passes N trains on repeated blocks, which
`data.max_epochs` must allow.

N comes from the prepared dataset's manifest when there is one (where `prepare` puts it), else from a stated size
for a known hub source (`STATED_TOKENS`, over `data.seq_len`), else it is unknown: the line says so and the check lets
the run pass, since nothing can be told before the data is prepared (the driver checks again once it is).

    budgets = data_budget(plan, spec)
    print("\\n".join(budget_lines(budgets)))   # the dry run: tokens needed against what the source holds, per run
    check_budget(budgets)                      # ConfigError naming the run that would repeat data
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from raybiphase import storage
from raybiphase.checkpoint_meta import source_end
from raybiphase.config import ConfigError, DataConfig, RunConfig, SweepSpec
from raybiphase.data import decontam
from raybiphase.data.prepare import dataset_location
from raybiphase.data.stream import MANIFEST, epochs_read
from raybiphase.naming import run_name

STATED_TOKENS = {
    ("HuggingFaceFW/fineweb-edu", "sample-10BT"): 10 * 10**9,
    ("HuggingFaceFW/fineweb-edu", "sample-100BT"): 100 * 10**9,
    ("HuggingFaceFW/fineweb-edu", "sample-350BT"): 350 * 10**9,
    ("HuggingFaceFW/fineweb-edu", "default"): 1_300 * 10**9,
    ("HuggingFaceFW/fineweb-edu", None): 1_300 * 10**9,
}
"""Tokens of known hub sources as their dataset cards state them (FineWeb-Edu counts GPT-2 tokens; the Llama-3
tokenizer makes somewhat fewer of the same text, so a stated size is an estimate until the data is prepared)."""


@dataclass(frozen=True)
class RunBudget:
    """One run's reach into its source: the samples [data_start, data_end) against the source's training blocks."""

    run: str
    source: str
    """The text source, as data.source [data.hf_config] names it."""
    location: str
    """Where the prepared dataset is (or will be)."""
    seq_len: int
    data_start: int
    """The global sample of the run's first step (a continued run's source's data end)."""
    data_end: int
    """The next unread sample after the run's last step."""
    max_epochs: float
    blocks: int | None
    """Training blocks of the source: the manifest's when prepared, else a stated size over seq_len; None: unknown."""
    prepared: bool
    held_out: dict | None = None
    """What decontamination holds out (DataConfig.decontamination); None: nothing."""
    dropped: dict | None = None
    """The prepared manifest's decontamination account (raybiphase.data.decontam.manifest_record); None until
    prepared."""

    @property
    def tokens(self) -> int:
        """Tokens from sample 0 to the run's last one: what the source must hold for the run to see each once."""
        return self.data_end * self.seq_len

    @property
    def epochs(self) -> float | None:
        """Passes over the training blocks at the run's end (None when the source's size is unknown)."""
        return epochs_read(self.data_end, self.blocks) if self.blocks else None

    @property
    def over(self) -> bool:
        """The run reads more passes than data.max_epochs allows."""
        return self.epochs is not None and self.epochs > self.max_epochs


def _source_name(data: DataConfig) -> str:
    return f"{data.source} {data.hf_config}" if data.hf_config else data.source


def _prepared(location: str) -> dict | None:
    """The dataset's manifest, or None when it is not prepared (or its bucket is out of reach)."""
    try:
        return storage.read_json(storage.join(location, MANIFEST)) or None
    except (OSError, ValueError):
        return None


def _stated_blocks(data: DataConfig) -> int | None:
    tokens = STATED_TOKENS.get((data.source, data.hf_config))
    if tokens is None or data.max_documents:  # a source cut short holds an unknown share of its stated size
        return None
    return tokens // data.seq_len


def source_size(data: DataConfig, location: str, train_blocks: Mapping[str, int] | None = None
                ) -> tuple[int | None, bool, dict | None]:
    """(training blocks, prepared, decontamination account) of the source prepared at `location`: the blocks are
    `train_blocks[location]` when given, else its manifest's, else (not prepared) a stated size, else None; the
    account is the manifest's, None until prepared."""
    meta = _prepared(location)
    prepared = (train_blocks or {}).get(location) or (int(meta["train_rows"]) if meta else None)
    dropped = meta.get("decontamination") if meta else None
    return ((prepared, True) if prepared is not None else (_stated_blocks(data), False)) + (dropped,)


def run_budget(name: str, config: RunConfig, *, steps: int, data_start: int, location: str,
               size: tuple[int | None, bool, dict | None]) -> RunBudget:
    """The budget of run `name`: `steps` of `config` from sample `data_start`, against `size` (`source_size`)."""
    data = config.data
    data_end = config.data_end(data_start, steps)
    return RunBudget(run=name, source=_source_name(data), location=location, seq_len=data.seq_len,
                     data_start=data_start, data_end=data_end, max_epochs=data.max_epochs, blocks=size[0],
                     prepared=size[1], held_out=data.decontamination(), dropped=size[2])


def check_run_budget(run: RunConfig, storage_root: str | None) -> None:
    """`check_budget` for one run on its own (`raybiphase pretrain`), as the sweep checks each of its runs: from
    sample 0, or where the checkpoint in model.init_from stopped, for phases.steps steps."""
    location = dataset_location(run.data, storage_root)
    data_start = source_end(run.model.init_from) if run.model.init_from else 0
    check_budget([run_budget(run_name(run), run, steps=run.phases.steps, data_start=data_start, location=location,
                             size=source_size(run.data, location))])


def data_budget(plan, spec: SweepSpec, train_blocks: Mapping[str, int] | None = None) -> list[RunBudget]:
    """Every run of `plan` (a raybiphase.planning.plan.Plan) with its budget, in the plan's order. A source's size is
    `train_blocks[location]` when given, else its prepared manifest's, else a stated size; nothing is prepared."""
    starts: dict[str, int] = {}
    budgets: dict[str, RunBudget] = {}
    sizes: dict[str, tuple[int | None, bool, dict | None]] = {}
    locations: dict[DataConfig, str] = {}  # a sweep's runs mostly share one data config: hashed once

    def start_of(name: str) -> int:
        if name not in starts:
            run = plan.runs[name]
            init_from = run.config.model.init_from  # outside the sweep: a checkpoint's data end, else sample 0
            starts[name] = budget_of(run.source).data_end if run.source else source_end(init_from) if init_from else 0
        return starts[name]

    def budget_of(name: str) -> RunBudget:
        if name not in budgets:
            run = plan.runs[name]
            if run.config.data not in locations:
                locations[run.config.data] = dataset_location(run.config.data, spec.sweep.storage)
            location = locations[run.config.data]
            if location not in sizes:
                sizes[location] = source_size(run.config.data, location, train_blocks)
            budgets[name] = run_budget(name, run.config, steps=run.steps, data_start=start_of(name),
                                       location=location, size=sizes[location])
        return budgets[name]

    return [budget_of(name) for name in plan.runs]


def _amount(n: float) -> str:
    """1234567 -> '1.2M'; 151e9 -> '151.0B'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:,.0f}"


def _holds(budget: RunBudget) -> str:
    if budget.blocks is None:
        return "size unknown until prepared"
    tokens = f"holds {_amount(budget.blocks * budget.seq_len)} tokens ({budget.blocks:,} blocks of {budget.seq_len})"
    return tokens + (f", prepared at {budget.location}" if budget.prepared else ", its stated size (not prepared)")


def _decontamination(budget: RunBudget) -> str:
    """The source's decontamination: what the manifest says it dropped, or that it is not prepared yet."""
    if budget.dropped:
        return decontam.summary_line(budget.dropped)
    return f"decontamination: {decontam.summary_settings(budget.held_out)}; counts: not prepared yet"


def budget_lines(budgets: list[RunBudget]) -> list[str]:
    """The dry run's data section: per source what it holds, per run the tokens it needs and the passes they make."""
    lines = []
    for location in dict.fromkeys(b.location for b in budgets):
        group = [b for b in budgets if b.location == location]
        lines.append(f"data: {group[0].source}: {_holds(group[0])}")
        if group[0].held_out:
            lines.append(f"  {_decontamination(group[0])}")
        width = max(len(b.run) for b in group)
        for b in group:
            reads = f"samples {_amount(b.data_start)}-{_amount(b.data_end)}"
            epochs = "" if b.epochs is None else f", {b.epochs:.2f} epochs"
            flag = f"  REPEATS DATA (data.max_epochs: {b.max_epochs:g})" if b.over else ""
            lines.append(f"  {b.run:<{width}}  {reads}: needs {_amount(b.tokens)} tokens{epochs}{flag}")
    return lines


def check_budget(budgets: list[RunBudget]) -> None:
    """ConfigError, one line, naming the run that reads the most past what data.max_epochs allows; a run whose
    source's size is unknown passes (nothing can be told before the data is prepared)."""
    over = sorted((b for b in budgets if b.over), key=lambda b: b.epochs / b.max_epochs, reverse=True)
    if not over:
        return
    worst = over[0]
    others = f" (and {len(over) - 1} other run(s))" if len(over) > 1 else ""
    raise ConfigError(
        f"data.max_epochs: run {worst.run}{others} needs {_amount(worst.tokens)} tokens ({worst.data_end:,} blocks of "
        f"{worst.seq_len}) but {worst.source} holds {_amount(worst.blocks * worst.seq_len)} ({worst.blocks:,} blocks"
        f"{'' if worst.prepared else ', its stated size'}): "
        f"{worst.epochs:.2f} passes over the data where {worst.max_epochs:g} is allowed; use a larger source or "
        f"fewer steps, or set data.max_epochs: {math.ceil(worst.epochs * 100 - 1e-9) / 100:g} to train on repeated "
        "blocks")
