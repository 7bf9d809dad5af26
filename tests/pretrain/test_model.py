"""The model is transformers' EuroBERT: causal mode is a Llama decoder, bidirectional mode is an encoder."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from raybiphase.config.sizes import SIZES
from raybiphase.data.masking import MaskingSpec, clm_labels, mlm_mask
from raybiphase.pretrain.model import build_model, forward_loss, from_decoder, token_loss

SPECIALS = {"bos_token": 0, "eos_token": 1, "pad_token": 2, "mask_token": 3}
VOCAB = 97


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0).eval()


def _tokens(seed=0, shape=(2, 12)):
    return torch.randint(4, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def test_causal_mode_never_looks_ahead_bidirectional_does(model):
    x = _tokens()
    y = x.clone()
    y[:, 8] = (y[:, 8] + 1) % VOCAB
    with torch.no_grad():
        causal_x, causal_y = model(input_ids=x, is_causal=True).logits, model(input_ids=y, is_causal=True).logits
        bi_x, bi_y = model(input_ids=x).logits, model(input_ids=y).logits
    assert torch.equal(causal_x[:, :8], causal_y[:, :8])
    assert not torch.allclose(causal_x[:, 8:], causal_y[:, 8:])
    assert not torch.allclose(bi_x[:, :8], bi_y[:, :8])


def _labels_before(x: torch.Tensor, position: int) -> torch.Tensor:
    labels = torch.full_like(x, -100)
    labels[:, :position] = x[:, 1:position + 1]
    return labels


@pytest.mark.parametrize("attn", ["sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)])  # flex compiles
def test_the_training_steps_clm_loss_never_sees_past_its_labels(attn):
    """The step's own path (`loss_terms`, sparse head): with labels on the first 8 positions only, a token changed at
    position 9 leaves the CLM loss unchanged and changes the MLM loss, on each backend; flex attention, which ignores
    `is_causal`, gets its causal block mask and equals sdpa's CLM loss."""
    from raybiphase.pretrain.model import loss_terms

    flex, sdpa = (build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0, attn_implementation=a).eval()
                  for a in (attn, "sdpa"))
    x = _tokens(2, (2, 16))
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % VOCAB
    with torch.no_grad():
        clm, mlm = ([float(loss_terms(flex, {"input_ids": t, "labels": _labels_before(x, 8)}, objective)[0])
                     for t in (x, y)] for objective in ("clm", "mlm"))
        reference = float(loss_terms(sdpa, {"input_ids": x, "labels": _labels_before(x, 8)}, "clm")[0])
    assert clm[0] == clm[1] and mlm[0] != mlm[1]
    assert abs(clm[0] - reference) < 1e-4 * reference


def test_causal_logits_equal_llama_with_the_same_weights(model):
    size = SIZES["tiny"]
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=size.hidden, intermediate_size=size.ffn, num_hidden_layers=size.layers,
        num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, head_dim=size.head_dim,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="sdpa",
    )).eval()
    llama.load_state_dict(model.state_dict(), strict=True)  # the same names: a decoder is a state-dict load
    x = _tokens(1)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x, is_causal=True).logits, llama(input_ids=x).logits, rtol=0, atol=1e-5)


def test_clm_loss_is_next_token_cross_entropy(model):
    x = _tokens(2).numpy()
    inputs, labels = clm_labels(x)
    batch = {"input_ids": torch.as_tensor(inputs), "labels": torch.as_tensor(labels)}
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], is_causal=True).logits
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), torch.as_tensor(x)[:, 1:].reshape(-1))
        assert torch.allclose(forward_loss(model, batch, "clm"), expected)


def test_mlm_loss_counts_masked_positions_only(model):
    x = _tokens(3, (4, 16)).numpy()
    inputs, labels = mlm_mask(x, torch.arange(4).numpy(), seed=0, spec=MaskingSpec(mask_ratio=0.4),
                              mask_token_id=3, vocab_size=VOCAB, special_ids=[0, 1, 2, 3])
    batch = {"input_ids": torch.as_tensor(inputs), "labels": torch.as_tensor(labels)}
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
        masked = batch["labels"] != -100
        expected = F.cross_entropy(logits[masked], batch["labels"][masked])
        assert torch.allclose(forward_loss(model, batch, "mlm"), expected)
        # whatever the model predicts at unmasked positions leaves the loss unchanged: only masked ones count
        noisy = logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(0)) * ~masked[..., None]
        assert torch.equal(token_loss(noisy, batch["labels"]), token_loss(logits, batch["labels"]))
        assert not torch.allclose(token_loss(logits + torch.randn(logits.shape), batch["labels"]), expected)


def test_same_seed_same_weights():
    a = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=5).state_dict()
    b = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=5).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_llama_decoder_converts_and_gets_a_mask_row(tmp_path):
    size = SIZES["tiny"]
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=90, hidden_size=size.hidden, intermediate_size=size.ffn, num_hidden_layers=2,
        num_attention_heads=size.heads, num_key_value_heads=size.kv_heads, head_dim=size.head_dim,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
    ))
    llama.save_pretrained(tmp_path / "decoder")
    model = from_decoder(tmp_path / "decoder", vocab_size=91, special_ids={**SPECIALS, "mask_token": 90}).eval()
    assert model.get_input_embeddings().weight.shape[0] == 91
    x = torch.randint(4, 90, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x, is_causal=True).logits[..., :90], llama(input_ids=x).logits, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_real_smollm2_decoder_continues_as_an_encoder(tmp_path):
    """The offline SmolLM2-135M (Llama architecture), truncated to 2 layers, becomes a EuroBERT with a mask token:
    causal logits equal the decoder's on real text, and an MLM step on it trains."""
    from transformers import AutoConfig, AutoTokenizer

    from raybiphase.data import assets

    assets.fetch(["smollm2"], log=lambda *a: None)
    source = assets.smollm2_hf_dir()
    config = AutoConfig.from_pretrained(source)
    config.num_hidden_layers = 2
    decoder = LlamaForCausalLM.from_pretrained(source, config=config).eval()
    decoder.save_pretrained(tmp_path / "decoder")
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    specials = {"bos_token": tokenizer.bos_token_id, "eos_token": tokenizer.eos_token_id,
                "pad_token": tokenizer.pad_token_id, "mask_token": tokenizer.mask_token_id}
    model = from_decoder(tmp_path / "decoder", vocab_size=len(tokenizer), special_ids=specials)
    assert model.config.vocab_size == 49153 and model.config.num_hidden_layers == 2
    ids = tokenizer("The Normans were the people who in the 10th and 11th centuries gave their name to Normandy.",
                    return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(input_ids=ids, is_causal=True).logits[..., :49152],
                                   decoder(input_ids=ids).logits, rtol=0, atol=1e-4)
    inputs, labels = mlm_mask(ids.numpy(), torch.zeros(1, dtype=torch.long).numpy(), seed=0,
                              spec=MaskingSpec(mask_ratio=0.4), mask_token_id=specials["mask_token"],
                              vocab_size=len(tokenizer), special_ids=list(specials.values()))
    batch = {"input_ids": torch.as_tensor(inputs), "labels": torch.as_tensor(labels)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    before = forward_loss(model, batch, "mlm")
    for _ in range(3):
        optimizer.zero_grad()
        loss = forward_loss(model, batch, "mlm")
        loss.backward()
        optimizer.step()
    assert forward_loss(model, batch, "mlm") < before


def test_the_pad_token_is_an_ordinary_trained_row(model):
    """pad = eos (Llama-3) is the packed data's document separator: its embedding is initialised like the others
    and learns; transformers' padding_idx would keep it a zero row without gradient (NaN steps on CUDA in bf16)."""
    fresh = build_model("tiny", vocab_size=VOCAB, special_ids=SPECIALS, seed=0)
    embedding = fresh.model.embed_tokens
    pad = SPECIALS["pad_token"]
    assert embedding.padding_idx is None and embedding.weight[pad].any()
    x = _tokens()
    x[:, 0] = pad
    forward_loss(fresh, {"input_ids": x[:, :-1], "labels": x[:, 1:]}, "clm").backward()
    assert embedding.weight.grad[pad].any()


def test_the_untrained_control_is_exactly_the_step_0_weights_runs_start_from(small_shards, tmp_path):
    from transformers import AutoModelForMaskedLM

    from raybiphase.config import RunConfig, from_dict
    from raybiphase.pretrain.export import export_initial
    from raybiphase.pretrain.model import initial_model

    data, manifest = small_shards
    run = from_dict(RunConfig, {"model": {"size": "tiny"}, "data": {"dir": data.dir, "seq_len": data.seq_len}})
    export_initial(run, manifest.dir, str(tmp_path / "hf"))
    exported = AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").state_dict()
    started = initial_model(run, manifest).state_dict()  # what train_loop builds before its first step
    assert exported.keys() == started.keys()
    assert all(torch.equal(exported[k], started[k]) for k in started)
    other_seed = initial_model(from_dict(RunConfig, {**to_plain(run), "train": {"seed": 1}}), manifest).state_dict()
    assert not torch.equal(other_seed["model.embed_tokens.weight"], started["model.embed_tokens.weight"])


def to_plain(run) -> dict:
    from raybiphase.config import to_dict

    return {k: v for k, v in to_dict(run).items() if k in ("model", "data")}
