"""One fine-tuning trial: a pretrained checkpoint x a task x a learning rate x a seed, per the paper's protocol.

    spec = TrialSpec.plain("runs/tiny-clm-10-mlm40-40/hf", "tweets", lr=1e-4, seed=0)
    result = run_trial(spec, cfg=FinetuneConfig(max_examples=512))
    result.val_score, result.test_score, result.test_per_example

Protocol (the authors', docs/protocol.md): AdamW (betas 0.9/0.95, eps 1e-5, weight decay 0.1 on matrices; norms and biases
undecayed), batch `cfg.batch_size`, at most `cfg.max_steps` steps or one epoch of the (capped) training set,
linear warmup over `cfg.warmup_ratio` of the steps then linear decay to zero, gradient norm clipped at 1.0 (the
transformers Trainer default; the paper does not say). Validation every `cfg.eval_every` steps and at the end,
each passed to `report({"step", "val_score", "also_val"})`; the test split is scored once, at the end, and the
last report also carries the whole result under "final" (so a caller can store it before a scheduler that stops
the trial at that report ends the process). Deterministic given the seed: the head's
initialisation (torch.manual_seed) and the data order (a numpy generator) both come from it.

Tasks trained on another's pairs ride along (the spec's riders): the trained model is scored on each of their
validation splits at every evaluation and on their test splits at the end, so MS MARCO's retrieval model is
trained once and validated and tested on MS MARCO, NQ and MLDR (`tasks.training_groups`). Each gets a result of
its own with its own validation score (each task chooses its LR on its own validation, as the authors do); the
reports carry them under "also_val", and the trial's own "val_score" (what ASHA compares) stays the trained
task's.

The checkpoint is an HF folder (`<checkpoint>/hf`, or the checkpoint folder holding it), a bucket URI of one, or a
Hub model id (`id@commit`: raybiphase.finetune.encoders): EuroBERT read with its stock transformers classes, any
other encoder through `AutoModel` under the same heads (finetune.trust_remote_code lets the model's own code run);
its tokenizer must be there and fit the model's vocabulary, else `UserError`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from raybiphase import storage, transfer
from raybiphase.config import FinetuneConfig
from raybiphase.data.assets import cache_dir
from raybiphase.errors import UserError
from raybiphase.finetune.baselines import floor_scores
from raybiphase.finetune.encoders import encoder_blocks, encoder_config, hub_snapshot, is_hub_id
from raybiphase.finetune.heads import head_for
from raybiphase.finetune.input_lengths import training_order
from raybiphase.finetune.spec import TrialSpec
from raybiphase.finetune.tasks import get_task, load_splits
from raybiphase.optim import adamw, set_lr
from raybiphase.phases import wsd_lr

ADAMW = {"betas": (0.9, 0.95), "eps": 1e-5, "weight_decay": 0.1}
GRAD_CLIP = 1.0
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "mask_token")
TOKENIZER_FILES = ("tokenizer", "special_tokens", "vocab", "merges", "spiece", "sentencepiece")


# ------------------------------------------------------------------------------------------------ checkpoint


def find_hf_dir(location: storage.Location) -> str:
    """The HF folder of a checkpoint, local or in a bucket: `location` itself or `location/hf` (a Hub model id: its
    snapshot); UserError when there is none."""
    if is_hub_id(str(location)):
        return str(hub_snapshot(str(location)))
    if not storage.exists(location):
        raise UserError(f"finetune: checkpoint {location} does not exist")
    for candidate in (str(location), storage.hf_dir(location)):
        if storage.is_file(storage.join(candidate, "config.json")):
            return candidate
    raise UserError(f"finetune: {location} is not an HF model folder (no config.json, nor hf/config.json)")


def resolve_hf_dir(location: storage.Location) -> Path:
    """The checkpoint's HF folder on this node: in place when local, else copied once into this node's cache."""
    return transfer.local_copy(find_hf_dir(location), cache_dir()).resolve()


def load_checked_tokenizer(hf_dir: Path, *, trust_remote_code: bool = False):
    """The checkpoint's tokenizer, checked against its model config (vocabulary size and special token ids)."""
    from transformers import AutoTokenizer

    if not any((hf_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        _model_config(hf_dir, trust_remote_code)  # a model transformers cannot load says so first
        raise UserError(f"finetune: {hf_dir} has no tokenizer (save it beside the model with save_pretrained)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"finetune: transformers cannot load the tokenizer in {hf_dir}: {reason}") from err
    check_fits(hf_dir, tokenizer, trust_remote_code=trust_remote_code)
    return tokenizer


def _model_config(hf_dir: Path, trust_remote_code: bool = False) -> dict:
    """The model's config.json, once transformers' AutoModel is known to load it (else UserError)."""
    encoder_config(hf_dir, trust_remote_code=trust_remote_code)
    return json.loads((hf_dir / "config.json").read_text())


def check_fits(hf_dir: Path, tokenizer, *, trust_remote_code: bool = False) -> None:
    """UserError unless `tokenizer` belongs to the model in `hf_dir` (vocabulary size, special token ids)."""
    config = _model_config(hf_dir, trust_remote_code)
    if len(tokenizer) > config["vocab_size"]:
        raise UserError(f"finetune: the tokenizer in {hf_dir} has {len(tokenizer)} tokens but the model's "
                        f"vocabulary is {config['vocab_size']}: they do not belong together")
    for name in SPECIAL_TOKENS:
        ours, theirs = getattr(tokenizer, f"{name}_id", None), config.get(f"{name}_id")
        if ours is not None and theirs is not None and ours != theirs:
            raise UserError(f"finetune: {name} is id {ours} in the tokenizer of {hf_dir} but {theirs} in the "
                            f"model config: they do not belong together")


def tokenizer_digest(hf_dir: Path) -> str:
    """A digest of the tokenizer's files: checkpoints of one sweep share their tokenizer, and so its tokenized
    splits."""
    digest = hashlib.sha256()
    for path in sorted(hf_dir.iterdir()):
        if path.is_file() and path.name.startswith(TOKENIZER_FILES):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ trial


_TOKENIZED: collections.OrderedDict = collections.OrderedDict()  # (tokenizer digest, task, ...) -> tokenized splits
TOKENIZED_KEPT = 8  # tasks x tokenizers one process keeps tokenized


def _tokenized(hf_path: Path, task: str, caps: tuple[int, int], max_len: int, source: str,
               tc_labels: str = "all_subtokens", ir_corpus: str = "judged", ir_relevance: str = "binary",
               revisions: tuple[str, ...] = (), *, trust_remote_code: bool = False) -> tuple:
    """Head, training units, prepared validation and test: shared by the trials one process runs (a benchmark, a
    test, Tune's trials once pretraining is over: raybiphase.finetune.tuner), which differ in checkpoint, LR and
    seed but share the sweep's tokenizer; each checkpoint is still checked against that tokenizer."""
    key = (tokenizer_digest(hf_path), task, caps, max_len, source, tc_labels, ir_corpus, ir_relevance, revisions,
           trust_remote_code)
    if key in _TOKENIZED:
        _TOKENIZED.move_to_end(key)
        check_fits(hf_path, _TOKENIZED[key][0].tokenizer, trust_remote_code=trust_remote_code)
        return _TOKENIZED[key]
    spec = get_task(task)
    head = head_for(spec, load_checked_tokenizer(hf_path, trust_remote_code=trust_remote_code), max_len,
                    tc_labels=tc_labels, trust_remote_code=trust_remote_code)
    splits = load_splits(spec, max_examples=caps[0], max_eval_examples=caps[1], source=source, ir_corpus=ir_corpus,
                         ir_relevance=ir_relevance, revisions=revisions)
    units = head.train_units(splits.train)
    if not units:
        raise UserError(f"finetune: task {task!r} has no training examples (finetune.max_examples?)")
    _TOKENIZED[key] = head, units, head.prepare_eval(splits.val), head.prepare_eval(splits.test)
    while len(_TOKENIZED) > TOKENIZED_KEPT:
        _TOKENIZED.popitem(last=False)
    return _TOKENIZED[key]


def _tokenized_eval(hf_path: Path, task: str, head, caps: tuple[int, int], max_len: int, source: str,
                    tc_labels: str, ir_corpus: str, ir_relevance: str, revisions: tuple[str, ...] = ()) -> tuple:
    """The prepared validation and test splits of a task scored, not trained, in a trial (`run_trial`'s
    also_test), prepared by the trained task's head: no training units are made for it."""
    key = (tokenizer_digest(hf_path), task, caps, max_len, source, tc_labels, ir_corpus, ir_relevance, revisions,
           "evaluation only")
    if key not in _TOKENIZED:
        splits = load_splits(get_task(task), max_examples=caps[0], max_eval_examples=caps[1], source=source,
                             ir_corpus=ir_corpus, ir_relevance=ir_relevance, revisions=revisions)
        _TOKENIZED[key] = head.prepare_eval(splits.val), head.prepare_eval(splits.test)
    _TOKENIZED.move_to_end(key)
    while len(_TOKENIZED) > TOKENIZED_KEPT:
        _TOKENIZED.popitem(last=False)
    return _TOKENIZED[key]


def _check_also_test(task: str, also_test: tuple[str, ...]) -> None:
    """UserError unless every task of `also_test` is scored by `task`'s head (same family and labels)."""
    spec = get_task(task)
    for name in also_test:
        other = get_task(name)
        if (other.family, other.label_names) != (spec.family, spec.label_names):
            raise UserError(f"finetune: task {name!r} ({other.family}) cannot be tested on a model trained for "
                            f"{task!r} ({spec.family}): their heads differ")


def trial_device(cfg: FinetuneConfig) -> torch.device:
    """CUDA when the trial holds a GPU (Ray shows it only the GPU it was given), else the CPU."""
    if cfg.gpus_per_trial > 0:
        if not torch.cuda.is_available():
            raise UserError(f"finetune.gpus_per_trial: {cfg.gpus_per_trial} asked for, but this node's torch sees "
                            f"no CUDA device (torch {torch.__version__})")
        return torch.device("cuda")
    return torch.device("cpu")


def model_on(head, hf_path: Path, device: torch.device, *, compile: bool) -> torch.nn.Module:
    """The head's model on the trial's device; with `compile` (finetune.compile) each transformer block is
    torch.compiled in place (`encoders.encoder_blocks`)."""
    model = head.load_model(str(hf_path)).to(device)
    if compile:
        for block in encoder_blocks(model):
            block.compile()
    return model


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """What one fine-tuning trial gives back (and its rows record): scores in [0, 1], per-example test scores for
    the bootstrap, and for a training group's trial the same for every task tested on its model (`also_tested`)."""

    val_score: float
    test_score: float
    metric: str
    steps: int
    seconds: float
    test_per_example: list
    secondary_metric: str | None
    test_secondary: float
    diverged: bool = False
    also_tested: dict[str, TrialResult] = dataclasses.field(default_factory=dict)
    dataset_revisions: str = ""
    """The hub datasets the task read, `org/name@commit` comma-separated (`revisions_read`); "" for offline tasks."""


def trial_result(task: str, *, val_score: float, test_score: float, per_example: list, secondary: float, steps: int,
                 seconds: float, diverged: bool = False) -> TrialResult:
    spec = get_task(task)
    return TrialResult(val_score=val_score, test_score=test_score, metric=spec.metric, steps=steps, seconds=seconds,
                       test_per_example=per_example, secondary_metric=spec.secondary_metric,
                       test_secondary=secondary, diverged=diverged)


def _diverged(task: str, also_test: tuple[str, ...], cfg: FinetuneConfig, source: str, *, steps: int,
              seconds: float) -> TrialResult:
    """A diverged trial's result: each task's floor (baselines.floor_scores: what a model that learned nothing
    scores, per-example entries included), validation and test, each on the task's own splits."""
    caps = {"max_examples": cfg.max_examples, "max_eval_examples": cfg.max_eval_examples, "source": source,
            "ir_corpus": cfg.ir_corpus, "ir_relevance": cfg.ir_relevance, "revisions": cfg.dataset_revisions}

    def floored(name: str) -> TrialResult:
        floor = floor_scores(name, **caps)
        return trial_result(name, val_score=floor["val_score"], test_score=floor["test_score"],
                            per_example=floor["test_per_example"], secondary=floor["test_secondary"], steps=steps,
                            seconds=seconds, diverged=True)

    result = dataclasses.replace(floored(task), also_tested={name: floored(name) for name in also_test})
    return _stamped(result, task, cfg, source)


def revisions_read(task: str, cfg: FinetuneConfig, source: str) -> str:
    """The hub datasets a trial of `task` reads under `cfg`, `org/name@commit` comma-separated ("" offline)."""
    splits = load_splits(get_task(task), max_examples=cfg.max_examples, max_eval_examples=cfg.max_eval_examples,
                         source=source, ir_corpus=cfg.ir_corpus, ir_relevance=cfg.ir_relevance,
                         revisions=cfg.dataset_revisions)
    return ",".join(f"{dataset}@{commit}" for dataset, commit in sorted(splits.revisions.items()))


def _stamped(result: TrialResult, task: str, cfg: FinetuneConfig, source: str) -> TrialResult:
    """`result` and its riders' results, each with the revisions of the datasets its task read."""
    also = {name: dataclasses.replace(r, dataset_revisions=revisions_read(name, cfg, source))
            for name, r in result.also_tested.items()}
    return dataclasses.replace(result, dataset_revisions=revisions_read(task, cfg, source), also_tested=also)


def run_trial(spec: TrialSpec, *, cfg: FinetuneConfig, report: Callable[[dict], None] | None = None,
              source: str = "auto") -> TrialResult:
    """Fine-tune `spec.checkpoint` on `spec.task` at `spec.lr` with `spec.seed`; returns its TrialResult: scores,
    steps, seconds, per-example test scores, and `diverged` (the loss turned NaN or inf: the trial stops at its
    next evaluation and scores the metric's floor, `baselines.floor_scores`).

    `spec.riders`: tasks (of the same family and labels) scored on the trained model too, each on its own
    validation split at every evaluation (reported under "also_val": {task: score}) and on its test split at the
    end, under `also_tested`: {task: a result like this one, with its own validation score and this trial's
    steps} (nq and mldr on msmarco's trial; a diverged trial gives each its own floor)."""
    began, task, lr, seed = time.perf_counter(), spec.task.name, spec.lr, spec.seed
    also_test = tuple(t.name for t in spec.also_test)
    _check_also_test(task, also_test)
    hf_path = resolve_hf_dir(spec.checkpoint)
    caps, ir = (cfg.max_examples, cfg.max_eval_examples), (cfg.ir_corpus, cfg.ir_relevance, cfg.dataset_revisions)
    head, units, val, test = _tokenized(hf_path, task, caps, cfg.max_len, source, cfg.tc_labels, *ir,
                                        trust_remote_code=cfg.trust_remote_code)
    riders = {name: _tokenized_eval(hf_path, name, head, caps, cfg.max_len, source, cfg.tc_labels, *ir)
              for name in also_test}
    device = trial_device(cfg)
    head.device = device
    autocast = (functools.partial(torch.autocast, "cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else contextlib.nullcontext)
    torch.manual_seed(seed)
    model = model_on(head, hf_path, device, compile=cfg.compile)
    optimizer = adamw(model, lr=lr, **ADAMW, fused=device.type == "cuda")
    total = min(cfg.max_steps, math.ceil(len(units) / cfg.batch_size))  # at most one epoch
    warmup = round(cfg.warmup_ratio * total)
    order = training_order([head.unit_length(u) for u in units], cfg.batch_size, seed, bucket=cfg.bucket_by_length)
    val_score, also_val = float("nan"), {}
    finite = torch.ones((), dtype=torch.bool, device=device)  # read at evaluations only: no sync per step

    for step in range(total):
        # --- schedule
        set_lr(optimizer, wsd_lr(step, peak=lr, total=total, warmup=warmup, decay=total - warmup))
        # --- step
        model.train()
        batch = [units[i] for i in order[step * cfg.batch_size:(step + 1) * cfg.batch_size]]
        with autocast():
            loss = head.loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        finite &= torch.isfinite(loss.detach())
        # --- eval and report
        done = step + 1
        if done % cfg.eval_every == 0 or done == total:
            if not bool(finite):  # diverged: scored at the metric's floor, so the seed still counts against its LR
                result = _diverged(task, also_test, cfg, source, steps=done, seconds=time.perf_counter() - began)
                also_val = {name: r.val_score for name, r in result.also_tested.items()}
                if report:
                    report({"step": done, "val_score": result.val_score, "also_val": also_val, "final": result})
                return result
            model.eval()
            with autocast():
                val_score = head.evaluate(model, val).score
                also_val = {name: head.evaluate(model, splits[0]).score for name, splits in riders.items()}
            if done == total:
                break  # the last report comes after the test score
            if report:
                report({"step": done, "val_score": val_score, "also_val": also_val})

    # --- test, then the last report
    with autocast():
        result = _tested(model, head, test, task, {name: splits[1] for name, splits in riders.items()},
                         val_scores={task: val_score, **also_val}, steps=total, began=began, read=(cfg, source))
    if report:
        report({"step": total, "val_score": val_score, "also_val": also_val, "final": result})
    return result


def _tested(model, head, test, task: str, rider_tests: dict, *, val_scores: dict[str, float], steps: int,
            began: float, read: tuple[FinetuneConfig, str]) -> TrialResult:
    """The trained model's result: its test scores on `task`, and on each rider's prepared test split, each task
    with its own validation score and the revisions of the datasets it read (`read`: the trial's settings and
    source)."""
    tested = {task: head.evaluate(model, test), **{name: head.evaluate(model, t) for name, t in rider_tests.items()}}
    seconds = time.perf_counter() - began
    results = {name: trial_result(name, val_score=val_scores[name], test_score=evaluation.score,
                                  per_example=evaluation.per_example, secondary=evaluation.secondary, steps=steps,
                                  seconds=seconds)
               for name, evaluation in tested.items()}
    result = results.pop(task)
    return _stamped(dataclasses.replace(result, also_tested=results), task, *read)
