"""A hub corpus is decontaminated at prepare time against the tasks' evaluation text, read by the production loaders
from snapshots in the hub's layout: exactly the planted documents are dropped, the manifest counts them per task,
and the dry run says so. SQuAD is held out by article. In process, no Ray, no network."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import ClassLabel, Features, Value

from raybiphase.config import DataConfig, SweepSpec, from_dict
from raybiphase.data import pieces
from raybiphase.data.prepare import TOKENIZER_DIR, prepare
from raybiphase.data.stream import MANIFEST, open_dataset
from raybiphase.finetune import hub, tasks
from raybiphase.finetune.heldout import evaluation_texts
from raybiphase.planning.plan import make_plan
from raybiphase.pretrain.budget import budget_lines, data_budget
from tests.finetune.test_production_loaders import SQUAD, _card, _retrieval, _sharded

LONG = "the film is a quietly moving portrait of a family coming apart at the seams over one long summer"
SHORT = "an uneven but often hilarious comedy about grief"  # 8 words: matched whole
PARAGRAPHS = {  # SQuAD v2 train: two articles; the validation draw picks one question, so one article is evaluated
    "Alpha": ["Alpha was founded by fishermen who settled on the northern bank of the river in the twelfth century.",
              "The harbour of Alpha silted up after the great flood, and its trade moved to the towns downstream."],
    "Beta": ["Beta is a mountain village known for its slate quarries, which supplied roofs across the whole region."],
}
DEV = "Gamma hosts a festival each spring where boats decorated with lanterns drift slowly down the canal at night."


def _snapshots(root: Path) -> None:
    glue = root / hub.GLUE
    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"]),
                         "idx": Value("int32")})
    train = [{"sentence": f"plain training phrase number {i}", "label": i % 2, "idx": i} for i in range(20)]
    validation = [{"sentence": s, "label": 1, "idx": i} for i, s in enumerate([LONG, SHORT, "lovely"])]
    _card(glue, {"sst2": _sharded(glue, "sst2", {"train": train, "validation": validation}, features)})
    squad = root / "rajpurkar/squad_v2"
    rows = [{"id": f"{title}-{i}", "title": title, "context": text, "question": f"What about {title} {i}?",
             "answers": {"text": [], "answer_start": []}}
            for title, texts in PARAGRAPHS.items() for i, text in enumerate(texts)]
    dev = [{"id": "g", "title": "Gamma", "context": DEV, "question": "When is the festival?",
            "answers": {"text": ["each spring"], "answer_start": [DEV.index("each spring")]}}]
    _card(squad, {"squad_v2": _sharded(squad, "squad_v2", {"train": rows, "validation": dev}, SQUAD)})
    _retrieval(root)  # mteb/msmarco: passages "passage i about topic i", train queries 100-102, dev query 200


@pytest.fixture
def hub_dir(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hub"
    _snapshots(root)
    monkeypatch.setenv(hub.DATASETS_DIR_ENV, str(root))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    return root


def evaluated_article() -> str:
    """The article of the one train question SQuAD v2's validation draw takes (tasks.split_validation)."""
    _, validation = tasks.split_validation([r for title, texts in PARAGRAPHS.items() for r in [title] * len(texts)])
    return validation[0]


def test_squad_is_held_out_by_article_and_ir_by_its_judged_passages(hub_dir):
    article = evaluated_article()
    texts = set(evaluation_texts("squad_v2"))
    assert set(PARAGRAPHS[article]) <= texts and DEV in texts  # every paragraph of the evaluated article
    other = next(title for title in PARAGRAPHS if title != article)
    assert not set(PARAGRAPHS[other]) & texts
    assert set(evaluation_texts("sst2")) == {LONG, SHORT, "lovely", *drawn_sst2()}
    # validation: the dev qrels' queries and relevant passages; test: TREC-DL 2019's (301 judges nothing relevant)
    assert set(evaluation_texts("msmarco")) == {"what is topic 200", "passage 4 about topic 4", "what is topic 201",
                                                 "passage 6 about topic 6", "what is topic 300",
                                                 "passage 3 about topic 3", "passage 8 about topic 8"}


def drawn_sst2() -> list[str]:
    """The SST-2 train sentences the validation draw takes (5% of 20: one)."""
    return tasks.split_validation([f"plain training phrase number {i}" for i in range(20)])[1]


def _corpus(root: Path) -> tuple[Path, dict[str, str]]:
    """A corpus in the hub's layout (data/train-0000k-of-00002.parquet): filler and planted documents, each with a
    marker word that shows whether it reached the shards."""
    article = evaluated_article()
    other = next(title for title in PARAGRAPHS if title != article)
    last = PARAGRAPHS[article][-1]
    planted = {
        "zqlong": f"Review roundup. {LONG.upper()}, said the critic.",  # a 13-gram, case and punctuation aside
        "zqshort": f"One line: {SHORT.capitalize()}!",  # a short evaluation sentence whole
        "zqarticle": f"From the archive: {last}",  # a paragraph of the evaluated article that is not itself asked about
        "zqboth": f"{' '.join(LONG.split()[:13])} and {DEV}",  # sst2 and squad_v2 at once
    }
    kept = {
        "zqtwelve": " ".join(LONG.split()[:12]) + " and then something else entirely",  # 12 words in a row
        "zqtiny": "It was lovely weather for it.",  # a 1-word evaluation text is not looked for
        "zqother": f"Elsewhere: {PARAGRAPHS[other][0]}",  # an article nobody evaluates on
    }
    documents = [f"filler document {i} describes ordinary things like gardens rivers and markets {i % 7}"
                 for i in range(240)]
    for k, (marker, text) in enumerate({**planted, **kept}.items()):
        documents.insert(30 * k + 5, f"{marker} {text}")
    repo = root / "org--corpus"
    (repo / "data").mkdir(parents=True)
    half = len(documents) // 2
    for shard, part in enumerate((documents[:half], documents[half:])):
        pq.write_table(pa.table({"text": part, "id": list(range(len(part)))}),
                       repo / "data" / f"train-{shard:05d}-of-00002.parquet")
    return repo, {**planted, **kept}


def test_prepare_drops_exactly_the_planted_documents_and_counts_them_per_task(hub_dir, tmp_path, monkeypatch):
    repo, markers = _corpus(tmp_path)
    monkeypatch.setattr(pieces, "_hf_stream", lambda data: datasets.load_dataset(str(repo), split="train",
                                                                                  streaming=True))
    data = DataConfig(source="org/corpus", vocab_size=512, seq_len=32, val_blocks=2, shard_rows=64,
                      piece_documents=50, decontam_tasks=("sst2", "squad_v2"), dir=str(tmp_path / "shards"))
    out = prepare(data, quiet=True, on_ray=False, evaluation_texts=evaluation_texts)

    from transformers import AutoTokenizer

    open_dataset(out, seq_len=32)  # a dataset training can read
    tokenizer = AutoTokenizer.from_pretrained(str(Path(out) / TOKENIZER_DIR))
    meta = json.loads((Path(out) / MANIFEST).read_text())
    blocks = [block for name in [s["file"] for s in meta["shards"]] + ["val.parquet"]
              for block in pq.read_table(Path(out) / name).column("input_ids").to_pylist()]
    text = tokenizer.decode([t for block in blocks for t in block])
    reached = {marker for marker in markers if marker in text}
    assert reached == {"zqtwelve", "zqtiny", "zqother"}  # exactly the planted ones are gone

    def tokens(marker: str) -> int:
        return len(tokenizer(f"{marker} {markers[marker]}", add_special_tokens=False)["input_ids"]) + 2
    record = meta["decontamination"]
    assert record["tasks"] == ["squad_v2", "sst2"] and record["ngram"] == 13
    assert record["dropped"] == {
        "documents": 4, "tokens": sum(tokens(m) for m in ("zqlong", "zqshort", "zqarticle", "zqboth")),
        "per_task": {"sst2": {"documents": 3, "tokens": sum(tokens(m) for m in ("zqlong", "zqshort", "zqboth"))},
                     "squad_v2": {"documents": 2, "tokens": tokens("zqarticle") + tokens("zqboth")}}}
    assert meta["documents"] == 240 + 3  # what reached the shards: the filler and the three kept

    spec = from_dict(SweepSpec, {"data": {**_plain(data), "dir": out}, "phases": {"steps": 2},
                                 "optim": {"warmup_steps": 0, "decay_steps": 0},
                                 "train": {"global_batch_tokens": 32 * 8 * 2}, "finetune": {"tasks": ["sst2"]}})
    assert spec.run.data.decontam_tasks == ("sst2", "squad_v2")  # named in data: kept over finetune.tasks
    lines = budget_lines(data_budget(make_plan(spec), spec))
    assert lines[1] == ("  decontamination: 2 task(s) held out by 13-grams (squad_v2, sst2): dropped 4 documents "
                        f"({record['dropped']['tokens']:,} tokens); per task: squad_v2 2 "
                        f"({record['dropped']['per_task']['squad_v2']['tokens']:,} tokens), sst2 3 "
                        f"({record['dropped']['per_task']['sst2']['tokens']:,} tokens)")
    fresh = from_dict(SweepSpec, {"data": {**_plain(data), "dir": str(tmp_path / "elsewhere")},
                                  "finetune": {"tasks": ["sst2"]}, "phases": {"steps": 2},
                                  "optim": {"warmup_steps": 0, "decay_steps": 0}})
    assert budget_lines(data_budget(make_plan(fresh), fresh))[1].endswith("counts: not prepared yet")


def _plain(data: DataConfig) -> dict:
    return {k: v for k, v in vars(data).items() if k != "dir"} | {"decontam_tasks": list(data.decontam_tasks)}
