"""Import evaluation-result trees (the authors' published raw results) into finetune.parquet with source="paper".

    python -m raybiphase importer TREE RESULTS_DIR [--sweep paper]

The tree is the authors' evaluation results as they publish them: `<model>/<family>/<dataset>/lr<LR>_sd<SEED>/
results.json`, e.g. `610m-mlm40-42k/SC/sst2/lr1e-04_sd0/results.json`, and for retrieval, where one model trained on
MS MARCO pairs is evaluated on every dataset, `<model>/IR/<dataset>/msmarco_pairs_lr<LR>_sd<SEED>/results.json` (the
prefix names the training data and lands in the `train_data` column). TREE may be that folder or any folder above it
(their repository's root, with the tree under `results/`). The rows then go through the same aggregation and
report as ours (raybiphase.results.aggregate, raybiphase.results.report), and summary.parquet is rewritten.

results.json, as the authors write it (scores are fractions in [0, 1]; a score above 1 is read as a percentage):

    {"validation": {"score": 0.918, "scores_i": [1, 0, ...]},
     "test": {"score": 0.9186, "scores_i": [1, 0, ...]}}     per-example scores: what a bootstrap resamples

and leniently: an optional "metric" (default by family: SC accuracy, TC/QA f1, IR ndcg@10), sections also named
val, valid, eval, dev, validation_results / test_results, optional "steps" and "seconds".

A section may also be a bare number, or a dict whose score sits under `score`, `value`, the metric's name
(`accuracy`, `eval_accuracy`, `test_f1`, `ndcg@10`...) or is its only number; per-example scores sit under
`scores_i`, `per_example`, `per_example_scores`, `scores` or `examples` (numbers, or for entity F1 the
[true positives, predicted, gold] counts of each sentence, stored flat as rows store them). Flat files work too: `val_score` (or
`validation_score`, `eval_score`), `test_score`, `test_per_example`.

The model name (the paper's scheme: raybiphase.naming) fills the columns the report groups by: `phases.clm_share`,
`phases.steps`, `phases.clm_steps`, `phases.mask_ratio`, `model.size`, `model.init_from` (continued pretraining,
`610m-clm-dec42k-mlm40-64k`) and `pretrain_step` (an intermediate checkpoint, `610m-mlm40-42k-1000`: run
`610m-mlm40-42k` at step 1,000).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from raybiphase import storage, transfer
from raybiphase.errors import UserError
from raybiphase.naming import parse_phase_tag
from raybiphase.results.rows import FINETUNE_KEY, per_example_flat
from raybiphase.results.store import append_rows, write_summary
from raybiphase.storage import FINETUNE_FILE, join

DEFAULT_METRIC = {"SC": "accuracy", "TC": "f1", "QA": "f1", "IR": "ndcg@10"}
VALIDATION_NAMES = ("validation", "val", "valid", "eval", "dev", "validation_results", "eval_results")
TEST_NAMES = ("test", "test_results")
PER_EXAMPLE_NAMES = ("scores_i", "per_example", "per_example_scores", "scores", "examples")
TRIAL_DIR = re.compile(r"(?:(?P<train>\w+?)_)?lr(?P<lr>[0-9.eE+-]+?)_s(?:ee)?d(?P<seed>\d+)")
_STEPS = re.compile(r"(?P<dec>dec)?(?P<num>\d+(?:\.\d+)?)(?P<k>k?)")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _steps(token: str) -> tuple[int, bool] | None:
    match = _STEPS.fullmatch(token)
    if not match:
        return None
    return round(float(match["num"]) * (1000 if match["k"] else 1)), bool(match["dec"])


def parse_model_name(name: str) -> dict[str, Any]:
    """The paper's model name -> run, pretrain_step and config columns; {"run": name} alone when unparseable.

    `610m-clm-10k-mlm40-42k` -> phases.clm_share 10/42, phases.steps 42000, phases.mask_ratio 0.4, pretrain_step 42000;
    `610m-clm-dec42k-mlm40-64k` -> model.init_from "610m-clm-42k", phases.steps 22000 (its own steps), phases.clm_share 0.
    """
    size, _, rest = name.partition("-")
    tokens = rest.split("-")
    checkpoint = None
    if len(tokens) % 2 == 1 and tokens[-1].isdigit():  # trailing intermediate-checkpoint step
        checkpoint = int(tokens.pop())
    if not re.fullmatch(r"\d+(\.\d+)?[mb]", size.lower()) or not tokens or len(tokens) % 2:
        return {"run": name}
    phases, source = [], None
    for obj_token, steps_token in zip(tokens[::2], tokens[1::2]):
        objective, steps = parse_phase_tag(obj_token), _steps(steps_token)
        if not objective or not steps:
            return {"run": name}
        if steps[1]:  # "clm-dec42k": continued from a decayed checkpoint of that objective
            if phases or source:
                return {"run": name}
            source = (obj_token, steps[0])
            continue
        phases.append((objective[0], math.nan if objective[1] is None else objective[1], steps[0]))
    if not phases:
        return {"run": name}
    start = source[1] if source else 0
    total = phases[-1][2]
    own_steps = total - start
    clm_steps, previous = 0, start
    for objective, _, end in phases:
        clm_steps += end - previous if objective == "clm" else 0
        previous = end
    mlm_ratios = [ratio for objective, ratio, _ in phases if objective == "mlm"]
    run = "-".join([size, *tokens])
    return {
        "run": run,
        "pretrain_step": checkpoint if checkpoint is not None else total,
        "phases.clm_share": clm_steps / own_steps if own_steps > 0 else math.nan,
        "model.size": size,
        "model.init_from": f"{size}-{source[0]}-{source[1] // 1000}k" if source else None,
        "phases.steps": own_steps,
        "phases.clm_steps": clm_steps,
        "phases.mask_ratio": mlm_ratios[-1] if mlm_ratios else math.nan,
    }


def _fraction(value: Any) -> float:
    value = float(value)
    return value / 100 if value > 1.0 else value


def _find(data: dict, names: tuple[str, ...]) -> Any:
    wanted = {_norm(n) for n in names}
    for key, value in data.items():
        if _norm(key) in wanted:
            return value
    return None


def _section(value: Any, metric: str, where: str) -> tuple[float, list[float] | None]:
    """A validation or test section -> (score, per-example scores or None)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _fraction(value), None
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a number or an object, found {type(value).__name__}")
    per_example = _find(value, PER_EXAMPLE_NAMES)
    metric_key = _norm(metric)
    names = ("score", "value", metric, *(p + metric_key for p in ("eval", "test", "validation", "val")))
    score = _find(value, names)
    if score is None:
        numbers = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) != 1:
            raise UserError(f"{where}: cannot tell which entry is the {metric} score (keys: {sorted(value)})")
        score = numbers[0]
    return _fraction(score), None if per_example is None else _per_example(per_example, where)


def _per_example(values: Any, where: str) -> list:
    """Per-example scores as fractions (percentages divided by 100); entity-F1 count triples stay counts."""
    if not isinstance(values, list):
        raise UserError(f"{where}: per-example scores must be a list, found {type(values).__name__}")
    if values and all(isinstance(v, list) for v in values):
        if any(len(v) != 3 for v in values):
            raise UserError(f"{where}: per-example entries that are lists must be [true positives, predicted, gold]")
        return per_example_flat(values)
    numbers = [float(x) for x in values]
    return [x / 100 for x in numbers] if numbers and max(numbers) > 1.0 else numbers


def read_trial(path: Path, family: str) -> dict[str, Any]:
    """One results.json -> metric, val_score, test_score, test_per_example, steps, seconds."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not readable JSON ({err})") from None
    metric = str(data.get("metric") or DEFAULT_METRIC.get(family, "score"))
    val_raw = _find(data, VALIDATION_NAMES)
    val_raw = val_raw if val_raw is not None else _find(data, ("val_score", "validation_score", "eval_score"))
    test_raw = _find(data, TEST_NAMES)
    test_raw = test_raw if test_raw is not None else _find(data, ("test_score",))
    if val_raw is None or test_raw is None:
        raise UserError(f"{path}: needs a validation and a test score (keys: {sorted(data)})")
    val_score, _ = _section(val_raw, metric, f"{path} validation")
    test_score, per_example = _section(test_raw, metric, f"{path} test")
    raw = _find(test_raw, PER_EXAMPLE_NAMES) if isinstance(test_raw, dict) else None
    if "metric" not in data and raw and isinstance(raw[0], list):  # sentences' entity counts: micro F1
        metric = "entity_f1"
    flat = _find(data, ("test_per_example",))
    if per_example is None and flat:
        per_example = _per_example(flat, f"{path} test_per_example")
    return {"metric": metric, "val_score": val_score, "test_score": test_score,
            "test_per_example": per_example or [], "steps": data.get("steps"),
            "seconds": float(data.get("seconds", math.nan))}


def collect(tree: str | Path, sweep: str = "paper") -> list[dict[str, Any]]:
    """Every `<model>/<family>/<dataset>/[<train>_]lr<LR>_sd<SEED>/results.json` under `tree` as a finetune row."""
    tree = Path(tree)
    if not tree.is_dir():
        raise UserError(f"{tree}: not a folder of evaluation results")
    rows = []
    for path in sorted(tree.rglob("results.json")):
        linked = next((part for part in (path, *path.parents) if part != tree and part.is_symlink()), None)
        if linked is not None and tree in linked.parents:
            raise UserError(f"{linked}: refused: a symbolic link in a tree of results (it could point anywhere); "
                            "copy the files it points to instead")
        if len(path.relative_to(tree).parts) < 5:
            raise UserError(f"{path}: expected <model>/<family>/<dataset>/lr<LR>_sd<SEED>/results.json under {tree}")
        trial_dir, dataset_dir, family_dir, model_dir = path.parents[:4]
        match = TRIAL_DIR.fullmatch(trial_dir.name)
        if not match:
            raise UserError(f"{trial_dir}: expected a folder named lr<LR>_sd<SEED> (e.g. lr1e-04_sd0), "
                            "or <train data>_lr<LR>_sd<SEED> for retrieval (msmarco_pairs_lr1e-04_sd0)")
        family = family_dir.name.upper()
        rows.append({
            "run": model_dir.name, "sweep": sweep, "checkpoint": model_dir.name, "pretrain_step": -1,
            "task": dataset_dir.name.lower(), "family": family, "dataset": dataset_dir.name.lower(),
            "train_data": match["train"] or dataset_dir.name.lower(),
            "lr": float(match["lr"]), "seed": int(match["seed"]), "stopped_early": False, "source": "paper",
            **read_trial(path, family), **parse_model_name(model_dir.name),
        })
    if not rows:
        raise UserError(f"{tree}: no <model>/<family>/<dataset>/lr<LR>_sd<SEED>/results.json files found")
    return rows


def import_tree(tree: str | Path, results_dir: str | Path, sweep: str = "paper") -> tuple[int, int]:
    """Append the tree's trials to RESULTS_DIR/finetune.parquet and rewrite the summary; (added, already there).
    Either may be a folder or a bucket URI (a tree in a bucket is read from a temporary local copy)."""
    if storage.is_uri(tree):
        if not storage.exists(tree):
            raise UserError(f"{tree}: not a folder of evaluation results")
        with tempfile.TemporaryDirectory() as local:
            transfer.download(tree, Path(local))  # a key reaching outside the copy is refused
            rows = collect(local, sweep)
    else:
        rows = collect(tree, sweep)
    storage.check_writable(results_dir, "results_dir")  # a file in its place, a bucket out of reach: before a row
    skipped = append_rows(join(results_dir, FINETUNE_FILE), rows, key=FINETUNE_KEY)
    write_summary(results_dir)
    return len(rows) - skipped, skipped
