"""How many inputs each task's training and evaluations read, without loading any data: what the dry run prices
fine-tuning by.

    evaluation_inputs("msmarco")                     # (23677, 16740): one validation, one test evaluation
    evaluation_inputs("squad_retrieval", cap=800)    # capped as finetune.max_eval_examples caps the splits

An input is an example (SC, TC: a sentence; QA: a question, counted as one window), or for retrieval a query or a
passage of the split's corpus. The offline tasks' sizes are their splits' (tests check some against
`tasks.load_splits`); the hub's are the datasets' stated sizes, and for retrieval the queries its qrels judge plus
one passage per judged qrels line (at least the judged passages, the corpus of the authors' protocol; MS MARCO's
splits share one corpus, so each counts both qrels splits' lines), or the whole collection under
finetune.ir_corpus "full". Validation of the hub's SC, TC and QA tasks is 5% of their train split.
"""

from __future__ import annotations

import math

from raybiphase.finetune.tasks import IR_CORPUS_PER_QUERY, VALIDATION_SHARE, get_task

Split = tuple[int, int]
"""(examples or queries, corpus passages: 0 outside retrieval) of one split."""


def _held_out(train: int) -> int:
    return math.ceil(VALIDATION_SHARE * train)


SPLITS: dict[str, tuple[Split, Split]] = {
    # offline: the splits tasks.load_splits makes
    "tweets": ((1529, 0), (7584, 0)),
    "wiki_topics": ((110, 0), (522, 0)),
    "qnli": ((18739, 0), (52151, 0)),
    "squad_shuffle": ((4025, 0), (9888, 0)),
    "squad_bio": ((4117, 0), (10107, 0)),
    "squad_commas": ((4117, 0), (10107, 0)),
    "squad": ((3949, 0), (10570, 0)),
    "squad_sentence": ((3944, 0), (10559, 0)),
    "squad_retrieval": ((3949, 886), (10570, 2067)),
    "wiki_retrieval": ((118, 3018), (620, 3018)),
    # the hub's: validation = 5% of the stated train split, test = the stated evaluation split
    "sst2": ((_held_out(67349), 0), (872, 0)),
    "mnli": ((_held_out(392702), 0), (9815, 0)),
    "qqp": ((_held_out(363846), 0), (40430, 0)),
    "conll2003": ((_held_out(14041), 0), (3250, 0)),
    "ontonotes": ((_held_out(75187), 0), (9603, 0)),
    "uner": ((_held_out(12543), 0), (2001, 0)),
    "squad_v2": ((_held_out(130319), 0), (11873, 0)),
    "record": ((_held_out(100730), 0), (10000, 0)),
    # retrieval (hub): dev 6,980 queries / 7,437 qrels lines and TREC-DL 2019 43 / 9,260 over one corpus; NQ's
    # 3,452 test queries (4,201 qrels lines) halved; MLDR English dev 200 and test 800 queries, one positive each
    "msmarco": ((6980, 7437 + 9260), (43, 7437 + 9260)),
    "nq": ((1726, 4201), (1726, 4201)),
    "mldr": ((200, 1000), (800, 1000)),
}
TRAIN: dict[str, int] = {
    # offline: the training split tasks.load_splits makes (questions for QA, pairs for retrieval)
    "tweets": 29045, "wiki_topics": 2071, "qnli": 414324, "squad_shuffle": 84547, "squad_bio": 86517,
    "squad_commas": 86517, "squad": 83650, "squad_sentence": 83545, "squad_retrieval": 83650, "wiki_retrieval": 2231,
    # the hub's: the stated train split less its 5% validation; msmarco: its train qrels' 502,939 queries, each
    # with its first relevant passage (nq and mldr train on these pairs)
    "sst2": 67349 - _held_out(67349), "mnli": 392702 - _held_out(392702), "qqp": 363846 - _held_out(363846),
    "conll2003": 14041 - _held_out(14041), "ontonotes": 75187 - _held_out(75187), "uner": 12543 - _held_out(12543),
    "squad_v2": 130319 - _held_out(130319), "record": 100730 - _held_out(100730), "msmarco": 502939,
}
"""Training examples of a task that trains (tasks with a `train_task` train on that task's)."""
COLLECTIONS = {"msmarco": 8841823, "nq": 2681468, "mldr": 200000}
"""Passages of the whole collections a hub retrieval task ranks under finetune.ir_corpus "full"."""


def training_examples(name: str, cap: int = 0) -> int:
    """Examples one epoch of task `name`'s training reads (its `train_task`'s when it has one), at most `cap`
    (finetune.max_examples; 0: none): what caps a trial's steps at one epoch."""
    examples = TRAIN[get_task(name).train_task or name]
    return min(examples, cap) if cap else examples


def evaluation_splits(name: str, cap: int = 0, ir_corpus: str = "judged") -> tuple[Split, Split]:
    """(examples or queries, corpus passages) of one validation and one test evaluation of task `name`, capped at
    `cap` examples or queries (0: none) the way `tasks.load_splits` caps them (a capped retrieval corpus:
    IR_CORPUS_PER_QUERY passages per query kept)."""
    task = get_task(name)
    out = []
    for examples, passages in SPLITS[name]:
        if task.family == "IR" and ir_corpus == "full" and name in COLLECTIONS:
            passages = COLLECTIONS[name]
        if cap:
            examples = min(examples, cap)
            passages = min(passages, IR_CORPUS_PER_QUERY * examples) if passages else 0
        out.append((examples, passages))
    return out[0], out[1]


def evaluation_inputs(name: str, cap: int = 0, ir_corpus: str = "judged") -> tuple[int, int]:
    """Inputs one validation and one test evaluation of task `name` encode (`evaluation_splits`, added up)."""
    validation, test = evaluation_splits(name, cap, ir_corpus)
    return sum(validation), sum(test)
