"""Any encoder transformers' `AutoModel` loads, fine-tuned through the same heads as ours: BERT, RoBERTa, ModernBERT,
EuroBERT, Ettin's encoders, from a folder, a bucket URI or a Hub model id.

    encoder_source("answerdotai/ModernBERT-base")   # "answerdotai/ModernBERT-base@<commit>": pinned for every trial
    hf_dir = hub_snapshot("answerdotai/ModernBERT-base@<commit>")
    special_template(tokenizer)                      # ([CLS], [SEP], [SEP]) for BERT: the tokenizer's own layout

A Hub model is read at one commit: the command resolves its id (and any `@revision`) to a commit once, before
anything runs, and every trial downloads that commit (the Hub's cache; with HF_HUB_OFFLINE=1, only what the cache
holds). EuroBERT checkpoints keep their own transformers classes (`EuroBertFor...`, mean pooling); any other encoder
is its `AutoModel` under `EncoderWithHead`, the same heads on its last hidden states: a sequence is the mean of its
real tokens' states, then dense, GELU and a linear classifier, as EuroBERT's mean-pooled head; a token's logits are
a linear layer on its state; retrieval embeds with the encoder itself. Padding is masked out of attention, pooling
and the loss alike. The model's own code (`trust_remote_code`) runs only when finetune.trust_remote_code says so.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import torch

from raybiphase import storage
from raybiphase.errors import UserError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?(@[\w./-]+)?")
"""A Hub model id, `org/name` or `name`, with an optional `@revision` (a commit, tag or branch)."""
HUB_IGNORE = ("*.h5", "*.msgpack", "*.onnx", "onnx/*", "*.ot", "*.gguf", "*.tflite", "openvino/*", "*.mlmodel")
"""Files of a Hub model repository that fine-tuning never reads (other frameworks' weights)."""


def is_hub_id(model: str) -> bool:
    """Whether `model` names a Hub model: neither a bucket URI nor a path that exists here, and shaped like an id."""
    model = str(model)
    return (not storage.is_uri(model) and not os.path.exists(model) and not model.startswith(".")
            and HUB_ID.fullmatch(model) is not None)


def _hub_download(model: str) -> Path:
    from huggingface_hub import snapshot_download

    repo, _, revision = model.partition("@")
    try:
        return Path(snapshot_download(repo, revision=revision or None, ignore_patterns=list(HUB_IGNORE)))
    except Exception as err:  # the hub's errors have no common base: offline, not found, gated, bad revision
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"finetune: checkpoint {model} does not exist here, and as a Hub model id it cannot be "
                        f"downloaded: {reason}") from err


def hub_snapshot(model: str) -> Path:
    """The local snapshot of Hub model `model` (`id` or `id@revision`), downloaded once into the Hub's cache."""
    return _hub_download(model)


def encoder_source(model: str) -> str:
    """`model` as trials read it: a Hub id pinned to the commit it resolves to now (`id@commit`), else unchanged."""
    if not is_hub_id(model):
        return model
    return f"{model.partition('@')[0]}@{_hub_download(model).name}"  # a snapshot folder is named by its commit


def hub_commit(model: str) -> str | None:
    """The commit a pinned Hub source names (`id@commit`), None for a folder or bucket URI."""
    return model.partition("@")[2] or None if is_hub_id(model) else None


def model_type(hf_dir: Path) -> str | None:
    return json.loads((Path(hf_dir) / "config.json").read_text()).get("model_type")


def encoder_config(hf_dir: Path, *, trust_remote_code: bool = False):
    """The model's transformers config; UserError (one line, what to set) when `AutoModel` cannot load it."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        hint = ("; set finetune.trust_remote_code: true to run the model's own code" if "remote" in reason
                and not trust_remote_code else "")
        raise UserError(f"finetune: transformers' AutoModel cannot load {hf_dir}: {reason}{hint}") from err


def special_template(tokenizer) -> tuple[list[int], list[int], list[int]]:
    """(open, middle, close) token ids around a text and between a pair's two texts, as the tokenizer itself writes
    them (`[CLS] a [SEP] b [SEP]`, `<s> a </s></s> b </s>`); a tokenizer that adds nothing (a raybiphase export)
    gets `<bos> a <eos> b <eos>`, each where it has the token."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), None)
    if full != bare and at is not None:
        open_, close = full[:at], full[at + len(bare):]
        pair = tokenizer("a", "a")["input_ids"]
        return open_, pair[len(open_) + len(bare):len(pair) - len(close) - len(bare)], close
    close = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []), close, close


def usable_positions(model: torch.nn.Module) -> int | None:
    """How many tokens the model can read: its config's max_position_embeddings, less the positions a RoBERTa-style
    embedding reserves below its first (it numbers positions from pad_token_id + 1: RoBERTa's 514 hold 512 tokens);
    None when the config names no limit."""
    positions = getattr(model.config, "max_position_embeddings", None)
    embeddings = next((m for m in model.modules() if hasattr(m, "create_position_ids_from_input_ids")), None)
    if positions is None or embeddings is None or getattr(embeddings, "padding_idx", None) is None:
        return positions
    return positions - (embeddings.padding_idx + 1)


def encoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks of a head's model (what finetune.compile compiles): the encoder's `layers` or
    `encoder.layer`, else its longest ModuleList."""
    encoder = getattr(model, "model", model)
    for path in ("layers", "encoder.layer", "encoder.layers"):
        found = encoder
        for part in path.split("."):
            found = getattr(found, part, None)
        if isinstance(found, torch.nn.ModuleList):
            return found
    return max((m for m in encoder.modules() if isinstance(m, torch.nn.ModuleList)), key=len)


class EncoderWithHead(torch.nn.Module):
    """An `AutoModel` encoder (`.model`) under a task head: "sequence" (masked mean pooling, dense, GELU,
    classifier) or "token" (a classifier on every state); `forward` gives an object with `.logits`."""

    def __init__(self, encoder, kind: str, num_labels: int):
        super().__init__()
        self.model, self.kind, self.config = encoder, kind, encoder.config
        hidden = encoder.config.hidden_size
        if kind == "sequence":
            self.dense, self.activation = torch.nn.Linear(hidden, hidden), torch.nn.GELU()
        self.classifier = torch.nn.Linear(hidden, num_labels)
        std = getattr(encoder.config, "initializer_range", 0.02)
        for layer in (self.classifier, getattr(self, "dense", None)):
            if layer is not None:
                torch.nn.init.normal_(layer.weight, std=std)
                torch.nn.init.zeros_(layer.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None):
        segments = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **segments).last_hidden_state
        if self.kind == "token":
            return SimpleNamespace(logits=self.classifier(hidden))
        mask = attention_mask.to(hidden.dtype)[..., None]
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        return SimpleNamespace(logits=self.classifier(self.activation(self.dense(pooled))))


EUROBERT_CLASSES = {"sequence": "EuroBertForSequenceClassification", "token": "EuroBertForTokenClassification",
                    "encoder": "EuroBertModel"}


def load_encoder(hf_dir: str, kind: str, num_labels: int = 0, *, trust_remote_code: bool = False):
    """The model a head trains, fp32: EuroBERT's own class of `kind` (mean pooling for sequences), else `AutoModel`
    (under `EncoderWithHead` unless `kind` is "encoder"); UserError when transformers cannot load it."""
    import transformers

    if model_type(Path(hf_dir)) == "eurobert":
        cls = getattr(transformers, EUROBERT_CLASSES[kind])
        extra = {"num_labels": num_labels, "classifier_pooling": "mean"} if kind == "sequence" else (
            {"num_labels": num_labels} if kind == "token" else {})
        return cls.from_pretrained(hf_dir, dtype=torch.float32, **extra)
    encoder_config(Path(hf_dir), trust_remote_code=trust_remote_code)
    try:
        encoder = transformers.AutoModel.from_pretrained(hf_dir, dtype=torch.float32,
                                                         trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"finetune: transformers' AutoModel cannot load {hf_dir}: {reason}") from err
    return encoder if kind == "encoder" else EncoderWithHead(encoder, kind, num_labels)
