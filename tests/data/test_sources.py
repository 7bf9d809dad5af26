"""The offline sources: counts from the real files, spans, leakage, derived tasks."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from raybiphase.data import assets, sources


@pytest.fixture(scope="module", autouse=True)
def cache():
    return assets.fetch()  # a no-op once cached


def test_squad_counts_and_spans():
    dev, train, validation = sources.squad("dev"), sources.squad("train"), sources.squad("validation")
    assert (len(dev), len(train) + len(validation)) == (10_570, 87_599)  # the official dev and train files
    assert len(sources.squad_contexts("dev")) == 2_067
    # 18,896 paragraphs in the train file, 5 of which repeat an earlier paragraph's text verbatim
    assert len(sources.squad_contexts("train")) + len(sources.squad_contexts("validation")) == 18_891
    assert len({r["id"] for r in dev}) == len(dev)
    for rec in dev + train + validation:
        answers = rec["answers"]
        assert answers["text"] and len(answers["text"]) == len(answers["answer_start"])
        for text, start in zip(answers["text"], answers["answer_start"]):
            assert rec["context"][start:start + len(text)] == text
    assert set(dev[0]) == {"id", "title", "question", "context", "answers"}
    with pytest.raises(ValueError):
        sources.squad("test")


def test_squad_validation_is_about_5_percent_of_the_train_files_questions_held_out_by_article():
    train, validation = sources.squad_contexts("train"), sources.squad_contexts("validation")
    assert len(validation) == 886 and 0.04 < len(validation) / (len(train) + len(validation)) < 0.06
    assert not set(train) & set(validation)  # a repeated paragraph lands in one part
    titles = {part: {r["title"] for r in sources.squad(part)} for part in ("train", "validation")}
    assert len(titles["validation"]) == 22 and not titles["train"] & titles["validation"]  # whole articles
    assert all(sources.squad_part(t) == "validation" for t in titles["validation"])
    assert all(sources.squad_part(t) == "train" for t in titles["train"])
    questions = {r["id"] for r in sources.squad("validation")}
    assert 0.04 < len(questions) / 87_599 < 0.06 and not questions & {r["id"] for r in sources.squad("train")}


def test_squad_is_deterministic_and_unshared():
    first, second = sources.squad("dev"), sources.squad("dev")
    assert first == second
    first[0]["answers"]["text"].append("mutated")
    assert sources.squad("dev")[0] == second[0]


def test_wiki_articles_and_split():
    articles = sources.wiki_articles()
    assert len(articles) == 10_033
    assert set(articles[0]) == {"title", "text", "topic", "description"}
    pretrain, evaluation = sources.wiki_split("pretrain"), sources.wiki_split("eval")
    assert len(pretrain) + len(evaluation) == len(articles)
    assert not {a["title"] for a in pretrain} & {a["title"] for a in evaluation}
    assert 0.27 < len(evaluation) / len(articles) < 0.33
    assert [a["title"] for a in sources.wiki_split("eval")] == [a["title"] for a in evaluation]
    topics = Counter(a["topic"] for a in articles)
    assert topics["Uncategorized"] == 1_000
    assert sorted(set(topics) - {"Uncategorized"}) == sources.WIKI_TOPICS and len(sources.WIKI_TOPICS) == 11


def test_wiki_topics_use_the_eval_part_only():
    records = sources.wiki_topics()
    assert {r["label"] for r in records} == set(sources.WIKI_TOPICS)
    eval_texts = {a["text"] for a in sources.wiki_split("eval")}
    assert all(r["text"] in eval_texts for r in records)
    uncategorized = sum(a["topic"] == "Uncategorized" for a in sources.wiki_split("eval"))
    assert len(records) == len(eval_texts) - uncategorized


def test_tweets():
    records = sources.tweets()
    assert len(records) == 38_158
    assert Counter(r["label"] for r in records) == {"negative": 16_186, "neutral": 15_018, "positive": 6_954}
    assert all(r["text"].strip() for r in records)


def test_pretraining_texts_exclude_evaluation_text():
    texts = list(sources.pretraining_texts())
    candidates = sources.squad_contexts("train") + [a["text"] for a in sources.wiki_split("pretrain")]
    # 18,005 SQuAD train-part paragraphs and 7,015 wiki pretrain leads, less the 2,277 paragraphs and 25 leads of
    # evaluated articles and the 4 documents that share a sentence with an evaluation text
    assert len(texts) == len(candidates) - 2_277 - 25 - 4 == 22_714 and set(texts) <= set(candidates)
    held_out = set(sources.evaluation_texts())
    assert set(sources.squad_contexts("validation")) | set(sources.squad_contexts("dev")) <= held_out
    assert not held_out & set(texts)
    held_out_sentences = {" ".join(t[s:e].split()) for t in held_out for s, e in sources.split_sentences(t)}
    assert not any({" ".join(t[s:e].split()) for s, e in sources.split_sentences(t)} & held_out_sentences
                   for t in texts)


def test_pretraining_texts_hold_out_every_evaluated_article_whole():
    """A model validated or tested on one paragraph of an article never pretrains on another: SQuAD's validation
    and dev articles and the wiki eval leads' articles lose every paragraph and lead, whichever source has them."""
    texts = set(sources.pretraining_texts())
    articles = sources.evaluated_articles()
    assert {"super bowl 50", "oxygen", "london"} <= articles  # dev, dev, validation ("Super_Bowl_50" as a title)
    squad = [(title, para["context"]) for split in ("train", "validation", "dev")
             for title, para in sources._squad_paragraphs(split)]
    leads = [(a["title"], a["text"]) for a in sources.wiki_articles()]
    evaluated = [text for title, text in squad + leads if sources.article_key(title) in articles]
    assert len(evaluated) > 5_000 and not texts & set(evaluated)
    oxygen = [text for title, text in squad + leads if title == "Oxygen"]
    assert len(oxygen) > 40 and not texts & set(oxygen)  # its SQuAD dev paragraphs and its Wikipedia lead


def test_split_sentences():
    text = '  Mr. Smith joined the U.S. Army in 1990. He said "Go!" Then (in 1991) he left? Yes.  '
    sentences = [text[s:e] for s, e in sources.split_sentences(text)]
    assert sentences == ["Mr. Smith joined the U.S. Army in 1990.", 'He said "Go!"',
                         "Then (in 1991) he left?", "Yes."]
    assert sources.split_sentences("") == []


def test_qnli_dev():
    pairs = sources.qnli("dev")
    labels = Counter(p["label"] for p in pairs)
    assert set(labels) == {"entailment", "not_entailment"}
    # GLUE's own splitter gave 53,680 pairs / 10,468 positives; ours differs a little
    assert 48_000 < len(pairs) < 58_000
    assert 10_000 < labels["entailment"] <= 10_570  # at most one positive per question
    first_answer = {r["id"]: r["answers"]["text"][0] for r in sources.squad("dev")}
    assert len({p["id"] for p in pairs}) == len(first_answer)  # every question has sentences
    for pair in pairs:
        if pair["label"] == "entailment":
            assert first_answer[pair["id"]] in pair["sentence"]


def test_squad_retrieval():
    task = sources.squad_retrieval("dev")
    pids = [p["pid"] for p in task["passages"]]
    assert (len(task["queries"]), len(pids)) == (10_570, 2_067)
    assert len(set(pids)) == len(pids)
    assert all(q["positive"] in set(pids) for q in task["queries"])
    passage = {p["pid"]: p["text"] for p in task["passages"]}
    dev = {r["id"]: r for r in sources.squad("dev")}
    assert all(passage[q["positive"]] == dev[q["qid"]]["context"] for q in task["queries"])


def test_wiki_retrieval():
    task = sources.wiki_retrieval()
    evaluation = sources.wiki_split("eval")
    pids = {p["pid"] for p in task["passages"]}
    assert len(pids) == len(task["passages"]) == len(evaluation)
    assert all(q["positive"] in pids and q["text"].strip() for q in task["queries"])
    assert len(task["queries"]) == sum(bool(a["description"].strip()) for a in evaluation)


def test_corpus_texts(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first block\nstill first\n\n\nsecond block\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "from jsonl"}) + "\n\n" + json.dumps({"text": " "}) + "\n"
                                      + json.dumps({"text": None}) + "\n")
    pq.write_table(pa.table({"text": ["from parquet", None]}), tmp_path / "c.parquet")
    (tmp_path / "ignored.md").write_text("not read")
    assert list(sources.corpus_texts(tmp_path)) == ["first block\nstill first", "second block",
                                                   "from jsonl", "from parquet"]
    assert list(sources.corpus_texts(str(tmp_path / "a.txt"), txt_mode="file")) == [
        "first block\nstill first\n\n\nsecond block"]
    with pytest.raises(sources.SourceError, match="no such file or folder"):
        list(sources.corpus_texts(tmp_path / "missing"))
    (tmp_path / "bad.jsonl").write_text('{"title": "no text"}\n')
    with pytest.raises(sources.SourceError, match=r"bad\.jsonl:1"):
        list(sources.corpus_texts(tmp_path / "bad.jsonl"))
    with pytest.raises(sources.SourceError, match="unsupported file type"):
        list(sources.corpus_texts(tmp_path / "ignored.md"))
