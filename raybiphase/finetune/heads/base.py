"""The interface every task head implements, and what heads share: inputs from token ids, padding, loading.

Inputs are built from token ids, so any tokenizer works the same way: the special tokens the tokenizer itself
writes around a text and between a pair's texts (`[CLS] text [SEP]` for BERT, `<s> text </s>` for RoBERTa;
`<bos> text <eos>` for a tokenizer that adds none, as raybiphase's exports: `encoders.special_template`); a sentence
pair is one text, written in its task's template, for every model alike. Where a head does write two segments (QA's
question and context window), a model whose tokenizer marks the second (BERT's token_type_ids) and that has
token-type embeddings gets them: the second segment reads as segment B, as in its pretraining. At most `max_len`
tokens: no more than the positions the checkpoint can index (`encoders.usable_positions`: its
`max_position_embeddings`, less the positions RoBERTa-style models reserve below their first; a raybiphase export
says the length it was pretrained on), else `UserError`. A tokenizer with no pad token (nor an eos to pad with) is a `UserError` that says what to set.

A batch is padded to its longest sequence; on CUDA that width is rounded up to a multiple of `CUDA_PAD_MULTIPLE`
(never past `max_len`). On CUDA a process pays for each new width (kernel choice and plans for every matmul and
attention shape, lazily loaded kernels), and a fan-out trial is a fresh process: a few widths instead of one per
batch keep that cost to the first batches. The price is the padding itself once every width has been met: on an
H100 at 210m (benchmarks/results/h100-2026-11-26.json) a process's first 100-step trial ran 1.4x to 2.6x faster
and a warm one 0.79x to 0.97x as fast. Padded positions are masked out of attention, pooling and the loss, so a
wider batch changes scores only by floating-point rounding. CPU batches keep their longest width.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from raybiphase.errors import UserError
from raybiphase.finetune.encoders import load_encoder, special_template, usable_positions
from raybiphase.finetune.input_lengths import CUDA_PAD_MULTIPLE, EVAL_BATCH  # noqa: F401 (the heads' batching)
from raybiphase.finetune.tasks import Task


@dataclass(frozen=True)
class Evaluation:
    score: float
    per_example: list
    secondary: float = float("nan")


@contextlib.contextmanager
def _quiet_transformers():
    """from_pretrained warns that the task head is newly initialised (expected here) and draws a progress bar."""
    from transformers.utils import logging

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def pad(sequences: list[list[int]], value: int, width: int | None = None) -> torch.Tensor:
    """(len(sequences), width) long tensor, each row right-padded with `value`; `width` defaults to the longest."""
    width = width or max(len(s) for s in sequences)
    return torch.tensor([s + [value] * (width - len(s)) for s in sequences], dtype=torch.long)


class Head:
    def __init__(self, task: Task, tokenizer, max_len: int, *, trust_remote_code: bool = False):
        self.task, self.tokenizer, self.max_len = task, tokenizer, max_len
        self.trust_remote_code = trust_remote_code  # finetune.trust_remote_code: the model's own code may run
        self.device = torch.device("cpu")  # the trial's device; batches and labels are made there
        self.open, self.middle, self.close = special_template(tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise UserError(f"finetune: the tokenizer {tokenizer.name_or_path} has no pad token (nor an eos to pad "
                            f"with); set one (tokenizer.pad_token = ...), save it beside the model and pass that folder")
        self.pad_id = pad_id
        self.segments = any(tokenizer("a", "a").get("token_type_ids") or [])  # it marks a pair's second text (BERT)
        self.model_segments = False  # the loaded model has token-type embeddings to read them with (`_model`)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def wrap(self, ids: list[int]) -> list[int]:
        """`<bos> ids <eos>`, the ids' end trimmed to fit max_len (as the authors' tokenizer call truncates)."""
        return self.open + ids[:self.max_len - len(self.open) - len(self.close)] + self.close

    def unit_length(self, unit) -> int:
        """The tokens of a training unit that set its batch's width (length-bucketed batching)."""
        return len(unit[0])

    def tensor(self, values) -> torch.Tensor:
        """Labels or masks on the trial's device."""
        return torch.as_tensor(values, device=self.device)

    def width(self, sequences: list[list[int]]) -> int:
        """The padded width of a batch: its longest sequence, on CUDA rounded up to CUDA_PAD_MULTIPLE within
        max_len (module docstring)."""
        longest = max(len(s) for s in sequences)
        if self.device.type != "cuda":
            return longest
        return max(longest, min(-(-longest // CUDA_PAD_MULTIPLE) * CUDA_PAD_MULTIPLE, self.max_len))

    def batch(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = self.width(sequences)
        ids = pad(sequences, self.pad_id, width).to(self.device, non_blocking=True)
        mask = pad([[1] * len(s) for s in sequences], 0, width).to(self.device, non_blocking=True)
        return ids, mask

    def inputs(self, sequences: list[list[int]], second: list[int] | None = None) -> dict[str, torch.Tensor]:
        """The model's keyword inputs for a batch: ids and attention mask; with `second` (where each sequence's
        second segment starts), token_type_ids (1 from there to its end) for a model that reads them."""
        ids, mask = self.batch(sequences)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if second is not None and self.segments and self.model_segments:
            types = [[0] * start + [1] * (len(s) - start) for s, start in zip(sequences, second)]
            inputs["token_type_ids"] = pad(types, 0, ids.shape[1]).to(self.device, non_blocking=True)
        return inputs

    def forward_logits(self, model, sequences: list[list[int]], second: list[int] | None = None) -> torch.Tensor:
        return model(**self.inputs(sequences, second)).logits

    def _model(self, kind: str, hf_dir: str, num_labels: int = 0):
        """The model of `kind` ("sequence", "token", "encoder": `encoders.load_encoder`), checked against max_len."""
        with _quiet_transformers():
            model = load_encoder(hf_dir, kind, num_labels, trust_remote_code=self.trust_remote_code)
        positions = usable_positions(model)
        if positions is not None and self.max_len > positions:
            raise UserError(f"finetune.max_len: {self.max_len} exceeds the {positions} positions of {hf_dir} "
                            f"(max_position_embeddings, the length it was trained on, less any it reserves); set "
                            f"finetune.max_len <= {positions}")
        self.model_segments = getattr(model.config, "type_vocab_size", 0) > 1  # token-type embeddings to read
        return model

    def prepare_eval(self, split):
        return split
