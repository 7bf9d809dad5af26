"""The sweep spec: a base run plus what varies across runs and what happens around them.

A spec file holds the run sections (`model`, `data`, `phases`, `optim`, `train`, `resources`: the base run) and
two of its own: `finetune` (downstream evaluation of every final checkpoint) and `sweep` (the grid, extra runs,
storage, estimates, W&B). A `SweepSpec` is made of the three parts: `spec.run` (a RunConfig, whose sections the
file and the dotted names write at the top level: `train.lr`), `spec.finetune` and `spec.sweep`. The planner
expands the grid into RunConfigs, and only those travel to Ray Train workers.

    spec = load(SweepSpec, "sweeps/split_grid.yaml", ["sweep.storage=s3://bucket/results"])
    spec.run, spec.sweep.grid, spec.finetune.tasks
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal, get_args

from raybiphase.config.load import (
    INLINE,
    NOT_WEIGHTS,
    check,
    counted,
    distinct,
    field_type,
    location,
    non_negative,
    positive,
    ratio,
)
from raybiphase.config.run import RUN_SECTIONS, RunConfig
from raybiphase.config.sizes import PEAK_BF16_TFLOPS
from raybiphase.errors import ConfigError

TcLabels = Literal["all_subtokens", "first_subtoken"]
IrCorpus = Literal["judged", "full"]
IrRelevance = Literal["binary", "graded"]
Stages = Literal["all", "by_size"]
_FOLDER = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
"""A sweep name: one plain folder under sweep.storage (no separators, no '..', not hidden)."""


@dataclass(frozen=True, kw_only=True)
class ExportGrid:
    """The fine-tuning of the intermediate checkpoints at some export steps: a part of the full grid
    (finetune.tasks x lrs x seeds), so that the checkpoints a learning curve needs cost a few tasks each. A run's
    final checkpoint and the untrained controls always take the full grid."""

    steps: tuple[int, ...]
    """Export steps (train.export_steps of some run that goes on past them) whose checkpoints take this grid."""
    tasks: tuple[str, ...] = ()
    """Tasks fine-tuned there, each one of finetune.tasks (so every name is a known task); empty: all of them."""
    lrs: tuple[float, ...] = ()
    """Learning rates, each one of finetune.lrs, so the best LR is chosen among the values the final checkpoints
    also try; empty: all of them."""
    seeds: tuple[int, ...] = ()
    """Fine-tuning seeds, each one of finetune.seeds; empty: all of them."""


@dataclass(frozen=True)
class FinetuneGrid:
    """What one checkpoint is fine-tuned on: tasks x learning rates x seeds, each in finetune's order."""

    tasks: tuple[str, ...]
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    tasks: tuple[str, ...] = ()
    """Fine-tuning tasks run on every fine-tuned checkpoint (see raybiphase.finetune.tasks; an intermediate one may
    take fewer: finetune.exports); empty skips fine-tuning."""
    lrs: tuple[float, ...] = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
    """Learning-rate grid (the paper's six values)."""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Fine-tuning seeds (the paper: five)."""
    exports: tuple[ExportGrid, ...] = ()
    """Grids for intermediate checkpoints by export step (steps, and some of tasks, lrs, seeds each); a step no
    entry names, a run's final checkpoint and the controls take the full grid: tasks x lrs x seeds."""
    batch_size: int = 32
    """Examples per step (the paper: 32)."""
    max_steps: int = 1000
    """Step cap; training also stops after one epoch (the paper: 1000)."""
    warmup_ratio: float = 0.1
    """Share of steps with linear warmup, then linear decay."""
    eval_every: int = 100
    """Validation every N steps; ASHA decides at these points."""
    max_examples: int = 0
    """Cap on training examples per task (CPU runs); 0 uses all."""
    max_eval_examples: int = 0
    """Cap on validation and test examples per task (CPU runs: for retrieval, queries, each bringing
    IR_CORPUS_PER_QUERY passages to encode); 0 takes max_examples."""
    asha: bool = True
    """Stop weak LR x seed trials early with ASHA on the validation metric; false runs the full grid."""
    control: bool = True
    """Also fine-tune the untrained step-0 weights the runs start from (one per model, seed and data), recorded with
    pretrain_step 0: the control that shows what pretraining added."""
    complete_lrs: bool = False
    """After ASHA, run every stopped trial to its end (not only the best LR's), so the LR-sensitivity analysis has
    a complete LR x seed grid; without it, that analysis uses the LRs whose seeds all finished."""
    max_concurrent: int | None = None
    """Trials running at once; default: resources.max_concurrent (the cluster's resources bound it either way)."""
    max_len: int = 128
    """Tokens per input (longer inputs are trimmed; QA slides windows over the context). 128 suits CPU runs; the
    paper fine-tunes at nearly the encoders' full context (sweeps/split_grid.yaml: 2,048)."""
    tc_labels: TcLabels = "all_subtokens"
    """Token classification: train every sub-token of a word on its tag and vote per word (the authors' evaluation
    code), or train and predict at a word's first sub-token only (raybiphase.finetune.heads.tc)."""
    ir_corpus: IrCorpus = "judged"
    """What the hub's retrieval sets (msmarco, nq, mldr) rank: the passages their qrels judge, as the authors do,
    or `full`, the whole collection (MS MARCO: 8.8M passages encoded at every validation; the ranking's memory
    stays bounded, its time does not). The offline retrieval tasks always rank their whole corpus, and the BM25
    row always ranks the judged passages."""
    ir_relevance: IrRelevance = "binary"
    """How NDCG@10 counts a retrieval query's relevant passages (those its qrels score 1 or more): `binary`, each
    as 1, as the authors' evaluation code does, or `graded`, each by its score, as trec_eval does. Only MS MARCO's
    test qrels (TREC-DL 2019, scores 0-3) grade, so only msmarco's test scores and its BM25 row can change; MRR@10
    is the same either way."""
    bucket_by_length: bool = False
    """Batch training inputs of about one length (raybiphase.finetune.input_lengths.training_order): each run of
    50 batches of the seeded order sorted by length and cut into batches, the batches then shuffled, so a batch is
    padded little (the dry run prices it at about its inputs' mean length, not the 98th percentile). Changes the
    batches, so trials made either way are not reused; off by default, as the authors' batches are random."""
    compile: bool = False
    """torch.compile each transformer block of the fine-tuned model, as train.compile does in pretraining.
    Measured on an H100 at 210m (tweets, batch 32, 512 tokens, 16 free CPU cores): about 15 s of compilation in a
    trial's first steps, then 1.93x the eager step's examples/s and 1.82x transformers' `Trainer`'s
    (benchmarks/results/h100-2026-11-26.json): worth it from about 600 steps per trial, later with fewer CPUs per
    trial (compilation runs on them). Scores change by floating-point rounding only, so records made either way
    are reused. On a CPU compiling costs more than it saves at test sizes."""
    baselines: tuple[str, ...] = ()
    """Public encoders fine-tuned beside the sweep's arms on its tasks x lrs x seeds, each once: Hub ids (`id` or
    `id@revision`, pinned to the commit they resolve to), folders or bucket URIs of any encoder transformers'
    AutoModel loads. Their trials run from the sweep's start, beside pretraining, in the trial slots segments leave
    free. Their rows have source `hub`, run the model's id, checkpoint its id@commit; the report shows them beside
    our arms and its findings never pair them with ours. Their trials are kept under
    <sweep.storage>/hub-baselines, one folder per fine-tuning settings, model and commit, so another sweep there
    reuses them at that commit and fine-tunes a newer commit afresh."""
    dataset_revisions: tuple[str, ...] = ()
    """Hub datasets read at a named revision, each `org/name@revision` (a commit pins it), over the defaults in
    raybiphase.finetune.hub.DATASET_REVISIONS; a dataset read at a moving revision is warned of. The commit read
    is in every trial's row (`dataset_revisions`); a snapshot (RAYBIPHASE_DATASETS_DIR) at another commit, or a
    revision the hub does not have, is one line before anything runs."""
    trust_remote_code: bool = False
    """Let a fine-tuned model run the code its folder or Hub repository ships (transformers' trust_remote_code):
    needed by encoders transformers does not define itself; off, such a model is refused in one line."""
    cpus_per_trial: float = field(default=1.0, metadata=NOT_WEIGHTS)
    """CPUs a fine-tuning trial holds (its torch threads on CPU, its data loading on GPU)."""
    gpus_per_trial: float = field(default=0.0, metadata=NOT_WEIGHTS)
    """GPUs a trial holds; a fraction (0.25) packs several small trials on one GPU. Above 0 the model and batches
    go to CUDA with bf16 autocast (weights and optimizer stay fp32)."""

    def __post_init__(self) -> None:
        for i, lr in enumerate(self.lrs):
            positive(lr, f"finetune.lrs.{i}")
        check(len(self.lrs) > 0, "finetune.lrs", "at least one learning rate is needed")
        check(len(self.seeds) > 0, "finetune.seeds", "at least one seed is needed")
        for key in ("tasks", "lrs", "seeds"):
            distinct(getattr(self, key), f"finetune.{key}")
        named: list[int] = []
        for i, entry in enumerate(self.exports):
            _check_export_grid(entry, self, f"finetune.exports.{i}", named)
        counted(self.batch_size, "finetune.batch_size", 1 << 20)
        counted(self.max_steps, "finetune.max_steps", 1_000_000)
        check(0.0 <= self.warmup_ratio < 1.0, "finetune.warmup_ratio", f"{self.warmup_ratio} is out of range; allowed: [0, 1)")
        positive(self.eval_every, "finetune.eval_every")
        if self.max_concurrent is not None:
            positive(self.max_concurrent, "finetune.max_concurrent")
        non_negative(self.max_examples, "finetune.max_examples")
        non_negative(self.max_eval_examples, "finetune.max_eval_examples")
        check(self.max_len >= 16, "finetune.max_len", f"{self.max_len} is out of range; allowed: 16 or more")
        check(self.tc_labels in get_args(TcLabels), "finetune.tc_labels",
              f"{self.tc_labels!r} is not allowed; allowed: {', '.join(get_args(TcLabels))}")
        check(self.ir_corpus in get_args(IrCorpus), "finetune.ir_corpus",
              f"{self.ir_corpus!r} is not allowed; allowed: {', '.join(get_args(IrCorpus))}")
        check(self.ir_relevance in get_args(IrRelevance), "finetune.ir_relevance",
              f"{self.ir_relevance!r} is not allowed; allowed: {', '.join(get_args(IrRelevance))}")
        for i, entry in enumerate(self.dataset_revisions):
            check("@" in entry, f"finetune.dataset_revisions.{i}", f"{entry!r} is not `org/name@revision`")
        positive(self.cpus_per_trial, "finetune.cpus_per_trial")
        non_negative(self.gpus_per_trial, "finetune.gpus_per_trial")
        check(self.gpus_per_trial <= 1 or float(self.gpus_per_trial).is_integer(), "finetune.gpus_per_trial",
              f"{self.gpus_per_trial} is out of range; allowed: a fraction of one GPU or a whole number")

    def grid(self, step: int | None = None) -> FinetuneGrid:
        """The grid of the intermediate checkpoint at export step `step`: the finetune.exports entry naming it, else
        the full grid; None (a run's final checkpoint, a control): the full grid."""
        entry = next((e for e in self.exports if step in e.steps), None) if step is not None else None
        if entry is None:
            return FinetuneGrid(self.tasks, self.lrs, self.seeds)
        return FinetuneGrid(_part(self.tasks, entry.tasks), _part(self.lrs, entry.lrs), _part(self.seeds, entry.seeds))


def _part(full: tuple, chosen: tuple) -> tuple:
    """The values of `full` that `chosen` names, in full's order (the rows come out the same however an entry
    orders them); all of them when `chosen` is empty."""
    return tuple(v for v in full if not chosen or v in chosen)


def _check_export_grid(entry: ExportGrid, ft: FinetuneConfig, key: str, named: list[int]) -> None:
    """An entry names steps no other entry names, and only values of the full grid (`named`: the steps of the
    entries before it)."""
    check(len(entry.steps) > 0, f"{key}.steps", "at least one export step is needed")
    for j, step in enumerate(entry.steps):
        positive(step, f"{key}.steps.{j}")
        check(step not in named, f"{key}.steps.{j}", f"step {step} is named by an earlier entry; name each step once")
        named.append(step)
    for name in ("tasks", "lrs", "seeds"):
        distinct(getattr(entry, name), f"{key}.{name}")
        allowed = getattr(ft, name)
        for j, value in enumerate(getattr(entry, name)):
            check(value in allowed, f"{key}.{name}.{j}", f"{value!r} is not one of finetune.{name} "
                  f"({', '.join(map(repr, allowed)) or 'none'}); an export step fine-tunes on a part of the full grid")


UNMEASURED_SD = 2.0
"""The default of sweep.unmeasured_sd: an unmeasured stratum is taken as twice as noisy (SD) as the noisiest
measured one, four times its variance."""


def check_unmeasured_sd(value: float, key: str) -> None:
    """The widening factor of unmeasured strata is a number of at least 1 (ConfigError naming `key`)."""
    check(isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 1,
          key, f"{value!r} is out of range; allowed: an SD factor of at least 1 (1: an unmeasured size or objective "
               "as noisy as the noisiest measured one)")


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    name: str = "run"
    """Sweep name: results go to <storage>/<name>/."""
    storage: str = "results"
    """Local directory or cloud URI (s3://, gs://) for checkpoints and results."""
    storage_outage_s: float = 900.0
    """Seconds a bucket unreachable mid-sweep is waited out (every process retrying, a line a minute) before the
    sweep stops with a line naming it; counted from the outage's start, once for the whole sweep (a worker Ray Train
    restarts does not wait it out again); a rerun resumes."""
    segment_tries: int = 3
    """Fits of one pretraining segment in a row that may fail without committing a newer checkpoint: each failed
    fit (its Ray Train restarts spent, a worker lost while its group starts, its controller lost, a stall) is said in
    a line and the segment is fitted again from its newest committed checkpoint; a fit that committed one before
    failing starts the count again. Once spent, the sweep ends with a line naming the segment; a rerun resumes."""
    stall_s: float = 1800.0
    """Seconds a segment's fit may show no sign of life (no optimizer step, report or change of its Ray Train
    controller's state) before it is stopped and counted as a failed try: longer than a node's start on an
    autoscaling cluster and a large model's compile, so only a hung fit reaches it."""
    max_runs: int = 10_000
    """The most runs a sweep may plan (the grid's cross product plus sweep.runs), counted before any is built: a
    grid too large for any cluster is said in one line, not planned until memory runs out."""
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """Dotted key -> list of values; the sweep runs the cross product."""
    runs: tuple[dict[str, Any], ...] = ()
    """Further runs, each a mapping of dotted overrides on the base; model.init_from '@NAME' continues run NAME."""
    mfu: float = 0.4
    """Model FLOPs utilisation assumed by the dry run's GPU-hour estimate of pretraining."""
    finetune_mfu: float = 0.24
    """The share of the GPU's peak a fine-tuning step's FLOPs run at in the dry run's estimate, the inputs counted
    at their measured width (raybiphase.finetune.input_lengths), beside the step's launch-bound floor
    (sweep.finetune_launch_s_per_layer). 0.24 is a measured trial's whole rate with every input counted at max_len:
    210m on an H100, tweets at max_len 512, batch 32, bf16, eager, 634 examples/s
    (benchmarks/results/h100-2026-11-26.json); a step of wide inputs is compute-bound and runs nearer
    pretraining's sweep.mfu, so the FLOPs' share of the estimate is an upper bound. It assumes eager trials;
    finetune.compile runs them about 1.9x faster."""
    finetune_launch_s_per_layer: float = 0.0037
    """Seconds a fine-tuning training step takes per transformer layer however few tokens it holds (an evaluation
    batch, a forward pass: a third), the dry run's floor beside the FLOPs: an eager step is launch-bound (a
    profile of the measured trial: 7.9 s of host time against 3.9 s on the device). 0.0037: the measured 210m
    trial's 50.5 ms step (12 layers) less its FLOPs at the tweets' padded width of 64 tokens at
    sweep.finetune_mfu. The floor counts a whole GPU even where trials share one (finetune.gpus_per_trial)."""
    gpu_peak_tflops: float = PEAK_BF16_TFLOPS["H100"]
    """Peak dense bf16 TFLOP/s of one GPU for the estimate (H100 SXM: 989)."""
    gpu_hour_usd: float = 4.0
    """Price of one on-demand GPU-hour in the dry run's bill: an example to replace with your provider's price,
    not a quote."""
    spot_gpu_hour_usd: float = 1.6
    """Price of one spot (preemptible) GPU-hour in the bill: an example, not a quote."""
    preemptions_per_node_hour: float = 0.01
    """How often a spot node is taken back, per node-hour (0.01: about once in four days of a node): the bill's
    expected rework and the checkpoint-interval advice. An example: providers publish interruption rates by
    instance type and region."""
    gpus_per_node: int = 8
    """GPUs of one worker node: a segment spans ceil(its GPUs / this) nodes, any of which a preemption can take."""
    restart_minutes: float = 5.0
    """What a lost node costs a segment besides the steps since its checkpoint: a replacement node, Ray Train's
    restart, the restore and the compile (an example: measure yours)."""
    checkpoint_gb_per_s: float = 2.0
    """The rate a checkpoint reaches the bucket at, summed over a segment's workers: training waits for it. A
    checkpoint holds 12 bytes per parameter (fp32 weights and AdamW's two moments)."""
    lease_timeout_s: float = 300.0
    """Seconds a sweep's lease (one driver per sweep folder) may go unrenewed before another driver takes it over:
    longer than storage's default retry budget for a bucket outage (120 s), so a live driver keeps it; short
    enough that a rerun after a crash waits at most this long."""
    stages: Stages = "all"
    """all: every run may start at once. by_size: the model sizes run smallest first, a size's runs starting once
    every smaller size's runs and fine-tuning are done, and only the arms that serve a finding still undecided at
    sweep.decide_probability by the smaller sizes' prediction (docs/statistics.md, "Staging by size")."""
    decide_probability: float = 0.9
    """With stages: by_size, a finding is decided at a size when the chance its effect there lies in the paper's
    direction is at least this or at most 1 minus this; an arm all of whose findings are decided is skipped."""
    unmeasured_sd: float = UNMEASURED_SD
    """How much noisier (an SD factor, at least 1) than the noisiest measured (model size, objective) stratum the
    findings take a stratum no replicated arm measures: its covariance x this squared, at the measured one's degrees
    of freedom (docs/statistics.md). The dry run's power lines use it, and the sweep records it in its sweep.json, so
    its report, and `raybiphase report` on its folder later, judge the findings with the prior the power lines were
    priced with (`raybiphase report --unmeasured-sd` overrides it)."""
    wandb_project: str | None = None
    """W&B project; runs go there: online when the driver has a key (WANDB_API_KEY or `wandb login`), else offline
    (WANDB_MODE overrides both). None disables W&B."""


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A base run, its fine-tuning and the sweep around it; the base run's settings keep a run config's dotted
    names (`train.lr`), the others are `finetune.*` and `sweep.*`."""

    run: RunConfig = field(default_factory=RunConfig, metadata=INLINE)
    """The base run: the sections of a run config, written at the top level of the file."""
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    """Downstream evaluation."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """Grid, extra runs, storage, estimates and W&B."""

    def __post_init__(self) -> None:
        data = self.run.data
        if not data.decontam_tasks:  # the spec decides what is held out: the tasks it fine-tunes on
            data = dataclasses.replace(data, decontam_tasks=self.finetune.tasks)
            object.__setattr__(self, "run", dataclasses.replace(self.run, data=data))
        location(self.sweep.storage, "sweep.storage")
        check(_FOLDER.fullmatch(self.sweep.name) is not None and ".." not in self.sweep.name, "sweep.name",
              f"{self.sweep.name!r} is not a plain folder name; allowed: letters, digits, '.', '_' and '-', not "
              "starting with '.' (results go to <sweep.storage>/<sweep.name>/)")
        positive(self.sweep.storage_outage_s, "sweep.storage_outage_s")
        positive(self.sweep.segment_tries, "sweep.segment_tries")
        positive(self.sweep.max_runs, "sweep.max_runs")
        positive(self.sweep.stall_s, "sweep.stall_s")
        ratio(self.sweep.mfu, "sweep.mfu")
        ratio(self.sweep.finetune_mfu, "sweep.finetune_mfu")
        non_negative(self.sweep.finetune_launch_s_per_layer, "sweep.finetune_launch_s_per_layer")
        positive(self.sweep.gpu_peak_tflops, "sweep.gpu_peak_tflops")
        for key in ("gpu_hour_usd", "spot_gpu_hour_usd", "preemptions_per_node_hour", "restart_minutes"):
            non_negative(getattr(self.sweep, key), f"sweep.{key}")
        positive(self.sweep.gpus_per_node, "sweep.gpus_per_node")
        positive(self.sweep.checkpoint_gb_per_s, "sweep.checkpoint_gb_per_s")
        positive(self.sweep.lease_timeout_s, "sweep.lease_timeout_s")
        check_unmeasured_sd(self.sweep.unmeasured_sd, "sweep.unmeasured_sd")
        check(0.5 < self.sweep.decide_probability < 1, "sweep.decide_probability",
              f"{self.sweep.decide_probability} is out of range; allowed: a probability in (0.5, 1)")
        for key, values in self.sweep.grid.items():
            _run_key(key, "sweep.grid")
            check(isinstance(values, list) and len(values) > 0, f"sweep.grid.{key}", "expected a non-empty list of values")
            distinct(values, f"sweep.grid.{key}")
            check(len(values) == 1 or shapes_weights(key), f"sweep.grid.{key}", "never changes a run's weights, so "
                  f"every value would make the same run; set it once (--set {key}=...)")
        for i, run in enumerate(self.sweep.runs):
            for key in run:
                _run_key(key, f"sweep.runs.{i}")
        runs = math.prod(len(values) for values in self.sweep.grid.values()) + len(self.sweep.runs)
        check(runs <= self.sweep.max_runs, "sweep.grid", f"{runs:,} runs (the grid's cross product plus sweep.runs) "
              f"is more than sweep.max_runs ({self.sweep.max_runs:,}); split the sweep, or raise sweep.max_runs")


def shapes_weights(key: str) -> bool:
    """Whether the dotted run setting `key` can change a run's weights: it names a RunConfig field and no field
    on its path is marked NOT_WEIGHTS. Names that are not run settings (a result column, a typo) are False."""
    cls: Any = RunConfig
    for part in key.split("."):
        found = {f.name: f for f in fields(cls)}.get(part) if is_dataclass(cls) else None
        if found is None or found.metadata.get("weights") is False:
            return False
        cls = field_type(cls, part)
        if not is_dataclass(cls):
            return True
    return True


def _run_key(key: str, where: str) -> None:
    """Only run settings vary across runs: fine-tuning and the sweep's own settings are the same for all."""
    check(key.split(".")[0] in RUN_SECTIONS, f"{where}.{key}",
          f"only run settings ({', '.join(RUN_SECTIONS)}) can vary across runs")
    try:
        field_type(RunConfig, key)  # raises for unknown keys, naming the closest one
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
