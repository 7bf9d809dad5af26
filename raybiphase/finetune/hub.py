"""Production loaders: the paper's twelve fine-tuning datasets from the Hugging Face hub, as `tasks` records.

    train, test = hub.ontonotes()                    # records in the shapes of `raybiphase.finetune.tasks`
    RAYBIPHASE_DATASETS_DIR=/data/hub ...            # read local snapshots instead of the hub

Every load goes through `_hub(dataset_id, config, split)`, which calls `datasets.load_dataset` on a parquet-backed
repository (datasets >= 4 refuses loading scripts). OntoNotes exists on the hub only as a script dataset; it is
read from the hub's own parquet export of it, the `refs/convert/parquet` revision, where a config is a folder of
`<config>/<split>/0000.parquet` files (EXPORTED). ReCoRD is read from `aps/super_glue`'s `main`, where each config is
parquet files its card names.

RAYBIPHASE_DATASETS_DIR, when set, names a folder where `<dir>/<org>/<name>` is a snapshot of each repository: the
files the hub serves, in its layout, read by the same `datasets` parquet and json builders, with no network (for
clusters without hub access, and for the tests). A snapshot is made with

    hf download --repo-type dataset nyu-mll/glue --local-dir $RAYBIPHASE_DATASETS_DIR/nyu-mll/glue

adding `--revision refs/convert/parquet` for OntoNotes (EXPORTED). Splits: train = the official train split,
test = the official validation split, except retrieval, which follows the authors' evaluation code (EncodEval's
`encodeval/datasets.py`): MS MARCO validates on its dev qrels and tests on its `test` qrels (TREC-DL 2019), both
ranking one corpus, every passage either qrels split judges; NQ's test qrels' queries are halved at random into
validation and test (`halves`, seeded: NQ_SPLIT_SEED), both ranking the passages those qrels judge; MLDR English
validates on dev and tests on test, both ranking the positive documents of dev and test together. A judged passage
is in the corpus whatever its score; with `corpus="full"` (finetune.ir_corpus) each ranks the whole collection. A
query counts when its qrels hold a relevant passage (score >= 1). Its "grades" (passage -> score) are kept where
the qrels grade (a score above 1: TREC-DL 2019's); whether NDCG counts them is finetune.ir_relevance's choice
(`tasks.load_splits`), binary by default as the authors count. Corpus texts are the authors': NQ's "title. text",
MS MARCO's and MLDR's text alone. NQ and MLDR are evaluated with the model trained on MS MARCO's train pairs, as
the authors do, so their train split is MS MARCO's.

Revisions: each dataset is read at the revision finetune.dataset_revisions names (`org/name@revision`), else at
its default in DATASET_REVISIONS (`reading_at`). A snapshot's commit is the one `hf download --local-dir` recorded
beside its files (`snapshot_commit`); a named revision it is not at is one line saying how to download it. The
commit read is kept with the splits (`tasks.TaskSplits.revisions`) and lands in every trial's row; a read at a
moving revision (no commit named, or a snapshot that records none) is an `UnpinnedDatasetWarning` naming it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator
from typing import get_args

from raybiphase.config.sweep import IrCorpus
from raybiphase.data.revisions import DATASETS_DIR_ENV, UnpinnedDatasetWarning, checked_commit  # noqa: F401
from raybiphase.errors import UserError

PARQUET_EXPORT = "refs/convert/parquet"
GLUE = "nyu-mll/glue"
CONLL2003 = "lhoestq/conll2003"  # the CoNLL-2003 loader's output as parquet, by a `datasets` maintainer
ONTONOTES = "ontonotes/conll2012_ontonotesv5"
UNER = "BramVanroy/universal_ner"  # universalner/universal_ner (a script dataset) as parquet, same features
SUPER_GLUE = "aps/super_glue"
MSMARCO, NQ, MLDR = "mteb/msmarco", "mteb/nq", "Shitao/MLDR"
EXPORTED = frozenset({ONTONOTES})
IR_CORPORA: tuple[str, ...] = get_args(IrCorpus)
"""What a retrieval split ranks: the passages its qrels name (the authors' protocol) or the whole collection."""
NQ_SPLIT_SEED = 42
"""Seeds NQ's validation/test halves of its test queries (the authors' draw is unseeded; ours is repeatable)."""

SQUAD, SQUAD_V2 = "rajpurkar/squad", "rajpurkar/squad_v2"
DATASET_REVISIONS: dict[str, str | None] = {
    # Not pinned: no checked public source names their commit (OntoNotes' would be a commit of its parquet export,
    # PARQUET_EXPORT, whose history the hub's converter may rewrite).
    ONTONOTES: None, UNER: None,
    # The commit projects read SuperGLUE's configs at (BoolQ's `boolq/<split>-00000-of-00001.parquet` through
    # `hf_hub_download`; BoolQ, CB, MultiRC and WiC through `load_dataset(..., revision=...)`): `main` once its loading
    # script gave way to parquet files its card names per config, which is how `load_dataset("aps/super_glue",
    # "record")` reads ReCoRD with no script.
    SUPER_GLUE: "3de24cf8022e94f4ee4b9d55a6f539891524d646",
    # The commit a project downloads CoNLL-2003's three parquet files at, by their SHA-256 (and checks them against
    # the original loader's archive: the same sentences and entities in each split, 14,041 / 3,250 / 3,453).
    CONLL2003: "19edcb426bfd625c275c17b9a99b2239243f4377",
    # The commits `datasets` downloads recorded for these repositories: GLUE's in a download checksum key
    # (`hf://datasets/nyu-mll/glue@<commit>/mrpc/train-00000-of-00001.parquet`, quoted in ZenML's Hugging Face
    # datasets materializer), SQuAD's as the cache folder `squad/plain_text/0.0.0/<commit>` of NVIDIA's Llama 3
    # LoRA fine-tuning benchmark recipe, SQuAD 2.0's with its parquet file's path and SHA-256 in projects that
    # download it through `hf_hub_download` at that revision.
    GLUE: "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c",
    SQUAD: "7b6d24c440a36b6815f21b70d25016731768db1f",
    SQUAD_V2: "3ffb306f725f7d2ce8394bc1873b24868140c412",
    # The commits MTEB reads these at, through the configs read here (embeddings-benchmark/mteb's task metadata:
    # mteb/tasks/retrieval/eng/msmarco_retrieval.py and nq_retrieval.py; for MLDR the commit MTEB reads with no
    # loading script, in mteb/tasks/reranking/multilingual/multi_long_doc_reranking.py).
    MSMARCO: "c5a29a104738b98a9e76336939199e264163d4a0",
    NQ: "b774495ed302d8c44a3a7ea25c90dbce03968f31",
    MLDR: "b38336456b0e2a0dc1f6b8b3ce3a0e1f3c436d16",
}
"""The revision each hub dataset is read at unless finetune.dataset_revisions names another: a commit pins it;
None reads the moving head (`main`, or PARQUET_EXPORT for the EXPORTED ones) with an `UnpinnedDatasetWarning`
naming the dataset, until its commit is named in finetune.dataset_revisions (`hf api` reads it off the hub)."""


_PINS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("pins", default={})
_READ: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("read", default=None)


def parse_revisions(revisions: Iterable[str]) -> dict[str, str]:
    """{dataset id: revision} of finetune.dataset_revisions' `org/name@revision` entries; UserError for an entry
    that names no dataset a task reads."""
    pins = {}
    for entry in revisions:
        dataset_id, _, revision = str(entry).partition("@")
        if dataset_id not in DATASET_REVISIONS or not revision:
            raise UserError(f"finetune.dataset_revisions: {entry!r} is not `dataset@revision` for a hub dataset a "
                            f"task reads ({', '.join(DATASET_REVISIONS)})")
        pins[dataset_id] = revision
    return pins


@contextlib.contextmanager
def reading_at(revisions: Iterable[str] = ()) -> Iterator[dict[str, str]]:
    """Hub datasets read within are read at `revisions` (finetune.dataset_revisions) over DATASET_REVISIONS; yields
    {dataset id: the commit read, or the moving revision when unpinned}, filled as they are read."""
    pins = {k: v for k, v in DATASET_REVISIONS.items() if v} | parse_revisions(revisions)
    read: dict[str, str] = {}
    tokens = _PINS.set(pins), _READ.set(read)
    try:
        yield read
    finally:
        _PINS.reset(tokens[0])
        _READ.reset(tokens[1])


def _revision(dataset_id: str, path: str, root: str | None) -> str | None:
    """The revision to read `dataset_id` at (None: the moving head), checked against its snapshot under `root`
    (`revisions.checked_commit`); what is read is recorded (`reading_at`), an unpinned read warned of."""
    pinned = _PINS.get().get(dataset_id)
    commit = checked_commit(dataset_id, path if root else None, pinned, key="finetune.dataset_revisions")
    read = _READ.get()
    if read is not None:
        read[dataset_id] = commit or (PARQUET_EXPORT if dataset_id in EXPORTED else "main")
    return pinned


CONLL_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
UNER_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
ONTONOTES_TYPES = ("PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "DATE", "TIME", "PERCENT", "MONEY",
                   "QUANTITY", "ORDINAL", "CARDINAL", "EVENT", "WORK_OF_ART", "LAW", "LANGUAGE")
ONTONOTES_TAGS = ("O",) + tuple(f"{bio}-{kind}" for kind in ONTONOTES_TYPES for bio in ("B", "I"))


def _hub(dataset_id: str, config: str | None, split: str):
    """One split of one config of a hub dataset, from the hub or from its snapshot under RAYBIPHASE_DATASETS_DIR;
    a missing snapshot, config or split is one UserError line naming the dataset."""
    import datasets

    exported = dataset_id in EXPORTED
    root = os.environ.get(DATASETS_DIR_ENV)
    path = os.path.join(root, dataset_id) if root else dataset_id
    if root and not os.path.isdir(path):
        revision = f" --revision {PARQUET_EXPORT}" if exported else ""
        raise UserError(f"finetune: no snapshot of {dataset_id} at {path} ({DATASETS_DIR_ENV}); make it with "
                        f"hf download --repo-type dataset {dataset_id}{revision} --local-dir {path}")
    where = {"data_dir": config} if exported else {"name": config}
    revision = _revision(dataset_id, path, root)
    if not root:
        where["revision"] = revision or (PARQUET_EXPORT if exported else None)
    try:
        return datasets.load_dataset(path, split=split, **where)
    except Exception as err:  # the hub's errors have no common base: a missing config, split or revision
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"finetune: cannot load {dataset_id} (config {config or 'default'}, split {split}) "
                        f"from {path}: {reason}") from err


def _names(feature, expected: tuple[str, ...], dataset_id: str) -> list[str]:
    """A ClassLabel's names, checked against the task's labels so a renamed class fails loudly, not silently."""
    unknown = [name for name in feature.names if name not in expected]
    if unknown:
        raise UserError(f"finetune: {dataset_id} has labels {unknown} that the task does not know")
    return feature.names


# ------------------------------------------------------------------------------------------------ SC


def glue(config: str, text: str, pair: str | None, labels: tuple[str, ...], test_split: str = "validation"):
    """A GLUE config as SC records; the label is re-indexed through its class name."""
    def rows(split: str) -> list[dict]:
        data = _hub(GLUE, config, split)
        names = _names(data.features["label"], labels, GLUE)
        return [{"text": r[text], "text_pair": r[pair] if pair else None, "label": labels.index(names[r["label"]])}
                for r in data]

    def load() -> tuple[list, list]:
        return rows("train"), rows(test_split)
    return load


# ------------------------------------------------------------------------------------------------ TC


def _tagged(sentences: Iterable[dict], names: list[str], words: str, tags: str) -> list[dict]:
    return [{"words": list(s[words]), "tags": [names[t] for t in s[tags]]} for s in sentences]


def _flat_tagged(dataset_id: str, config: str | None, labels: tuple[str, ...]):
    """A sentence-per-row NER set ({tokens, ner_tags} with ClassLabel tags) as TC records."""
    def rows(split: str) -> list[dict]:
        data = _hub(dataset_id, config, split)
        return _tagged(data, _names(data.features["ner_tags"].feature, labels, dataset_id), "tokens", "ner_tags")

    def load() -> tuple[list, list]:
        return rows("train"), rows("validation")
    return load


conll2003 = _flat_tagged(CONLL2003, None, CONLL_TAGS)
uner = _flat_tagged(UNER, "en_ewt", UNER_TAGS)


def ontonotes() -> tuple[list, list]:
    """OntoNotes 5 as released for CoNLL-2012 (english_v12): a row is a document; each sentence is one record."""
    def rows(split: str) -> list[dict]:
        data = _hub(ONTONOTES, "english_v12", split)
        sentence = data.features["sentences"].feature
        names = _names(sentence["named_entities"].feature, ONTONOTES_TAGS, ONTONOTES)
        return _tagged((s for doc in data for s in doc["sentences"]), names, "words", "named_entities")
    return rows("train"), rows("validation")


# ------------------------------------------------------------------------------------------------ QA


def _squad_rows(dataset_id: str, split: str) -> list[dict]:
    return [{"id": r["id"], "title": r["title"], "question": r["question"], "context": r["context"],
             "answers": {"text": list(r["answers"]["text"]), "answer_start": list(r["answers"]["answer_start"])}}
            for r in _hub(dataset_id, None, split)]


def squad(dataset_id: str):
    def load() -> tuple[list, list]:
        return _squad_rows(dataset_id, "train"), _squad_rows(dataset_id, "validation")
    return load


def _record_rows(split: str) -> list[dict]:
    """ReCoRD kept extractive: the cloze query (with its @placeholder) is the question, and each gold entity is
    answered by its first mention in the passage (the hub gives answer strings, not their offsets)."""
    rows = []
    for r in _hub(SUPER_GLUE, "record", split):
        answers = [a for a in r["answers"] if a in r["passage"]]
        rows.append({"id": f"{r['idx']['passage']}-{r['idx']['query']}", "question": r["query"],
                     "context": r["passage"],
                     "answers": {"text": answers, "answer_start": [r["passage"].index(a) for a in answers]}})
    return rows


def record() -> tuple[list, list]:
    return _record_rows("train"), _record_rows("validation")


# ------------------------------------------------------------------------------------------------ IR


def _corpus(rows: Iterable[tuple[str, str]], keep: set[str] | None) -> list[dict]:
    """{pid, text} records of (pid, text) pairs, those in `keep` only (all when None)."""
    return [{"pid": pid, "text": text} for pid, text in rows if keep is None or pid in keep]


def _mteb_corpus(dataset_id: str, keep: set[str] | None, *, titled: bool = False) -> list[dict]:
    """A BEIR/MTEB corpus, the passages in `keep` only (all when None); a passage's text is "title. text" when
    `titled` and it has a title (NQ, as the authors write it), else its text alone (MS MARCO's titles are empty)."""
    data = _hub(dataset_id, "corpus", "corpus")
    return _corpus(((str(pid), f"{title}. {text}" if titled and title else text)
                    for pid, title, text in zip(data["_id"], data["title"], data["text"])), keep)


def _qrels(dataset_id: str, split: str) -> dict[str, dict[str, int]]:
    """query id -> {judged passage id: score} of one qrels split (BEIR/MTEB layout: config default)."""
    judged: dict[str, dict[str, int]] = {}
    for row in _hub(dataset_id, "default", split):
        judged.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(row["score"])
    return judged


def _judged(qrels: dict[str, dict[str, int]]) -> set[str]:
    """Every passage a qrels split names, relevant or not: the corpus of the authors' protocol."""
    return {pid for scores in qrels.values() for pid in scores}


def _mteb_queries(dataset_id: str, qrels: dict[str, dict[str, int]]) -> list[dict]:
    """The judged queries with a relevant passage (score >= 1), in the queries table's order; "grades" (passage ->
    score) only where some score is above 1 (graded qrels: TREC-DL 2019's)."""
    queries = _hub(dataset_id, "queries", "queries")
    out = []
    for qid, text in zip(queries["_id"], queries["text"]):
        grades = {pid: score for pid, score in qrels.get(str(qid), {}).items() if score >= 1}
        if grades:
            out.append({"qid": str(qid), "text": text, "positives": list(grades),
                        **({"grades": grades} if max(grades.values()) > 1 else {})})
    return out


def _keep(corpus: str, judged: set[str]) -> set[str] | None:
    check_corpus(corpus)
    return judged if corpus == "judged" else None


def check_corpus(corpus: str) -> None:
    if corpus not in IR_CORPORA:
        raise UserError(f"finetune.ir_corpus: {corpus!r} is not allowed; allowed: {', '.join(IR_CORPORA)}")


def msmarco_train() -> dict:
    """MS MARCO passage ranking's train queries over the passages their qrels judge (training reads only each
    query's positive)."""
    qrels = _qrels(MSMARCO, "train")
    return {"queries": _mteb_queries(MSMARCO, qrels), "passages": _mteb_corpus(MSMARCO, _judged(qrels))}


def msmarco(corpus: IrCorpus = "judged") -> tuple[dict, dict, dict]:
    """(train, validation, test): validation = the dev qrels' queries, test = the `test` qrels' (TREC-DL 2019),
    both over one corpus, the passages judged by either qrels split (the authors' corpus: a passage only TREC-DL
    judges is a candidate for every dev query, and the reverse), or over the whole collection (`corpus="full"`)."""
    qrels = [_qrels(MSMARCO, split) for split in ("dev", "test")]
    passages = _mteb_corpus(MSMARCO, _keep(corpus, set().union(*map(_judged, qrels))))
    return msmarco_train(), *({"queries": _mteb_queries(MSMARCO, judged), "passages": passages} for judged in qrels)


def halves(queries: list[dict], seed: int = NQ_SPLIT_SEED) -> tuple[list[dict], list[dict]]:
    """(validation, test): the queries in a seeded random order (numpy default_rng(seed) over the queries sorted
    by id), the first half (rounded down) validation, the rest test; each keeps the queries' own order."""
    import numpy as np

    ids = sorted(q["qid"] for q in queries)
    first = set(ids[i] for i in np.random.default_rng(seed).permutation(len(ids))[:len(ids) // 2])
    return [q for q in queries if q["qid"] in first], [q for q in queries if q["qid"] not in first]


def nq(corpus: IrCorpus = "judged") -> tuple[dict, dict, dict]:
    """(MS MARCO's train, validation, test): NQ's test qrels' queries halved at random (`halves`, seeded with
    NQ_SPLIT_SEED), both over the passages those qrels judge, or over the whole corpus (`corpus="full"`)."""
    qrels = _qrels(NQ, "test")
    passages = _mteb_corpus(NQ, _keep(corpus, _judged(qrels)), titled=True)
    validation, test = halves(_mteb_queries(NQ, qrels))
    return msmarco_train(), {"queries": validation, "passages": passages}, {"queries": test, "passages": passages}


def mldr(corpus: IrCorpus = "judged") -> tuple[dict, dict, dict]:
    """(MS MARCO's train, validation, test): MLDR English's dev and test queries, each with its positive documents,
    both over the documents positive in either split, or over the whole English corpus (`corpus="full"`)."""
    splits = [[{"qid": str(r["query_id"]), "text": r["query"], "positives": [str(p["docid"]) for p in
                                                                           r["positive_passages"]]}
               for r in _hub(MLDR, "en", split)] for split in ("dev", "test")]
    positives = {pid for queries in splits for q in queries for pid in q["positives"]}
    data = _hub(MLDR, "corpus-en", "corpus")
    passages = _corpus(zip(map(str, data["docid"]), data["text"]), _keep(corpus, positives))
    return msmarco_train(), *({"queries": queries, "passages": passages} for queries in splits)
