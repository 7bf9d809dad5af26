"""Production loaders: the paper's twelve fine-tuning datasets from the Hugging Face hub, as `tasks` records.

    train, test = hub.ontonotes()                    # records in the shapes of `raybiphase.finetune.tasks`
    RAYBIPHASE_DATASETS_DIR=/data/hub ...            # read local snapshots instead of the hub

Every load goes through `_hub(dataset_id, config, split)`, which calls `datasets.load_dataset` on a parquet-backed
repository (datasets >= 4 refuses loading scripts). OntoNotes and ReCoRD exist on the hub only as script datasets;
they are read from the hub's own parquet export of them, the `refs/convert/parquet` revision, where a config is a
folder of `<config>/<split>/0000.parquet` files (EXPORTED).

RAYBIPHASE_DATASETS_DIR, when set, names a folder where `<dir>/<org>/<name>` is a snapshot of each repository: the
files the hub serves, in its layout, read by the same `datasets` parquet and json builders, with no network (for
clusters without hub access, and for the tests). A snapshot is made with

    huggingface-cli download --repo-type dataset nyu-mll/glue --local-dir $RAYBIPHASE_DATASETS_DIR/nyu-mll/glue

adding `--revision refs/convert/parquet` for the EXPORTED repositories. Splits: train = the official train split,
test = the official validation split (dev qrels for MS MARCO, the test qrels for NQ and MLDR, which have no
other labelled split). NQ and MLDR are evaluated with the model trained on MS MARCO's train pairs, as the authors do,
so their train split is MS MARCO's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from raybiphase.errors import UserError

DATASETS_DIR_ENV = "RAYBIPHASE_DATASETS_DIR"
PARQUET_EXPORT = "refs/convert/parquet"
GLUE = "nyu-mll/glue"
CONLL2003 = "lhoestq/conll2003"  # the CoNLL-2003 loader's output as parquet, by a `datasets` maintainer
ONTONOTES = "ontonotes/conll2012_ontonotesv5"
UNER = "BramVanroy/universal_ner"  # universalner/universal_ner (a script dataset) as parquet, same features
SUPER_GLUE = "aps/super_glue"
MSMARCO, NQ, MLDR = "mteb/msmarco", "mteb/nq", "Shitao/MLDR"
EXPORTED = frozenset({ONTONOTES, SUPER_GLUE})

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
                        f"huggingface-cli download --repo-type dataset {dataset_id}{revision} --local-dir {path}")
    where = {"data_dir": config} if exported else {"name": config}
    if exported and not root:
        where["revision"] = PARQUET_EXPORT
    try:
        return datasets.load_dataset(path, split=split, **where)
    except (ValueError, OSError, datasets.exceptions.DatasetsError) as err:
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


def _mteb_corpus(dataset_id: str) -> list[dict]:
    data = _hub(dataset_id, "corpus", "corpus")
    return [{"pid": str(pid), "text": f"{title} {text}" if title else text}
            for pid, title, text in zip(data["_id"], data["title"], data["text"])]


def _mteb_set(dataset_id: str, qrels_split: str, passages: list[dict]) -> dict:
    """Queries judged in one qrels split (BEIR/MTEB layout: configs default = qrels, queries, corpus), each with
    its relevant passages (score > 0) as positives, over the whole corpus."""
    positives: dict[str, list[str]] = {}
    for judgement in _hub(dataset_id, "default", qrels_split):
        if judgement["score"] > 0:
            positives.setdefault(str(judgement["query-id"]), []).append(str(judgement["corpus-id"]))
    queries = _hub(dataset_id, "queries", "queries")
    return {"queries": [{"qid": str(qid), "text": text, "positives": positives[str(qid)]}
                        for qid, text in zip(queries["_id"], queries["text"]) if str(qid) in positives],
            "passages": passages}


def msmarco_train() -> dict:
    """MS MARCO passage ranking's train queries over the official 8.8M-passage collection."""
    return _mteb_set(MSMARCO, "train", _mteb_corpus(MSMARCO))


def msmarco() -> tuple[dict, dict]:
    passages = _mteb_corpus(MSMARCO)
    return _mteb_set(MSMARCO, "train", passages), _mteb_set(MSMARCO, "dev", passages)


def nq() -> tuple[dict, dict]:
    return msmarco_train(), _mteb_set(NQ, "test", _mteb_corpus(NQ))


def mldr() -> tuple[dict, dict]:
    """MLDR English test queries (each with its positive document) over the English corpus."""
    corpus = _hub(MLDR, "corpus-en", "corpus")
    passages = [{"pid": str(pid), "text": text} for pid, text in zip(corpus["docid"], corpus["text"])]
    queries = [{"qid": str(r["query_id"]), "text": r["query"], "positives": [str(p["docid"]) for p in
                                                                              r["positive_passages"]]}
               for r in _hub(MLDR, "en", "test")]
    return msmarco_train(), {"queries": queries, "passages": passages}
