"""The pretraining framing carried by an exported tokenizer: `<bos> text <eos>`, as data preparation packs
documents (raybiphase.data.prepare.pack) and the fine-tuning heads frame their inputs, so a user of the stock
`AutoTokenizer` feeds an exported model what it was trained on."""

from __future__ import annotations

import itertools


def frame_like_pretraining(tok):
    """`tok` (a fast tokenizer) made to add, when called with its defaults, the special tokens pretraining puts around a
    document (`pack`): `<bos> text <eos>` for one text, the fine-tuning heads' framing
    (raybiphase.finetune.heads.base), and `<bos> A <eos> B <eos>` for a pair. An export carries it, so a stock
    `AutoTokenizer` user (an evaluation harness) feeds the model inputs framed as it was trained on. The
    post-processor lives in tokenizer.json; the add_bos_token / add_eos_token flags are left unset, as transformers
    rebuilds a template from them on load, one that puts a second `<bos>` before B. Processors that only adjust
    offsets (byte-level) are kept, so ids and offsets asked for with `add_special_tokens=False`, as data preparation
    and the heads ask, stay exactly what they were."""
    from tokenizers import processors

    backend, bos, eos = tok.backend_tokenizer, tok.bos_token, tok.eos_token
    framing = (processors.TemplateProcessing, processors.BertProcessing, processors.RobertaProcessing)
    kept = [part for part in _processors(backend.post_processor) if not isinstance(part, framing)]
    template = processors.TemplateProcessing(single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B {eos}",
                                             special_tokens=[(bos, tok.bos_token_id), (eos, tok.eos_token_id)])
    backend.post_processor = processors.Sequence([*kept, template])
    return tok


def _processors(processor) -> list:
    """The parts of a post-processor: a Sequence's members in order, else the processor itself (none for None)."""
    from tokenizers import processors

    if not isinstance(processor, processors.Sequence):
        return [] if processor is None else [processor]
    parts = []
    for index in itertools.count():
        try:
            parts.append(processor[index])
        except IndexError:  # a Sequence has no len(): its end is the first missing index
            return parts
