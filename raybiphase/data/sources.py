"""Plain-record loaders for every text source: the cached real files, plus Hugging Face / local loaders.

Every function over the cached assets (see ``raybiphase.data.assets``) is offline and deterministic,
and returns plain dicts. Derived tasks are built as documented on each function:

* Wikipedia split: an article is in the *eval* part when the first 8 hex digits of
  ``sha256("raybiphase-wiki-split:" + title)`` modulo 100 are below 30 (about 30%), else in the
  *pretrain* part. Evaluation tasks over Wikipedia (topics, retrieval) use only the eval part.
* SQuAD splits: "dev" is the official dev file (the tasks' test split); SQuAD's train file is cut by *article*
  into "validation" (the tasks' validation split), an article whose first 8 hex digits of
  ``sha256("raybiphase-squad-validation:" + title)`` modulo 100 are below 5 (22 of 442 articles, about 5% of the
  questions), and "train", the rest. Every paragraph, question, sentence and passage of an article lands in its
  article's split: a model validated on one paragraph of an article never trained on another (the official dev
  file is cut from the train file by article too).
* ``pretraining_texts`` yields the SQuAD *train* paragraphs and the wiki *pretrain* leads, held out by article:
  a document of an article that any offline task validates or tests on (a SQuAD validation or dev article, a wiki
  eval lead's article; titles compared with underscores as spaces) is left out, as is any document that shares a
  sentence (``split_sentences``, whitespace collapsed) with an evaluation text, as a few do where Wikipedia repeats a
  sentence across articles: no model pretrains on an article, a sentence or a passage it is validated or tested on.
* QNLI is built from SQuAD as GLUE built it: each question is paired with every sentence of its
  paragraph; the label is "entailment" when the sentence's character span contains the span of
  the question's first answer. Sentences come from ``split_sentences`` (rule below).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs

from raybiphase import storage
from raybiphase.data.assets import asset_path
from raybiphase.data.revisions import DATASETS_DIR_ENV
from raybiphase.errors import UserError


class SourceError(UserError):
    """A text source could not be read, described in one line."""


SQUAD_SPLITS = ("train", "validation", "dev")
SQUAD_VALIDATION_PERCENT = 5
OFFLINE_CORPUS_VERSION = 3
"""The version of what `pretraining_texts` yields, bumped whenever that changes (3: evaluated articles held out
whole); the offline shards' cache key includes it."""
WIKI_EVAL_PERCENT = 30
WIKI_UNCATEGORIZED = "Uncategorized"
WIKI_TOPICS = sorted([
    "Arts", "Biology and health sciences", "Everyday life", "Geography", "History", "Mathematics",
    "People", "Philosophy and religion", "Physical sciences", "Society and social sciences", "Technology",
])
TWEET_LABELS = ("negative", "neutral", "positive")


# ---------------------------------------------------------------- SQuAD v1.1
@functools.lru_cache(maxsize=2)
def _squad_articles(file: str) -> tuple:
    with open(asset_path("squad", f"{file}-v1.1.json"), encoding="utf-8") as f:
        return tuple(json.load(f)["data"])


def squad_part(title: str) -> str:
    """'validation' or 'train' for an article of SQuAD's train file, by a stable sha256 hash of its title (see the
    module docstring): all its paragraphs land in one part."""
    bucket = int(hashlib.sha256(f"raybiphase-squad-validation:{title}".encode()).hexdigest()[:8], 16) % 100
    return "validation" if bucket < SQUAD_VALIDATION_PERCENT else "train"


def _squad_paragraphs(split: str) -> Iterator[tuple[str, dict]]:
    """(article title, paragraph) of a split, in file order."""
    if split not in SQUAD_SPLITS:
        raise ValueError(f"SQuAD split must be one of {SQUAD_SPLITS}, got {split!r}")
    file = "dev" if split == "dev" else "train"
    for article in _squad_articles(file):
        for para in article["paragraphs"]:
            if file == "dev" or squad_part(article["title"]) == split:
                yield article["title"], para


def squad(split: str) -> list[dict]:
    """One record per question: id, title, question, context, answers {text, answer_start}."""
    return [
        {"id": qa["id"], "title": title, "question": qa["question"], "context": para["context"],
         "answers": {"text": [a["text"] for a in qa["answers"]],
                     "answer_start": [a["answer_start"] for a in qa["answers"]]}}
        for title, para in _squad_paragraphs(split) for qa in para["qas"]
    ]


def squad_contexts(split: str) -> list[str]:
    """Unique paragraphs of a split, in file order."""
    return list(dict.fromkeys(para["context"] for _, para in _squad_paragraphs(split)))


# The splitter: a sentence ends at '.', '!' or '?' (plus any closing quotes/brackets) followed by
# whitespace and an upper-case letter, digit or opening quote/bracket -- except after a '.' that
# ends a single letter ("J."), a dotted abbreviation ("U.S.", "e.g.") or a listed abbreviation.
_BOUNDARY = re.compile(r"""[.!?]["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "no", "mt", "ft", "gen", "col", "lt",
                  "sgt", "capt", "prof", "rev", "inc", "ltd", "co", "corp", "etc", "approx", "ca"}


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans (start, end) of the sentences of ``text``, surrounding whitespace excluded."""
    spans, start = [], len(text) - len(text.lstrip())
    for m in _BOUNDARY.finditer(text):
        words = text[start:m.start()].split()
        last = words[-1].lstrip("\"'(").lower() if words else ""
        if text[m.start()] == "." and (len(last) <= 1 or "." in last or last in _ABBREVIATIONS):
            continue
        spans.append((start, m.start() + len(m.group().rstrip())))
        start = m.end()
    if text[start:].strip():
        spans.append((start, len(text.rstrip())))
    return spans


def qnli(split: str) -> list[dict]:
    """GLUE-style QNLI pairs built from SQuAD: {id (the SQuAD question id), question, sentence, label}."""
    records = []
    for rec in squad(split):
        start = rec["answers"]["answer_start"][0]
        end = start + len(rec["answers"]["text"][0])
        for s, e in split_sentences(rec["context"]):
            label = "entailment" if s <= start and end <= e else "not_entailment"
            records.append({"id": rec["id"], "question": rec["question"],
                            "sentence": rec["context"][s:e], "label": label})
    return records


def squad_retrieval(split: str) -> dict:
    """Question -> its paragraph: {"queries": [{qid, text, positive}], "passages": [{pid, text}]}."""
    pids = {context: f"{split}-p{i}" for i, context in enumerate(squad_contexts(split))}
    return {"queries": [{"qid": r["id"], "text": r["question"], "positive": pids[r["context"]]}
                        for r in squad(split)],
            "passages": [{"pid": pid, "text": context} for context, pid in pids.items()]}


# ---------------------------------------------------------------- Wikipedia vital-article leads
@functools.lru_cache(maxsize=1)
def _wiki_raw() -> tuple:
    with open(asset_path("wiki"), encoding="utf-8") as f:
        return tuple(json.load(f).values())


def wiki_articles() -> list[dict]:
    """All 10,033 leads: {title, text, topic, description} (the JSON calls the lead 'extract')."""
    return [{"title": a["title"], "text": a["extract"], "topic": a["topic"], "description": a["description"]}
            for a in _wiki_raw()]


def wiki_part(title: str) -> str:
    """'eval' or 'pretrain' for an article title, by a stable sha256 hash (see the module docstring)."""
    bucket = int(hashlib.sha256(f"raybiphase-wiki-split:{title}".encode()).hexdigest()[:8], 16) % 100
    return "eval" if bucket < WIKI_EVAL_PERCENT else "pretrain"


def wiki_split(part: str) -> list[dict]:
    """The articles of one part, 'pretrain' or 'eval', in file order."""
    if part not in ("pretrain", "eval"):
        raise ValueError(f"wiki part must be 'pretrain' or 'eval', got {part!r}")
    return [a for a in wiki_articles() if wiki_part(a["title"]) == part]


def wiki_topics() -> list[dict]:
    """Topic classification over the eval part, 'Uncategorized' dropped: {text, label}."""
    return [{"text": a["text"], "label": a["topic"]} for a in wiki_split("eval") if a["topic"] != WIKI_UNCATEGORIZED]


def wiki_retrieval() -> dict:
    """Wikidata description -> article over the eval part (articles without a description have no query)."""
    articles = wiki_split("eval")
    return {"queries": [{"qid": f"wiki-q{i}", "text": a["description"], "positive": a["title"]}
                        for i, a in enumerate(articles) if a["description"].strip()],
            "passages": [{"pid": a["title"], "text": a["text"]} for a in articles]}


# ---------------------------------------------------------------- tweets
def tweets() -> list[dict]:
    """38,158 crowd-labelled tweets: {text, label} with label in TWEET_LABELS."""
    path = asset_path("tweets")
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        rows = list(csv.DictReader(f))
    records = []
    for line, row in enumerate(rows, start=2):
        label = (row.get("sentiment") or "").strip().lower()
        if label not in TWEET_LABELS:
            raise SourceError(f"{path}:{line}: unknown sentiment {row.get('sentiment')!r}")
        records.append({"text": row["text"], "label": label})
    return records


# ---------------------------------------------------------------- pretraining corpora
def evaluation_texts() -> list[str]:
    """The paragraphs the offline tasks validate and test on: SQuAD validation and dev paragraphs, wiki eval leads."""
    return squad_contexts("validation") + squad_contexts("dev") + [a["text"] for a in wiki_split("eval")]


def article_key(title: str) -> str:
    """A Wikipedia title as SQuAD ("Super_Bowl_50") and the wiki leads ("Super Bowl 50") both write it."""
    return " ".join(title.replace("_", " ").split()).casefold()


def evaluated_articles() -> set[str]:
    """`article_key`s of every article an offline task validates or tests on: SQuAD validation and dev articles and
    the wiki eval leads' articles."""
    titles = [title for split in ("validation", "dev") for title, _ in _squad_paragraphs(split)]
    return {article_key(t) for t in titles + [a["title"] for a in wiki_split("eval")]}


def _sentences(text: str) -> set[str]:
    return {" ".join(text[s:e].split()) for s, e in split_sentences(text)}


def pretraining_texts() -> Iterator[str]:
    """Documents for pretraining: SQuAD train-part paragraphs, then the wiki pretrain-part leads, each left out when
    its article is evaluated or it shares a sentence with an evaluation text (module docstring)."""
    articles = evaluated_articles()
    held_out = set().union(*map(_sentences, evaluation_texts()))
    documents = itertools.chain(((t, p["context"]) for t, p in _squad_paragraphs("train")),
                                ((a["title"], a["text"]) for a in wiki_split("pretrain")))
    seen = set()
    for title, text in documents:
        if text not in seen and article_key(title) not in articles and held_out.isdisjoint(_sentences(text)):
            seen.add(text)
            yield text


def hf_texts(dataset_id: str, split: str, text_field: str, config_name: str | None = None,
             streaming: bool = True, revision: str | None = None) -> Iterator[str]:
    """Non-empty ``text_field`` values of a Hugging Face dataset at `revision` (its default branch when None), from
    its snapshot under RAYBIPHASE_DATASETS_DIR when that is set, else the hub (not used offline)."""
    import datasets

    root = os.environ.get(DATASETS_DIR_ENV)
    where = {"path": os.path.join(root, dataset_id)} if root else {"path": dataset_id, "revision": revision}
    try:
        rows = datasets.load_dataset(**where, name=config_name, split=split, streaming=streaming)
    except Exception as e:  # the datasets library raises many types; report one line
        raise SourceError(f"could not load {dataset_id} ({config_name}, {split}): "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    for row in rows:
        if text_field not in row:
            raise SourceError(f"{dataset_id} has no field {text_field!r}; fields: {', '.join(row)}")
        if isinstance(row[text_field], str) and row[text_field].strip():
            yield row[text_field]


def text_files(location: str) -> list[str]:
    """The .txt, .jsonl and .parquet files of a file or a folder (searched recursively, sorted), on disk or in a
    bucket; each as a location (a path or a URI)."""

    fs, path = storage.filesystem(location)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise SourceError(f"no such file or folder: {location}")
    if info.type == pafs.FileType.File:
        if Path(path).suffix not in _READERS:
            raise SourceError(f"unsupported file type {Path(path).suffix!r}: {location} (use .txt, .jsonl or .parquet)")
        return [storage.absolute(location)]
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    names = sorted(i.path[len(path):].lstrip("/") for i in found
                   if i.type == pafs.FileType.File and Path(i.path).suffix in _READERS)
    if not names:
        raise SourceError(f"no .txt, .jsonl or .parquet files under {location}")
    return [storage.join(storage.absolute(location), name) for name in names]


def file_texts(location: str, txt_mode: str = "blocks", row_groups: range | None = None) -> Iterator[str]:
    """Non-blank documents of one file, streamed: .txt gives one document per blank-line-separated block
    (``txt_mode="blocks"``) or per file (``txt_mode="file"``); .jsonl a ``text`` field per line; .parquet its
    ``text`` column (``row_groups``: only those)."""

    suffix = Path(location).suffix
    if suffix not in _READERS:
        raise SourceError(f"unsupported file type {suffix!r}: {location} (use .txt, .jsonl or .parquet)")
    fs, path = storage.filesystem(location)
    try:
        yield from (t for t in _READERS[suffix](fs, path, location, txt_mode, row_groups) if t.strip())
    except SourceError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, KeyError) as e:
        raise SourceError(f"could not read {location}: {type(e).__name__}: {e}") from e


def corpus_texts(location: str, txt_mode: str = "blocks") -> Iterator[str]:
    """Documents of every file of a file or a folder (see `text_files` and `file_texts`), in order."""
    for file in text_files(location):
        yield from file_texts(file, txt_mode)


def _text_stream(fs, path):
    import io

    return io.TextIOWrapper(fs.open_input_stream(path), encoding="utf-8")


def _read_txt(fs, path, location, txt_mode: str, _groups) -> Iterator[str]:
    with _text_stream(fs, path) as f:
        text = f.read()
    if txt_mode == "file":
        yield text.strip()
    elif txt_mode == "blocks":
        yield from (block.strip() for block in re.split(r"\n\s*\n", text))
    else:
        raise SourceError(f"txt_mode must be 'blocks' or 'file', got {txt_mode!r}")


def _read_jsonl(fs, path, location, _mode, _groups) -> Iterator[str]:
    with _text_stream(fs, path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SourceError(f"{location}:{number}: not a JSON object with a 'text' field ({e})") from e
            if text is None:  # a missing document, as a Parquet null is
                continue
            if not isinstance(text, str):
                raise SourceError(f"{location}:{number}: 'text' is not a string but "
                                  f"{type(text).__name__} {text!r:.40}")
            yield text


def _read_parquet(fs, path, location, _mode, row_groups) -> Iterator[str]:
    import pyarrow.parquet as pq

    with fs.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        if "text" not in parquet.schema_arrow.names:
            raise SourceError(f"{location} has no 'text' column; columns: {', '.join(parquet.schema_arrow.names)}")
        groups = list(row_groups) if row_groups is not None else None
        for batch in parquet.iter_batches(batch_size=1024, row_groups=groups, columns=["text"]):
            yield from (t for t in batch.column("text").to_pylist() if isinstance(t, str))


_READERS = {".txt": _read_txt, ".jsonl": _read_jsonl, ".parquet": _read_parquet}
