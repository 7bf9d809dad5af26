"""The evaluation text of every task: what pretraining data is decontaminated against (raybiphase.data.decontam).

    texts = evaluation_texts("sst2")     # every validation and test text of SST-2, split as a sweep's trials split it
    prepare(data, evaluation_texts=evaluation_texts)

A task's evaluation text is what its validation and test splits hold, read through the task's own loader from the
source a sweep's trials read ("auto": offline when the task has an offline loader), uncapped: finetune.max_examples
changes what a run evaluates on, never what is held out, so the shards do not depend on it. Per family:
    SC  each example's text and text pair (a sentence; premise and hypothesis; two questions)
    TC  each sentence's words, joined by spaces
    QA  each question and its context
    IR  each query and the passages judged relevant to it: the restricted corpus of the authors' protocol (the rest
        of a collection only stands in as distractors, and no score is about it)
SQuAD is held out by article: a QA example that names its article (SQuAD's `title`) holds out every paragraph of
that article in the task's training split too, so no pretraining document may copy another paragraph of an article
a model is validated or tested on. The offline SQuAD tasks are split by article already
(raybiphase.data.sources), so their validation and test paragraphs are whole articles; the hub's SQuAD and SQuAD
v2 draw validation questions from the train split, whose articles' other paragraphs this adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from raybiphase.config import ConfigError, DataConfig
from raybiphase.finetune.tasks import TASKS, get_task, split_parts


def check_held_out_tasks(data: DataConfig) -> None:
    """ConfigError naming data.decontam_tasks when it names a task the registry does not know."""
    for name in data.decontam_tasks:
        if name not in TASKS:
            raise ConfigError(f"data.decontam_tasks: unknown task {name!r}; known: {', '.join(TASKS)}")


def evaluation_texts(name: str) -> Iterator[str]:
    """The validation and test texts of task `name` (module docstring), each once."""
    task = get_task(name)
    train, val, test = split_parts(task, (task.offline or task.production)())
    seen: set[str] = set()
    for text in _split_texts(task.family, val, test, train):
        if text not in seen:
            seen.add(text)
            yield text


def _split_texts(family: str, val, test, train) -> Iterator[str]:
    if family == "IR":
        yield from (text for part in (val, test) for text in _retrieval_texts(part))
        return
    for record in (*val, *test):
        yield from _record_texts(record)
    titles = {r["title"] for r in (*val, *test) if r.get("title")}
    yield from (r["context"] for r in train if titles and r.get("title") in titles)


def _record_texts(record: dict) -> Iterator[str]:
    """The texts of one light record (before a task's `finish`): words, a sentence span of a context (squad_bio),
    or its text fields."""
    if "words" in record:
        yield " ".join(record["words"])
    elif "start" in record:
        yield record["context"][record["start"]:record["end"]]
    else:
        yield from (record[key] for key in ("text", "text_pair", "sentence", "question", "context")
                    if isinstance(record.get(key), str))


def _retrieval_texts(rset: dict) -> Iterable[str]:
    judged = {pid for query in rset["queries"] for pid in query["positives"]}
    yield from (query["text"] for query in rset["queries"])
    yield from (passage["text"] for passage in rset["passages"] if passage["pid"] in judged)
