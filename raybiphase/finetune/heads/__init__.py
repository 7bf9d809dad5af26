"""Task heads, one module per family: what sits on the encoder, its inputs, loss and evaluation.

    head = head_for(task, tokenizer, max_len=128)
    model = head.load_model(hf_dir)                  # EuroBertFor{Sequence,Token}Classification, EuroBertModel,
                                                     # or any other AutoModel under the same head
    units = head.train_units(splits.train)           # tokenized training units
    loss = head.loss(model, units[:32])
    result = head.evaluate(model, head.prepare_eval(splits.val))   # Evaluation(score, per_example, secondary)
"""

from __future__ import annotations

from raybiphase.config.sweep import TcLabels
from raybiphase.finetune.heads.base import Head
from raybiphase.finetune.heads.ir import RetrievalHead
from raybiphase.finetune.heads.qa import QuestionAnsweringHead
from raybiphase.finetune.heads.sc import SequenceClassificationHead
from raybiphase.finetune.heads.tc import TokenClassificationHead
from raybiphase.finetune.tasks import Task

HEADS: dict[str, type[Head]] = {"SC": SequenceClassificationHead, "TC": TokenClassificationHead,
                                "QA": QuestionAnsweringHead, "IR": RetrievalHead}


def head_for(task: Task, tokenizer, max_len: int, *, tc_labels: TcLabels = "all_subtokens",
             trust_remote_code: bool = False) -> Head:
    """The head of the task's family, reading inputs of at most `max_len` tokens; a TC head labels words by
    `tc_labels` (finetune.tc_labels); the model's own code runs only with `trust_remote_code`."""
    if task.family == "TC":
        return TokenClassificationHead(task, tokenizer, max_len, labels=tc_labels, trust_remote_code=trust_remote_code)
    return HEADS[task.family](task, tokenizer, max_len, trust_remote_code=trust_remote_code)
