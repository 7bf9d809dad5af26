"""Fine-tuning tasks and their scores: the registry, the paper's splits, the derived offline tasks, every metric
against hand-computed values, and BM25 on real and toy data. No model, no Ray."""

from __future__ import annotations

import math

import pytest

from raybiphase.errors import UserError
from raybiphase.finetune import scoring, tasks

# ------------------------------------------------------------------------------------------------ registry


def test_unknown_task_is_one_line_naming_it_and_the_known_ones():
    with pytest.raises(UserError) as err:
        tasks.get_task("sst3")
    message = str(err.value)
    assert "'sst3'" in message and "tweets" in message and "squad_retrieval" in message and "\n" not in message


def test_registry_covers_the_four_families_offline_and_the_papers_datasets_in_production():
    offline = {name: tasks.get_task(name) for name in tasks.OFFLINE_TASKS}
    assert set(offline) == {"tweets", "wiki_topics", "qnli", "squad_shuffle", "squad_bio", "squad_commas", "squad",
                            "squad_sentence", "squad_retrieval", "wiki_retrieval"}
    assert {t.family for t in offline.values()} == {"SC", "TC", "QA", "IR"}
    assert offline["tweets"].num_labels == 3 and offline["wiki_topics"].num_labels == 11
    assert offline["squad"].num_labels == 2 and offline["squad_bio"].label_names == ("O", "B-ANS", "I-ANS")
    for name in ("sst2", "mnli", "qqp", "conll2003", "ontonotes", "uner", "squad", "squad_v2", "record", "msmarco",
                 "nq", "mldr"):  # read from snapshots in test_production_loaders.py
        assert tasks.get_task(name).production is not None


# ------------------------------------------------------------------------------------------------ splits


def test_validation_is_5_percent_with_seed_42_exactly_as_datasets_draws_it():
    import datasets

    records = list(range(1234))
    train, val = tasks.split_validation(records)
    reference = datasets.Dataset.from_dict({"i": records}).train_test_split(test_size=0.05, seed=42)
    assert val == reference["test"]["i"] and train == reference["train"]["i"]
    assert len(val) == 62 and not set(train) & set(val) and sorted(train + val) == records


def test_tweets_splits_are_disjoint_by_text_and_capped(offline_cache):
    full = tasks.load_splits(tasks.get_task("tweets"))
    train_texts, test_texts = {r["text"] for r in full.train + full.val}, {r["text"] for r in full.test}
    assert not train_texts & test_texts  # duplicate tweets never straddle train and test
    assert 0.17 < len(full.test) / (len(full.train) + len(full.val) + len(full.test)) < 0.23
    assert len(full.val) == math.ceil(0.05 * (len(full.train) + len(full.val)))
    capped = tasks.load_splits(tasks.get_task("tweets"), max_examples=50)
    assert (len(capped.train), len(capped.val), len(capped.test)) == (50, 50, 50)
    assert capped.train == full.train[:50] and capped.val == full.val[:50]
    assert all(r in full.test for r in capped.test[:5])


def test_squad_test_split_is_the_official_dev_set(offline_cache):
    splits = tasks.load_splits(tasks.get_task("squad"), max_examples=40)
    from raybiphase.data import sources

    dev_ids = [r["id"] for r in sources.squad("dev")]
    test_ids = [r["id"] for r in splits.test]
    assert set(test_ids) <= set(dev_ids) and test_ids == sorted(test_ids, key=dev_ids.index)
    assert not {r["id"] for r in splits.train + splits.val} & set(dev_ids)


def test_capped_retrieval_keeps_every_positive_and_a_bounded_corpus(offline_cache):
    splits = tasks.load_splits(tasks.get_task("wiki_retrieval"), max_examples=30)
    for rset in (splits.val, splits.test):
        pids = {p["pid"] for p in rset["passages"]}
        assert len(rset["queries"]) == 30 and all(q["positives"][0] in pids for q in rset["queries"])
        assert len(pids) <= tasks.IR_CORPUS_PER_QUERY * 30
    assert len(splits.train) == 30 and {"query", "passage", "pid"} <= set(splits.train[0])
    test_titles = {q["positives"][0] for q in tasks.load_splits(tasks.get_task("wiki_retrieval")).test["queries"]}
    assert all(tasks.in_test_split(t) for t in test_titles)


@pytest.mark.slow  # loads every offline task's splits twice
def test_eval_cap_bounds_validation_and_test_but_not_training(offline_cache):
    sc = tasks.load_splits(tasks.get_task("squad_shuffle"), max_examples=120, max_eval_examples=40)
    assert (len(sc.train), len(sc.val), len(sc.test)) == (120, 40, 40)
    assert sc.test == tasks.load_splits(tasks.get_task("squad_shuffle"), max_examples=40).test  # the same seeded draw
    ir = tasks.load_splits(tasks.get_task("squad_retrieval"), max_examples=120, max_eval_examples=40)
    assert len(ir.train) == 120 and len(ir.val["queries"]) == len(ir.test["queries"]) == 40
    assert len(ir.test["passages"]) <= tasks.IR_CORPUS_PER_QUERY * 40


def test_bio_tags_follow_the_answer_spans_sentence_by_sentence():
    context = "Paris is the capital of France. It lies on the Seine river."
    answers = [("Paris", 0), ("capital of France", 13), ("the capital", 9), ("Seine", 47)]
    records = [{"context": context, "answers": {"text": [t], "answer_start": [s]}} for t, s in answers]
    examples = [tasks.tag_sentence(s) for s in tasks.bio_sentences(records)]
    assert examples[0]["words"] == ["Paris", "is", "the", "capital", "of", "France."]
    # "the capital" (9) starts before "capital of France" (13) and overlaps it: the earlier span is kept
    assert examples[0]["tags"] == ["B-ANS", "O", "B-ANS", "I-ANS", "O", "O"]
    assert examples[1]["tags"] == ["O", "O", "O", "O", "B-ANS", "O"]


def test_comma_restoration_removes_each_words_trailing_comma_and_tags_it():
    context = 'In 1990, the band "Queen," then (a trio, mostly) played. It rained, again , twice.'
    examples = [tasks.tag_commas(r) for r in tasks.sentence_records([context])]
    assert examples[0] == {"words": ["In", "1990", "the", "band", '"Queen"', "then", "(a", "trio", "mostly)", "played."],
                           "tags": ["O", "B-COMMA", "O", "O", "B-COMMA", "O", "O", "B-COMMA", "O", "O"]}
    # a comma standing alone is a word of its own, left as it is
    assert examples[1] == {"words": ["It", "rained", "again", ",", "twice."], "tags": ["O", "B-COMMA", "O", "O", "O"]}


def test_squad_commas_splits_are_train_and_dev_paragraphs(offline_cache):
    from raybiphase.data import sources

    splits = tasks.load_splits(tasks.get_task("squad_commas"), max_examples=200)
    dev_words = {" ".join(tasks.tag_commas(r)["words"]) for r in tasks.sentence_records(sources.squad_contexts("dev"))}
    assert len(splits.test) == 200 and all(" ".join(r["words"]) in dev_words for r in splits.test)
    tags = [t for r in splits.test for t in r["tags"]]
    assert 0.03 < tags.count("B-COMMA") / len(tags) < 0.10 and not any("," == w[-1:] for r in splits.test for w in r["words"] if len(w) > 1)


def test_word_order_task_shuffles_the_inner_words_of_half_the_sentences():
    context = ("Short one here. The river that crosses the old city floods every spring after the snow melts. "
               "A committee of nine members elects the mayor of the town every four years. It rained.")
    records = tasks.shuffle_sentences([context])
    assert [r["sentence"].split()[0] for r in records] == ["The", "A"]  # under SHUFFLE_MIN_WORDS words: left out
    many = [tasks.shuffle_words({"sentence": f"Word {i} one two three four five six seven end."}) for i in range(400)]
    shuffled = [r for r in many if r["label"] == tasks.SHUFFLE_LABELS.index("shuffled")]
    assert 0.4 < len(shuffled) / len(many) < 0.6  # balanced by the hash
    for example, i in zip(many, range(400)):
        words, original = example["text"].split(), f"Word {i} one two three four five six seven end.".split()
        assert sorted(words) == sorted(original) and words[0] == "Word" and words[-1] == "end."  # same bag, ends kept
        assert (words != original) == (example["label"] == 1) and example["text_pair"] is None
    assert tasks.shuffle_words({"sentence": context[16:84]}) == tasks.shuffle_words({"sentence": context[16:84]})


def test_squad_shuffle_tests_on_dev_sentences(offline_cache):
    from raybiphase.data import sources

    splits = tasks.load_splits(tasks.get_task("squad_shuffle"), max_examples=300)
    dev_bags = {tuple(sorted(r["sentence"].split())) for r in tasks.shuffle_sentences(sources.squad_contexts("dev"))}
    assert len(splits.test) == 300 and all(tuple(sorted(r["text"].split())) in dev_bags for r in splits.test)
    assert 0.4 < sum(r["label"] for r in splits.train) / len(splits.train) < 0.6


def test_answer_sentences_cut_each_context_to_its_answers_sentence():
    context = "Paris is the capital of France. It lies on the Seine river. Its mayor is elected."
    records = [{"id": "a", "question": "Which river?", "context": context,
                "answers": {"text": ["Seine", "the Seine river", "France. It"], "answer_start": [47, 43, 24]}},
               {"id": "b", "question": "Across?", "context": context, "answers": {"text": ["France. It"], "answer_start": [24]}},
               {"id": "c", "question": "None?", "context": context, "answers": {"text": [], "answer_start": []}}]
    out = tasks.answer_sentences(records)
    assert [r["id"] for r in out] == ["a"]  # b's answer crosses a sentence boundary, c has none
    assert out[0]["context"] == "It lies on the Seine river."
    assert out[0]["answers"] == {"text": ["Seine", "the Seine river"], "answer_start": [15, 11]}
    assert all(out[0]["context"][s:s + len(t)] == t for t, s in zip(out[0]["answers"]["text"], out[0]["answers"]["answer_start"]))


@pytest.mark.slow  # every answer of the task checked against its sentence
def test_squad_sentence_answers_are_spans_of_their_sentences(offline_cache):
    from raybiphase.data import sources

    splits = tasks.load_splits(tasks.get_task("squad_sentence"), max_examples=300)
    dev = {r["id"]: r for r in sources.squad("dev")}
    for rec in splits.test:
        assert rec["context"] in dev[rec["id"]]["context"]
        assert all(rec["context"][s:s + len(t)] == t for t, s in zip(rec["answers"]["text"], rec["answers"]["answer_start"]))
    assert not {r["id"] for r in splits.train + splits.val} & set(dev)
    assert len(tasks.answer_sentences(sources.squad("dev"))) > 0.99 * len(dev)


# ------------------------------------------------------------------------------------------------ scores


def test_squad_normalisation_exact_match_and_f1_by_hand():
    assert scoring.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert scoring.squad_exact_match("the Eiffel Tower", ["Eiffel Tower", "tower"]) == 1.0
    # prediction "eiffel tower in paris" vs gold "eiffel tower": 2 common, P = 2/4, R = 1 -> F1 = 2/3
    assert scoring.squad_f1("Eiffel Tower in Paris", ["Eiffel Tower"]) == pytest.approx(2 / 3)
    assert scoring.squad_f1("Paris", ["Eiffel Tower", "Paris, France"]) == pytest.approx(2 / 3)  # best gold
    assert scoring.squad_f1("a", ["the"]) == 0.0  # both normalise to nothing: no common token
    assert scoring.squad_f1("", []) == 1.0 and scoring.squad_exact_match("x", []) == 0.0  # SQuAD v2 no-answer


def test_entity_f1_by_hand():
    gold = ["B-PER", "I-PER", "O", "B-LOC", "O"]
    pred = ["B-PER", "I-PER", "O", "B-ORG", "B-LOC"]
    assert scoring.bio_entities(gold) == {("PER", 0, 2), ("LOC", 3, 4)}
    assert scoring.entity_counts(pred, gold) == [1, 3, 2]  # P = 1/3, R = 1/2 -> F1 = 0.4
    assert scoring.entity_f1([[1, 3, 2]]) == pytest.approx(0.4)
    assert scoring.bio_entities(["I-PER", "I-PER", "I-LOC", "B-LOC", "I-LOC"]) == {("PER", 0, 2), ("LOC", 2, 3),
                                                                                  ("LOC", 3, 5)}
    assert scoring.entity_counts(["B-X", "O"], ["B-X", "I-X"]) == [0, 1, 1]  # a wrong end is wrong
    # micro, not macro: (1 + 0) true positives over (1 + 3) predicted and (1 + 1) gold
    assert scoring.entity_f1([[1, 1, 1], [0, 3, 1]]) == pytest.approx(2 * (1 / 4) * (1 / 2) / (1 / 4 + 1 / 2))
    assert scoring.entity_f1([]) == 0.0 and scoring.corpus_score("entity_f1", [[1, 3, 2]]) == pytest.approx(0.4)


def test_entity_f1_agrees_with_seqeval_when_installed():
    seqeval = pytest.importorskip("seqeval.metrics")
    import random

    rng, tags = random.Random(0), ["O", "B-A", "I-A", "B-B", "I-B"]
    gold = [[rng.choice(tags) for _ in range(12)] for _ in range(200)]
    pred = [[rng.choice(tags) for _ in range(12)] for _ in range(200)]
    ours = scoring.entity_f1([scoring.entity_counts(p, g) for p, g in zip(pred, gold)])
    assert ours == pytest.approx(seqeval.f1_score(gold, pred))


def test_ndcg_and_mrr_at_10_by_hand():
    ranked = ["d3", "d1", "d7"]
    assert scoring.mrr_at_k(ranked, {"d1"}) == 0.5
    assert scoring.ndcg_at_k(ranked, {"d1"}) == pytest.approx(1 / math.log2(3))
    # two relevant at ranks 1 and 3: DCG = 1 + 1/log2(4) = 1.5, IDCG = 1 + 1/log2(3)
    assert scoring.ndcg_at_k(ranked, {"d3", "d7"}) == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    late = [f"x{i}" for i in range(10)] + ["d1"]
    assert scoring.ndcg_at_k(late, {"d1"}) == 0.0 and scoring.mrr_at_k(late, {"d1"}) == 0.0


def test_bm25_ranks_the_passage_that_shares_the_rare_words_first():
    passages = ["The cat sat on the mat.", "Photosynthesis turns light into chemical energy in plants.",
                "The dog chased the cat around the garden."]
    pids = ["cat", "plants", "dog"]
    queries = ["How do plants make energy from light?", "what did the dog chase"]
    rankings = scoring.bm25_rankings(queries, passages, pids)
    assert rankings[0][0] == "plants" and rankings[1][0] == "dog"
    # a term in every passage weighs less than a term in one: "the" cannot outrank "mat"
    assert scoring.bm25_rankings(["the the the mat"], passages, pids)[0][0] == "cat"


def test_bm25_stems_and_drops_stopwords():
    passages = ["A runner runs every morning.", "Cats sleep all day.", "It is what it is, and that is that."]
    pids = ["run", "cat", "stop"]
    # "running" and "runs" share the stem "run"; "cat" matches "Cats"; stopwords alone match nothing
    assert scoring.bm25_rankings(["running"], passages, pids)[0][0] == "run"
    assert scoring.bm25_rankings(["cat"], passages, pids)[0][0] == "cat"
    assert not scoring.bm25_scores(["it is that"], passages).any()  # Lucene's English stopword list


def test_bm25_scores_are_lucenes_formula():
    passages = ["apple banana apple", "banana cherry", "cherry date elderberry fig"]
    k1, b = scoring.BM25_K1, scoring.BM25_B
    lengths = [3, 2, 4]
    avg = sum(lengths) / 3

    def term(tf, df, length):  # Lucene: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf saturation without (k1 + 1)
        return math.log(1 + (3 - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * length / avg))

    (got,) = scoring.bm25_scores(["apple cherry"], passages)
    expected = [term(2, 1, 3), term(1, 2, 2), term(1, 2, 4)]
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("block", [1, 3, 7, 100])
def test_bm25_ranks_a_block_of_queries_at_a_time_exactly_as_the_full_matrix(block, monkeypatch):
    """Ties included (a query of stopwords only, a term every passage holds), the blocked ranking is the stable
    argsort of the whole queries x passages matrix, and no score array it makes holds more than `block` queries."""
    words = ["cat", "dog", "mat", "sun", "moon", "tree", "river", "stone"]
    passages = [" ".join(words[(i * j) % 8] for j in range(1, 2 + i % 5)) for i in range(40)] + ["the a of"] * 3
    pids = [f"p{i}" for i in range(len(passages))]
    queries = [f"{words[i % 8]} {words[(3 * i) % 8]}" for i in range(17)] + ["it is that", "cat", "cat"]
    full = scoring.rank_by_scores(scoring.bm25_scores(queries, passages), pids, 12)
    rows, widest = scoring._bm25_rows, []
    monkeypatch.setattr(scoring, "_bm25_rows", lambda *a: widest.append(len(a[1])) or rows(*a))
    assert scoring.bm25_rankings(queries, passages, pids, 12, block=block) == full
    assert max(widest) == min(block, len(queries)) and sum(widest) == len(queries)
    # stopwords only: every passage scores 0, and the ties go to the lower passage index
    assert scoring.bm25_rankings(["it is that"], passages, pids, 3, block=block) == [["p0", "p1", "p2"]]


# ------------------------------------------------------------------------------------------------ pair templates


class _CharTokenizer:
    """One id per character, bos 1, eos 2, pad 0: a head's input ids spell out the text it reads. It writes no
    special tokens of its own, asked or not (a raybiphase export's pre-framing tokenizer): the heads frame its text
    with its bos and eos (heads.base, `encoders.special_template`)."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __call__(self, text: str, pair: str | None = None, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(ch) for ch in text + (pair or "")]}


@pytest.mark.parametrize("task, expected", [
    ("mnli", "Premise: A man sleeps.\nHypothesis: He is awake."),          # EncodEval's mnli_m()
    ("qqp", "Question 1: A man sleeps.\nQuestion 2: He is awake."),        # EncodEval's qqp()
    ("qnli", "Question: A man sleeps.\nSentence: He is awake."),           # ours, in their style
])
def test_a_sentence_pair_is_one_text_in_its_tasks_template(task, expected):
    from raybiphase.finetune.heads import head_for

    record = {"text": "A man sleeps.", "text_pair": "He is awake.", "label": 1}
    spec = tasks.get_task(task)
    assert spec.input_text(record) == expected
    head = head_for(spec, _CharTokenizer(), max_len=64)
    ((ids, label),) = head.train_units([record])
    assert ids == [1, *map(ord, expected), 2] and label == 1  # one text between bos and eos: no eos between the two
    ((short, _),) = head_for(spec, _CharTokenizer(), max_len=12).train_units([record])
    assert short == [1, *map(ord, expected[:10]), 2]  # too long: the end is trimmed, as the authors truncate


def test_every_pair_task_has_a_template_and_single_texts_stay_as_they_are():
    assert {name for name, task in tasks.TASKS.items() if task.template} == {"qnli", "mnli", "qqp"}
    assert tasks.get_task("sst2").input_text({"text": "lovely", "text_pair": None, "label": 1}) == "lovely"
    with pytest.raises(ValueError, match="sst2"):
        tasks.get_task("sst2").input_text({"text": "a", "text_pair": "b", "label": 1})


@pytest.mark.slow  # BM25 over the task's corpus
def test_bm25_baseline_on_squad_retrieval_is_strong(offline_cache):
    from raybiphase.finetune.baselines import bm25_baseline

    row = bm25_baseline("squad_retrieval", max_examples=200)
    assert row["metric"] == "ndcg@10" and len(row["test_per_example"]) == 200
    assert row["test_secondary"] > 0.7 and row["test_score"] > 0.7  # open-SQuAD BM25 MRR@10 is about 0.8
