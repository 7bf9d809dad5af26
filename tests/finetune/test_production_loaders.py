"""The paper's twelve production datasets, read by the real `datasets` builders from small snapshots written in the
layout each hub repository serves (folders, file names, README `configs:`, column names and ClassLabel names), under
RAYBIPHASE_DATASETS_DIR. No network, no Ray.

Where a layout could not be confirmed from public text, the snapshot follows the convention the loader relies on:
the MTEB repositories (mteb/msmarco, mteb/nq) as MTEB's v1 loader reads them (configs default = qrels with train,
dev and test splits, corpus, queries), Shitao/MLDR as MTEB reads it (configs `en` with dev and test, `corpus-en`);
their data files' names are assumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
from datasets import ClassLabel, Features, List, Value

from raybiphase.errors import UserError
from raybiphase.finetune import baselines, hub, scoring, tasks
from raybiphase.finetune.heads.ir import RetrievalHead, top_k

PAPER_TASKS = ("sst2", "mnli", "qqp", "conll2003", "ontonotes", "uner", "squad", "squad_v2", "record", "msmarco",
               "nq", "mldr")
STRING = Value("string")
SQUAD = Features({"id": STRING, "title": STRING, "context": STRING, "question": STRING,
                  "answers": {"text": List(STRING), "answer_start": List(Value("int32"))}})
# the real repositories' tag lists, in their order (the loaders map tags by name, never by position)
CONLL_NER = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
ONTONOTES_NER = ["O", "B-PERSON", "I-PERSON", "B-NORP", "I-NORP", "B-FAC", "I-FAC", "B-ORG", "I-ORG", "B-GPE",
                 "I-GPE", "B-LOC", "I-LOC", "B-PRODUCT", "I-PRODUCT", "B-DATE", "I-DATE", "B-TIME", "I-TIME",
                 "B-PERCENT", "I-PERCENT", "B-MONEY", "I-MONEY", "B-QUANTITY", "I-QUANTITY", "B-ORDINAL",
                 "I-ORDINAL", "B-CARDINAL", "I-CARDINAL", "B-EVENT", "I-EVENT", "B-WORK_OF_ART", "I-WORK_OF_ART",
                 "B-LAW", "I-LAW", "B-LANGUAGE", "I-LANGUAGE"]


def record_commit(repo: Path, commit: str) -> None:
    """What `hf download --revision COMMIT --local-dir REPO` leaves beside each file: its commit, etag, time."""
    for path in [p for p in repo.rglob("*") if p.is_file() and ".cache" not in p.parts]:
        meta = repo / ".cache" / "huggingface" / "download" / f"{path.relative_to(repo)}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{commit}\netag\n1700000000.0\n")


def at_default(repo: Path, dataset_id: str) -> None:
    """A snapshot downloaded at the commit the dataset is read at by default (hub.DATASET_REVISIONS), if pinned."""
    if hub.DATASET_REVISIONS[dataset_id]:
        record_commit(repo, hub.DATASET_REVISIONS[dataset_id])


def _parquet(path: Path, rows: list[dict], features: Features) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))


def _card(repo: Path, configs: dict[str, dict[str, str]]) -> None:
    """README.md whose YAML front matter maps each config's splits to their files, as the hub's cards do."""
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {path}" for split, path in splits.items()]
    (repo / "README.md").write_text("\n".join(lines + ["---", f"# {repo.name}", ""]))


def _sharded(repo: Path, config: str, rows_by_split: dict[str, list[dict]], features: Features) -> dict[str, str]:
    """push_to_hub's layout: <config>/<split>-00000-of-00001.parquet; returns the card's data_files."""
    for split, rows in rows_by_split.items():
        _parquet(repo / config / f"{split}-00000-of-00001.parquet", rows, features)
    return {split: f"{config}/{split}-*" for split in rows_by_split}


def _exported(repo: Path, config: str, rows_by_split: dict[str, list[dict]], features: Features) -> None:
    """The hub's parquet export (refs/convert/parquet): <config>/<split>/0000.parquet, no card."""
    for split, rows in rows_by_split.items():
        _parquet(repo / config / split / "0000.parquet", rows, features)


def _glue(root: Path) -> None:
    repo = root / hub.GLUE
    idx = Value("int32")

    def sc(config, labels, *texts, rows):
        features = Features({**{t: STRING for t in texts}, "label": ClassLabel(names=labels), "idx": idx})
        return _sharded(repo, config, rows, features)

    sst2 = sc("sst2", ["negative", "positive"], "sentence", rows={
        "train": [{"sentence": "a gripping film", "label": 1, "idx": 0}, {"sentence": "dull", "label": 0, "idx": 1}],
        "validation": [{"sentence": "lovely", "label": 1, "idx": 0}],
        "test": [{"sentence": "unlabelled", "label": -1, "idx": 0}]})
    pair = {"premise": "A man sleeps.", "hypothesis": "A man is awake."}
    mnli = sc("mnli", ["entailment", "neutral", "contradiction"], "premise", "hypothesis", rows={
        "train": [{**pair, "label": 2, "idx": 0}, {**pair, "label": 1, "idx": 1}],
        "validation_matched": [{**pair, "label": 0, "idx": 0}],
        "validation_mismatched": [{**pair, "label": 1, "idx": 0}]})
    qqp = sc("qqp", ["not_duplicate", "duplicate"], "question1", "question2", rows={
        "train": [{"question1": "How old?", "question2": "What age?", "label": 1, "idx": 0}],
        "validation": [{"question1": "Why?", "question2": "Where?", "label": 0, "idx": 0}]})
    _card(repo, {"sst2": sst2, "mnli": mnli, "qqp": qqp})


def _conll2003(root: Path) -> None:
    """lhoestq/conll2003: data/<split>-00000-of-00001.parquet and a legacy dataset_infos.json, no card; pos and
    chunk tags carry only their first names here."""
    repo = root / hub.CONLL2003
    features = Features({"id": STRING, "tokens": List(STRING),
                         "pos_tags": List(ClassLabel(names=['"', "''", "#", "$", "(", ")", ",", ".", "NNP", "VBZ"])),
                         "chunk_tags": List(ClassLabel(names=["O", "B-ADJP", "I-ADJP", "B-NP", "B-VP"])),
                         "ner_tags": List(ClassLabel(names=CONLL_NER))})
    rows = {"train": [{"id": "0", "tokens": ["EU", "rejects", "German", "call"], "pos_tags": [8, 9, 8, 8],
                       "chunk_tags": [3, 4, 3, 3], "ner_tags": [3, 0, 7, 0]}],
            "validation": [{"id": "0", "tokens": ["Peter", "Blackburn"], "pos_tags": [8, 8], "chunk_tags": [3, 3],
                            "ner_tags": [1, 2]}],
            "test": [{"id": "0", "tokens": ["Japan"], "pos_tags": [8], "chunk_tags": [3], "ner_tags": [5]}]}
    for split, split_rows in rows.items():
        _parquet(repo / "data" / f"{split}-00000-of-00001.parquet", split_rows, features)
    infos = {"lhoestq--conll2003": {"features": features.to_dict()}}
    (repo / "dataset_infos.json").write_text(json.dumps(infos))


def _ontonotes(root: Path) -> None:
    """english_v12 of the parquet export: one row per document, its sentences nested (a subset of their fields)."""
    sentence = {"part_id": Value("int32"), "words": List(STRING), "speaker": STRING,
                "named_entities": List(ClassLabel(names=ONTONOTES_NER)), "coref_spans": List(List(Value("int32")))}
    features = Features({"document_id": STRING, "sentences": List(sentence)})

    def doc(doc_id, *sentences):
        return {"document_id": doc_id, "sentences": [{"part_id": 0, "words": w, "speaker": None, "named_entities": t,
                                                      "coref_spans": []} for w, t in sentences]}
    _exported(root / hub.ONTONOTES, "english_v12", {
        "train": [doc("nw/wsj/00", (["Paris", "is", "big"], [9, 0, 0]), (["On", "Monday"], [0, 15])),
                  doc("nw/wsj/01", (["New", "York", "Times"], [7, 8, 8]))],
        "validation": [doc("bc/cnn/00", (["$", "3", "million"], [21, 22, 22]))],
        "test": [doc("bc/cnn/01", (["Hi"], [0]))]}, features)


def _uner(root: Path) -> None:
    repo = root / hub.UNER
    features = Features({"idx": STRING, "text": STRING, "tokens": List(STRING),
                         "ner_tags": List(ClassLabel(names=list(hub.UNER_TAGS))), "annotator": List(STRING)})
    en_ewt = _sharded(repo, "en_ewt", {
        "train": [{"idx": "a-1", "text": "Bush met Putin", "tokens": ["Bush", "met", "Putin"], "ner_tags": [1, 0, 1],
                   "annotator": ["A"]}],
        "validation": [{"idx": "b-1", "text": "in Iraq", "tokens": ["in", "Iraq"], "ner_tags": [0, 5],
                        "annotator": ["B"]}],
        "test": [{"idx": "c-1", "text": "ok", "tokens": ["ok"], "ner_tags": [0], "annotator": ["C"]}]}, features)
    _card(repo, {"en_ewt": en_ewt})


def _squads(root: Path) -> None:
    context = "The Eiffel Tower is in Paris. It opened in 1889."
    answered = {"id": "q1", "title": "Eiffel", "context": context, "question": "Where is the tower?",
                "answers": {"text": ["Paris", "in Paris"], "answer_start": [23, 20]}}
    unanswerable = {"id": "q2", "title": "Eiffel", "context": context, "question": "Who painted it?",
                    "answers": {"text": [], "answer_start": []}}
    for dataset_id, config, rows in (("rajpurkar/squad", "plain_text", [answered]),
                                     ("rajpurkar/squad_v2", "squad_v2", [answered, unanswerable])):
        repo = root / dataset_id
        _card(repo, {config: _sharded(repo, config, {"train": rows, "validation": rows[::-1]}, SQUAD)})


RECORD_PASSAGE = "Barack Obama visited Kenya.\n@highlight\nObama met Kenyatta in Nairobi"


def _record(root: Path) -> None:
    features = Features({"passage": STRING, "query": STRING, "entities": List(STRING),
                         "entity_spans": List({"text": STRING, "start": Value("int32"), "end": Value("int32")}),
                         "answers": List(STRING), "idx": {"passage": Value("int32"), "query": Value("int32")}})
    entities = ["Barack Obama", "Kenya", "Kenyatta", "Nairobi", "Obama"]
    spans = [{"text": e, "start": RECORD_PASSAGE.index(e), "end": RECORD_PASSAGE.index(e) + len(e)} for e in entities]

    def row(query, answers, q):
        return {"passage": RECORD_PASSAGE, "query": query, "entities": entities, "entity_spans": spans,
                "answers": answers, "idx": {"passage": 7, "query": q}}
    repo = root / hub.SUPER_GLUE
    _card(repo, {"record": _sharded(repo, "record", {
        "train": [row("@placeholder was welcomed in Nairobi.", ["Barack Obama", "Obama"], 0)],
        "validation": [row("The trip ended in @placeholder.", ["Nairobi"], 1)],
        "test": [row("@placeholder spoke.", [], 2)]}, features)})
    at_default(repo, hub.SUPER_GLUE)


def _mteb(root: Path, dataset_id: str, corpus: list[dict], queries: list[dict], qrels: dict[str, list]) -> None:
    """BEIR/MTEB layout: configs default (qrels per split), corpus (split corpus), queries (split queries)."""
    repo = root / dataset_id
    _parquet(repo / "corpus" / "corpus-00000-of-00001.parquet", corpus,
             Features({"_id": STRING, "title": STRING, "text": STRING}))
    _parquet(repo / "queries" / "queries-00000-of-00001.parquet", queries, Features({"_id": STRING, "text": STRING}))
    judgement = Features({"query-id": STRING, "corpus-id": STRING, "score": Value("int64")})
    for split, rows in qrels.items():
        _parquet(repo / "qrels" / f"{split}-00000-of-00001.parquet",
                 [{"query-id": q, "corpus-id": c, "score": s} for q, c, s in rows], judgement)
    _card(repo, {"default": {split: f"qrels/{split}-*" for split in qrels},
                 "corpus": {"corpus": "corpus/corpus-*"}, "queries": {"queries": "queries/queries-*"}})
    at_default(repo, dataset_id)


def squad_as_msmarco(root: Path, *, queries: int = 64) -> None:
    """An mteb/msmarco snapshot of real text: SQuAD's questions and paragraphs (the offline assets) in MS MARCO's
    layout and its qrels' shapes: `queries` train questions judged on their paragraph, as many dev questions with
    one relevant and one non-relevant judgement, and as many TREC-DL-like test questions graded 3 on their paragraph
    and 1 on another (binary relevance counts both, graded NDCG the grades)."""
    from raybiphase.data import sources

    train, held = sources.squad("train")[:queries], sources.squad("validation")[:2 * queries]
    pid = {}
    for r in train + held:
        pid.setdefault(r["context"], str(len(pid)))
    other = {r["id"]: pid[held[(i + 7) % len(held)]["context"]] for i, r in enumerate(held)}
    _mteb(root, hub.MSMARCO, [{"_id": i, "title": "", "text": text} for text, i in pid.items()],
          [{"_id": r["id"], "text": r["question"]} for r in train + held], {
              "train": [(r["id"], pid[r["context"]], 1) for r in train],
              "dev": [(r["id"], x, s) for r in held[:queries] for x, s in ((pid[r["context"]], 1), (other[r["id"]], 0))],
              "test": [(r["id"], x, s) for r in held[queries:] for x, s in ((pid[r["context"]], 3), (other[r["id"]], 1))]})


NQ_QUERIES = [f"test{i}" for i in range(7)]


def _retrieval(root: Path) -> None:
    """MS MARCO: train, dev and graded test (TREC-DL 2019) qrels, judged and unjudged passages, a judged query with
    no relevant passage; NQ: seven test queries over a corpus with unjudged documents; MLDR: dev and test."""
    passages = [{"_id": str(i), "title": "", "text": f"passage {i} about topic {i}"} for i in range(10)]
    queries = [{"_id": f"{q}", "text": f"what is topic {q}"} for q in ("100", "101", "102", "200", "201", "300", "301")]
    _mteb(root, hub.MSMARCO, passages, queries, {
        "train": [("100", "0", 1), ("101", "1", 1), ("102", "2", 1), ("102", "5", 0)],
        "dev": [("200", "4", 1), ("201", "6", 1), ("201", "7", 0)],
        "test": [("300", "3", 3), ("300", "8", 1), ("300", "9", 0), ("301", "3", 0)]})
    _mteb(root, hub.NQ, [{"_id": f"doc{i}", "title": "Paris" if i == 0 else "", "text": f"document {i}."}
                         for i in range(9)],
          [{"_id": qid, "text": f"question {qid}"} for qid in NQ_QUERIES],
          {"test": [(qid, f"doc{i}", 1) for i, qid in enumerate(NQ_QUERIES)] + [("test0", "doc7", 0)]})
    mldr = root / hub.MLDR
    long_doc = Features({"docid": STRING, "text": STRING})
    documents = [{"docid": f"doc-en-{i}", "text": f"A long article number {i}."} for i in range(1, 5)]
    _parquet(mldr / "corpus-en" / "corpus-00000-of-00001.parquet", documents, long_doc)
    query = Features({"query_id": STRING, "query": STRING, "positive_passages": List(long_doc),
                      "negative_passages": List(long_doc)})
    for split, qid, positive in (("dev", "q-dev-1", documents[0]), ("test", "q-en-1", documents[1])):
        _parquet(mldr / "en" / f"{split}-00000-of-00001.parquet",
                 [{"query_id": qid, "query": f"which article is {qid}?", "positive_passages": [positive],
                   "negative_passages": [documents[2]]}], query)
    _card(mldr, {"en": {"dev": "en/dev-*", "test": "en/test-*"}, "corpus-en": {"corpus": "corpus-en/corpus-*"}})
    at_default(mldr, hub.MLDR)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    for write in (_glue, _conll2003, _ontonotes, _uner, _squads, _record, _retrieval):
        write(root)
    return root


@pytest.fixture
def hub_dir(snapshots, tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(hub.DATASETS_DIR_ENV, str(snapshots))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    tasks._load_splits.cache_clear()
    yield snapshots
    tasks._load_splits.cache_clear()


# ------------------------------------------------------------------------------------------------ per family


def test_every_paper_dataset_has_a_production_loader_and_its_family():
    families = {name: tasks.get_task(name).family for name in PAPER_TASKS}
    assert families == {"sst2": "SC", "mnli": "SC", "qqp": "SC", "conll2003": "TC", "ontonotes": "TC", "uner": "TC",
                        "squad": "QA", "squad_v2": "QA", "record": "QA", "msmarco": "IR", "nq": "IR", "mldr": "IR"}
    assert all(tasks.get_task(name).production for name in PAPER_TASKS)
    assert [tasks.get_task(n).train_task for n in ("msmarco", "nq", "mldr")] == ["", "msmarco", "msmarco"]
    assert "MS MARCO" in tasks.get_task("nq").dataset and "MS MARCO" in tasks.get_task("mldr").dataset


def test_glue_labels_are_mapped_by_name_and_mnli_tests_on_matched(hub_dir):
    train, test = tasks.get_task("sst2").production()
    assert train == [{"text": "a gripping film", "text_pair": None, "label": 1},
                     {"text": "dull", "text_pair": None, "label": 0}]
    assert test == [{"text": "lovely", "text_pair": None, "label": 1}]
    mnli = tasks.get_task("mnli")
    train, test = mnli.production()
    assert [mnli.label_names[r["label"]] for r in train] == ["contradiction", "neutral"]
    assert test[0] == {"text": "A man sleeps.", "text_pair": "A man is awake.", "label": 0}  # matched, not mismatched
    train, test = tasks.get_task("qqp").production()
    assert train[0]["label"] == 1 and test[0]["text_pair"] == "Where?"


def test_sentence_pairs_are_read_as_one_text_in_the_authors_templates(hub_dir):
    """EncodEval's `mnli_m()` and `qqp()` write each pair as one text; the head reads exactly that text."""
    mnli, qqp = tasks.get_task("mnli"), tasks.get_task("qqp")
    (record,) = mnli.production()[1]
    assert mnli.input_text(record) == "Premise: A man sleeps.\nHypothesis: A man is awake."
    assert qqp.input_text(qqp.production()[1][0]) == "Question 1: Why?\nQuestion 2: Where?"
    sst2 = tasks.get_task("sst2")
    assert sst2.input_text(sst2.production()[1][0]) == "lovely"  # a single text as it is


def test_token_classification_sets_give_bio_tags_by_name(hub_dir):
    train, test = tasks.get_task("conll2003").production()
    assert train == [{"words": ["EU", "rejects", "German", "call"], "tags": ["B-ORG", "O", "B-MISC", "O"]}]
    assert test == [{"words": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"]}]
    onto = tasks.get_task("ontonotes")
    train, test = onto.production()
    assert train == [{"words": ["Paris", "is", "big"], "tags": ["B-GPE", "O", "O"]},  # every sentence of every doc
                     {"words": ["On", "Monday"], "tags": ["O", "B-DATE"]},
                     {"words": ["New", "York", "Times"], "tags": ["B-ORG", "I-ORG", "I-ORG"]}]
    assert test == [{"words": ["$", "3", "million"], "tags": ["B-MONEY", "I-MONEY", "I-MONEY"]}]
    assert set(ONTONOTES_NER) == set(onto.label_names)
    train, test = tasks.get_task("uner").production()
    assert train[0]["tags"] == ["B-PER", "O", "B-PER"] and test[0] == {"words": ["in", "Iraq"], "tags": ["O", "B-LOC"]}


def _spans_match(record: dict) -> bool:
    answers = record["answers"]
    return all(record["context"][start:start + len(text)] == text
               for text, start in zip(answers["text"], answers["answer_start"], strict=True))


def test_qa_answers_are_character_spans_of_their_context(hub_dir):
    train, test = tasks.get_task("squad").production()
    assert set(train[0]) == {"id", "title", "question", "context", "answers"} and train[0]["id"] == "q1"
    assert train[0]["title"] == "Eiffel"  # SQuAD is held out of pretraining by article (raybiphase.finetune.heldout)
    assert train[0]["answers"] == {"text": ["Paris", "in Paris"], "answer_start": [23, 20]}
    train, test = tasks.get_task("squad_v2").production()
    assert test[0]["answers"] == {"text": [], "answer_start": []}  # unanswerable
    train, test = tasks.get_task("record").production()
    assert train[0]["question"] == "@placeholder was welcomed in Nairobi." and train[0]["id"] == "7-0"
    assert train[0]["answers"] == {"text": ["Barack Obama", "Obama"], "answer_start": [0, 7]}  # first occurrences
    assert test[0]["answers"] == {"text": ["Nairobi"], "answer_start": [RECORD_PASSAGE.index("Nairobi")]}
    for name in ("squad", "squad_v2", "record"):
        assert all(_spans_match(r) for part in tasks.get_task(name).production() for r in part)


def _pids(rset: dict) -> set[str]:
    return {p["pid"] for p in rset["passages"]}


def test_msmarco_validates_on_dev_and_tests_on_trec_dl_over_one_corpus_every_passage_either_judges(hub_dir):
    train, val, test = tasks.get_task("msmarco").production()
    assert [(q["qid"], q["positives"]) for q in train["queries"]] == [("100", ["0"]), ("101", ["1"]), ("102", ["2"])]
    assert _pids(train) == {"0", "1", "2", "5"}  # training reads positives only: its judged passages suffice
    assert [(q["qid"], q["positives"]) for q in val["queries"]] == [("200", ["4"]), ("201", ["6"])]  # dev qrels
    # the `test` qrels (TREC-DL 2019): graded; a query with no relevant passage does not count, its passage does
    assert test["queries"] == [{"qid": "300", "text": "what is topic 300", "positives": ["3", "8"],
                                "grades": {"3": 3, "8": 1}}]
    # one corpus, as the authors' msmarco(): judged by dev (4, 6, 7) or by TREC-DL (3, 8, 9), relevant or not
    assert _pids(val) == _pids(test) == {"3", "4", "6", "7", "8", "9"}
    assert val["passages"] is test["passages"]  # shared, not copied
    _, full_val, full_test = hub.msmarco(corpus="full")  # the stated option: the whole collection
    assert _pids(full_val) == _pids(full_test) == {str(i) for i in range(10)}
    assert full_test["queries"] == test["queries"]


def test_a_passage_only_trec_dl_judges_is_a_candidate_for_a_dev_query(hub_dir):
    """Passage 8 is judged by the test qrels alone; the validation split's ranking holds it, so a dev query that
    matches it best ranks it first (each split ranked only its own judged passages before: 8 was not there)."""
    val = tasks.load_splits(tasks.get_task("msmarco"), source="production").val
    pids = [p["pid"] for p in val["passages"]]
    assert "8" in pids and all("8" not in q["positives"] for q in val["queries"])
    head = RetrievalHead.__new__(RetrievalHead)
    head.query = head.document = lambda text: text
    queries, relevant, passages, ranked_pids = head.prepare_eval(
        {"queries": [{"qid": "q", "text": "passage 8", "positives": ["4"]}], "passages": val["passages"]})
    assert ranked_pids == pids and relevant == [{"4"}]
    vectors = torch.eye(len(pids))  # each passage its own direction; the query points at passage 8's
    assert pids[top_k(vectors[pids.index("8")][None], vectors)[0, 0]] == "8"


def test_relevance_is_binary_by_default_and_graded_by_choice(hub_dir):
    """TREC-DL 2019's query 300: passage 3 graded 3, 8 graded 1, 9 graded 0 (judged, not relevant)."""
    msmarco = tasks.get_task("msmarco")
    binary = tasks.load_splits(msmarco, source="production").test["queries"]
    graded = tasks.load_splits(msmarco, source="production", ir_relevance="graded").test["queries"]
    assert binary == [{"qid": "300", "text": "what is topic 300", "positives": ["3", "8"]}]  # score >= 1 counts 1
    assert graded[0]["grades"] == {"3": 3, "8": 1}
    (relevant,) = [tasks.relevance(q) for q in binary]
    (grades,) = [tasks.relevance(q) for q in graded]
    # by hand, ranking 9, 8, 4, 3: gains at ranks 2 and 4, discounts 1/log2(3) = 0.63093 and 1/log2(5) = 0.43068;
    # binary: DCG 1 x 0.63093 + 1 x 0.43068 = 1.06161 over the ideal 1 + 0.63093 = 1.63093: 0.65092
    # graded: DCG 1 x 0.63093 + 3 x 0.43068 = 1.92296 over the ideal 3 + 0.63093 = 3.63093: 0.52960
    ranked = ["9", "8", "4", "3"]
    assert scoring.ndcg_at_k(ranked, relevant) == pytest.approx(0.65092, abs=1e-5)
    assert scoring.ndcg_at_k(ranked, grades) == pytest.approx(0.52960, abs=1e-5)
    assert scoring.mrr_at_k(ranked, relevant) == scoring.mrr_at_k(ranked, grades) == 0.5
    # the BM25 row counts as the trials do: "topic" is in every passage and "300" in none, so BM25 ties them all
    # and ranks the corpus in its order, 3 4 6 7 8 9: binary (1 + 1/log2(6)) / 1.63093 = 0.85034, graded
    # (3 + 1/log2(6)) / 3.63093 = 0.93278
    assert baselines.bm25_baseline("msmarco")["test_score"] == pytest.approx(0.85034, abs=1e-5)
    assert baselines.bm25_baseline("msmarco", ir_relevance="graded")["test_score"] == pytest.approx(0.93278, abs=1e-5)
    with pytest.raises(UserError, match="finetune.ir_relevance"):
        tasks.load_splits(msmarco, source="production", ir_relevance="trec")


def test_nq_halves_its_test_queries_with_a_recorded_seed_over_the_judged_documents(hub_dir):
    msmarco_train, _, _ = tasks.get_task("msmarco").production()
    train, val, test = tasks.get_task("nq").production()
    assert train == msmarco_train
    validation_ids, test_ids = [q["qid"] for q in val["queries"]], [q["qid"] for q in test["queries"]]
    assert sorted(validation_ids + test_ids) == NQ_QUERIES and not set(validation_ids) & set(test_ids)
    assert (len(validation_ids), len(test_ids)) == (3, 4)
    assert validation_ids == sorted(validation_ids) and test_ids == sorted(test_ids)  # the queries' own order
    assert f"seed {hub.NQ_SPLIT_SEED}" in tasks.get_task("nq").dataset  # the seed is on every nq row
    again = hub.halves(val["queries"] + test["queries"])  # repeatable, and the seed is what draws it
    assert [[q["qid"] for q in half] for half in again] == [validation_ids, test_ids]
    draws = {tuple(q["qid"] for q in hub.halves(val["queries"] + test["queries"], seed)[0]) for seed in range(8)}
    assert len(draws) > 1
    assert _pids(val) == _pids(test) == {f"doc{i}" for i in range(8)}  # doc8 is judged by no query
    assert val["passages"][0] == {"pid": "doc0", "text": "Paris. document 0."}  # "title. text", as the authors
    assert val["passages"][1] == {"pid": "doc1", "text": "document 1."}  # untitled: the text alone
    assert _pids(hub.nq(corpus="full")[1]) == {f"doc{i}" for i in range(9)}


def test_mldr_validates_on_dev_and_tests_on_test_over_both_splits_positive_documents(hub_dir):
    msmarco_train, _, _ = tasks.get_task("msmarco").production()
    train, val, test = tasks.get_task("mldr").production()
    assert train == msmarco_train
    assert [(q["qid"], q["positives"]) for q in val["queries"]] == [("q-dev-1", ["doc-en-1"])]
    assert [(q["qid"], q["positives"]) for q in test["queries"]] == [("q-en-1", ["doc-en-2"])]
    assert _pids(val) == _pids(test) == {"doc-en-1", "doc-en-2"}
    assert _pids(hub.mldr(corpus="full")[2]) == {f"doc-en-{i}" for i in range(1, 5)}


def test_load_splits_keeps_each_retrieval_tasks_own_validation_and_test(hub_dir):
    _, nq_val, nq_test = tasks.get_task("nq").production()
    splits = tasks.load_splits(tasks.get_task("nq"), source="production")
    trained_on = {r["pid"] for r in splits.train}
    assert trained_on == {"0", "1", "2"}  # MS MARCO's pairs
    assert sorted(q["qid"] for q in splits.val["queries"]) == [q["qid"] for q in nq_val["queries"]]
    assert splits.test == nq_test
    full = tasks.load_splits(tasks.get_task("nq"), source="production", ir_corpus="full")
    assert len(full.test["passages"]) == 9 and full.test["queries"] == nq_test["queries"]
    with pytest.raises(UserError, match="finetune.ir_corpus"):
        tasks.load_splits(tasks.get_task("nq"), source="production", ir_corpus="everything")


def test_load_splits_reads_production_snapshots_into_the_papers_splits(hub_dir):
    splits = tasks.load_splits(tasks.get_task("ontonotes"), source="production")
    assert len(splits.train) + len(splits.val) == 3 and len(splits.val) == 1  # ceil(5% of 3)
    assert splits.test == [{"words": ["$", "3", "million"], "tags": ["B-MONEY", "I-MONEY", "I-MONEY"]}]


# ------------------------------------------------------------------------------------------------ errors


def test_a_missing_snapshot_is_one_line_naming_the_dataset_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(hub.DATASETS_DIR_ENV, str(tmp_path))
    with pytest.raises(UserError) as err:
        tasks.get_task("ontonotes").production()
    message = str(err.value)
    assert hub.ONTONOTES in message and "--revision refs/convert/parquet" in message and "\n" not in message
    with pytest.raises(UserError) as err:
        tasks.get_task("record").production()
    message = str(err.value)
    assert "aps/super_glue" in message and "--revision" not in message and "\n" not in message


def test_an_unknown_config_is_one_line_naming_the_dataset(hub_dir):
    with pytest.raises(UserError) as err:
        hub._hub(hub.GLUE, "sst3", "train")
    message = str(err.value)
    assert "nyu-mll/glue" in message and "sst3" in message and "\n" not in message
    with pytest.raises(UserError, match="aps/super_glue"):
        hub._hub(hub.SUPER_GLUE, "recordz", "train")
