"""The encoder: transformers' own EuroBERT, configured from raybiphase.config.sizes; losses for both objectives.

The same weights serve both objectives; only attention changes. CLM steps call the model with `is_causal=True`
(honoured by sdpa and flash_attention_2) or, with flex attention, which ignores that flag, a causal block mask
(`attention_kwargs`); the eager backend ignores both, so it is never offered. MLM and MNTP steps are bidirectional.
EuroBERT's weight names equal LlamaForCausalLM's, so a Llama-family decoder is a state-dict load (`from_decoder`); with the same weights, causal-mode logits equal Llama's (tests/pretrain/test_model.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import EuroBertConfig, EuroBertForMaskedLM

from raybiphase import storage, transfer
from raybiphase.config import RunConfig
from raybiphase.config.sizes import SIZES
from raybiphase.data.assets import cache_dir
from raybiphase.data.masking import IGNORE_INDEX
from raybiphase.errors import UserError
from raybiphase.pretrain.loss import CHUNK_ROWS, labelled_rows, linear_cross_entropy


def _config(*, special_ids: dict[str, int], attn_implementation: str, **dims) -> EuroBertConfig:
    """EuroBERT with the paper's common settings around the given dimensions."""
    return EuroBertConfig(
        **dims,
        tie_word_embeddings=False,
        bos_token_id=special_ids["bos_token"],
        eos_token_id=special_ids["eos_token"],
        pad_token_id=special_ids["pad_token"],
        mask_token_id=special_ids["mask_token"],
        classifier_pooling="mean",  # the paper's fine-tuning head pools over tokens (EuroBERT's default is "late")
        attn_implementation=attn_implementation,
    )


def eurobert_config(size: str, *, vocab_size: int, special_ids: dict[str, int], max_len: int = 8192,
                    attn_implementation: str = "sdpa") -> EuroBertConfig:
    """A EuroBertConfig for a registry size: pre-RMSNorm (eps 1e-5), SwiGLU, RoPE theta 10,000, untied embeddings."""
    s = SIZES[size]
    return _config(
        vocab_size=vocab_size, hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
        max_position_embeddings=max_len, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        special_ids=special_ids, attn_implementation=attn_implementation,
    )


def build_model(size: str, *, vocab_size: int, special_ids: dict[str, int], seed: int,
                attn_implementation: str = "sdpa") -> EuroBertForMaskedLM:
    """A freshly initialised EuroBertForMaskedLM; the same seed gives the same weights."""
    config = eurobert_config(size, vocab_size=vocab_size, special_ids=special_ids, attn_implementation=attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = EuroBertForMaskedLM(config)
        return learn_padding_row(model)


def initial_model(run: RunConfig, manifest):
    """Random init, or an HF decoder's weights (continued pretraining from a Llama-family model); a raybiphase
    checkpoint in model.init_from is loaded by `restore`."""
    common = dict(vocab_size=manifest.vocab_size, special_ids=manifest.special_ids,
                  attn_implementation=run.model.attn_implementation)
    source = run.model.init_from
    if source and not storage.is_checkpoint(source):  # a decoder in a bucket is copied once to this node

        return from_decoder(transfer.local_copy(source, cache_dir()), **common)
    return build_model(run.model.size, seed=run.train.seed, **common)


def learn_padding_row(model: EuroBertForMaskedLM) -> EuroBertForMaskedLM:
    """Make the pad token's embedding an ordinary, trained row. transformers builds the embedding with
    `padding_idx=pad_token_id` (a zero row that never gets a gradient), but packed pretraining has no padding, and
    with Llama-3's convention pad = eos: the document separator would stay a zero vector. A block that starts with
    it then puts an all-zero vector at position 0, and the step's gradients turn NaN on CUDA in bf16 (seen on an
    H100 at 610m; benchmarks/results/h100-2026-11-23.json)."""
    embedding = model.get_input_embeddings()
    if embedding.padding_idx is not None:
        with torch.no_grad():
            row = embedding.weight[embedding.padding_idx]
            if not row.any():  # freshly initialised: give it the other rows' initialisation
                row.normal_(0.0, model.config.initializer_range)
        embedding.padding_idx = None
    return model


def from_decoder(path: str | Path, *, vocab_size: int, special_ids: dict[str, int],
                 attn_implementation: str = "sdpa") -> EuroBertForMaskedLM:
    """Continued pretraining from a Llama-family decoder in HF format: same weights, a vocabulary resized
    to the tokenizer's (new rows, such as an added mask token, take the mean embedding)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"model.init_from: {path} is not an HF model folder (no config.json)")
    llama = AutoConfig.from_pretrained(str(path))
    if llama.model_type not in ("llama", "mistral", "qwen2", "smollm3"):
        raise UserError(f"model.init_from: {path} is a {llama.model_type!r} model, not a Llama-family decoder")
    decoder = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if decoder.config.tie_word_embeddings:  # EuroBERT unties them: give the head its own copy
        decoder.lm_head.weight = torch.nn.Parameter(decoder.get_input_embeddings().weight.detach().clone())
    config = _config(
        vocab_size=llama.vocab_size, hidden_size=llama.hidden_size, intermediate_size=llama.intermediate_size,
        num_hidden_layers=llama.num_hidden_layers, num_attention_heads=llama.num_attention_heads,
        num_key_value_heads=llama.num_key_value_heads,
        head_dim=getattr(llama, "head_dim", None) or llama.hidden_size // llama.num_attention_heads,
        max_position_embeddings=llama.max_position_embeddings, rms_norm_eps=llama.rms_norm_eps,
        rope_parameters=dict(llama.rope_parameters), special_ids=special_ids, attn_implementation=attn_implementation,
    )
    model = learn_padding_row(EuroBertForMaskedLM(config))
    model.load_state_dict(decoder.state_dict(), strict=True)
    if vocab_size != config.vocab_size:
        model.resize_token_embeddings(vocab_size, mean_resizing=True)
    return model


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100, from full logits (the reference the step's
    sparse, chunked loss is tested against).

    For CLM the data already holds next-token labels (raybiphase.data.masking.clm_labels), so nothing is shifted here;
    for MLM only the masked positions carry labels.
    """
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def block_parameters(model, blocks: tuple[int, ...]) -> list[torch.nn.Parameter]:
    """The parameters of the transformer blocks `blocks` (0-based; a phase's frozen_layers)."""
    return [param for i in blocks for param in model.model.layers[i].parameters()]


def attention_kwargs(config, input_ids: torch.Tensor, is_causal: bool) -> dict:
    """How the encoder is asked for causal or bidirectional attention: sdpa and flash_attention_2 honour
    `is_causal`; flex attention ignores it and takes a causal block mask as its attention mask instead."""
    if is_causal and config._attn_implementation == "flex_attention":
        return {"attention_mask": causal_block_mask(input_ids.shape[1], str(input_ids.device))}
    return {"is_causal": is_causal}


@functools.lru_cache(maxsize=8)
def causal_block_mask(seq_len: int, device: str):
    """Flex attention's causal mask for one sequence length, built once per length and device."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, k: q >= k, None, None, seq_len, seq_len, device=device)


def sparse_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, is_causal: bool,
                chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, labelled tokens) of one micro-batch: EuroBERT's encoder for the hidden states, then its
    own LM head on the labelled rows only (sparse prediction), its cross-entropy chunked (raybiphase.pretrain.loss).
    Under FSDP2 it is registered as a forward method of the root module (raybiphase.pretrain.parallel)."""
    hidden = model.model(input_ids=input_ids, **attention_kwargs(model.config, input_ids, is_causal)).last_hidden_state
    rows, targets = labelled_rows(hidden, labels)
    total = linear_cross_entropy(rows, model.lm_head.weight, targets, model.lm_head.bias, chunk_rows=chunk_rows)
    return total, torch.tensor(targets.numel(), device=total.device)


def loss_terms(model, batch: dict[str, torch.Tensor], objective: str,
               chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, labelled tokens) of one micro-batch under the phase's objective: causal attention for
    CLM, bidirectional for MLM."""
    method = getattr(model, "sparse_loss", None)  # FSDP2's registered method, when the model is sharded
    args = (batch["input_ids"], batch["labels"], objective == "clm", chunk_rows)
    return method(*args) if method is not None else sparse_loss(model, *args)


def forward_loss(model, batch: dict[str, torch.Tensor], objective: str) -> torch.Tensor:
    """Mean token loss of one micro-batch."""
    total, tokens = loss_terms(model, batch, objective)
    return total / tokens.clamp(min=1)
