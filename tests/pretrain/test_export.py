"""`raybiphase export`: any step of a checkpoint as a folder stock transformers loads, with a card that names the
run, its phases and its scores; bad input stops before anything is written. No Ray: the shards are made in process."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from raybiphase.errors import UserError


@pytest.fixture()
def saved(small_shards, tmp_path):
    """A raybiphase checkpoint at step 3 (not an export step: only sharded weights) in a sweep's layout."""
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import RunConfig, from_dict, to_dict
    from raybiphase.optim import adamw
    from raybiphase.pretrain import checkpoint
    from raybiphase.pretrain.model import build_model, forward_loss

    data, manifest = small_shards
    run = from_dict(RunConfig, {"model": {"size": "tiny"}, "data": dataclasses.asdict(data),
                                "phases": {"steps": 6, "clm_share": 0.5},
                                "optim": {"warmup_steps": 1, "decay_steps": 1},
                                "train": {"global_batch_tokens": 512, "micro_batch_size": 8},
                                "resources": {"num_workers": 1}})
    model = build_model("tiny", vocab_size=manifest.vocab_size, special_ids=manifest.special_ids, seed=0)
    optimizer = adamw(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ids = torch.randint(4, manifest.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    forward_loss(model, {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}, "clm").backward()
    optimizer.step()
    path = tmp_path / "results" / "study" / "runs" / "seg-0-3" / "step-00000003"
    metrics = {"step": 3, "val/clm_loss": 6.5, "unigram_entropy": 6.9}
    checkpoint.save(path, model, optimizer, CheckpointMeta(run=to_dict(run), step=3, data_start=0, metrics=metrics))
    return path, model, run


@pytest.mark.slow  # a checkpoint saved and exported, seconds
def test_a_step_that_was_not_exported_loads_in_stock_transformers_with_its_card(saved, tmp_path):
    from transformers import AutoModelForMaskedLM

    from raybiphase.naming import run_name
    from raybiphase.pretrain.export import export_checkpoint

    path, model, run = saved
    name = run_name(run)
    pd.DataFrame([{"source": "raybiphase", "run": name, "pretrain_step": 3, "task": "tweets", "family": "SC",
                   "metric": "accuracy", "test_mean": 0.5123, "test_ci95": 0.0211, "best_lr": 1e-4, "n_seeds": 3},
                  {"source": "raybiphase", "run": name, "pretrain_step": 6, "task": "squad", "family": "QA",
                   "metric": "f1", "test_mean": 0.3, "test_ci95": 0.01, "best_lr": 1e-4, "n_seeds": 3}]
                 ).to_parquet(path.parents[2] / "summary.parquet")
    out = tmp_path / "exported"
    assert export_checkpoint(str(path), str(out)) == name  # no pretrain.parquet: the paper's scheme
    loaded = AutoModelForMaskedLM.from_pretrained(out)
    state = model.state_dict()
    assert all(torch.equal(tensor, state[key]) for key, tensor in loaded.state_dict().items())
    card = (out / "README.md").read_text()
    header = card.split("---\n")[1]  # the card's YAML header: what the Hub reads
    assert card.startswith("---\n") and "library_name: transformers" in header and "license: apache-2.0" in header
    assert f"# {name}" in card
    assert "step 3 of 6" in card and "1,536 tokens seen" in card  # 3 steps x 512 tokens
    assert "| CLM | 0 to 3 | 3 |  |" in card and "| MLM | 3 to 6 | 3 | 40% |" in card
    assert "clm loss 6.500" in card and f'from_pretrained("{out}")' in card
    body = card.split("---\n", 2)[2]  # (the header names the pretraining corpus, SQuAD's text here)
    assert "| tweets | SC | accuracy | 51.23 ± 2.11 | 0.0001 | 3 |" in body and "squad" not in body  # its step only


@pytest.mark.slow  # a checkpoint saved and exported, seconds
def test_bad_input_stops_before_anything_is_written(saved, tmp_path, monkeypatch):
    from raybiphase.pretrain.export import export_checkpoint

    path, _, _ = saved
    with pytest.raises(UserError, match="does not exist"):
        export_checkpoint(str(tmp_path / "nowhere"), str(tmp_path / "a"))
    with pytest.raises(UserError, match="not a raybiphase checkpoint"):
        export_checkpoint(str(path.parent), str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty"):
        export_checkpoint(str(path), str(tmp_path / "full"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub here: the push fails with the Hub's reason, in one line
    with pytest.raises(UserError, match="pushing to the Hub repository 'me/tiny' failed") as err:
        export_checkpoint(str(path), str(tmp_path / "b"), push="me/tiny")
    assert "\n" not in str(err.value)


@pytest.mark.slow  # a checkpoint saved and exported, seconds
@pytest.mark.parametrize("exported_by_the_run", [False, True])
def test_an_export_says_the_length_it_was_trained_on_and_computes_the_same(saved, small_shards, tmp_path,
                                                                          exported_by_the_run):
    """`max_position_embeddings` is the run's data.seq_len (an evaluation harness sizes its inputs from
    it), not EuroBERT's 8,192, whether the step is rebuilt or the run's own export is copied; RoPE does not read
    it, so the logits are the same as the trained model's."""
    import json

    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from raybiphase.pretrain.export import export_checkpoint

    path, model, run = saved
    assert model.config.max_position_embeddings == 8192 and run.data.seq_len == 64
    if exported_by_the_run:  # as the trainer writes <checkpoint>/hf at train.export_steps
        model.save_pretrained(path / "hf")
        AutoTokenizer.from_pretrained(small_shards[1].local_tokenizer()).save_pretrained(path / "hf")
    out = tmp_path / "exported"
    export_checkpoint(str(path), str(out))
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == run.data.seq_len
    loaded = AutoModelForMaskedLM.from_pretrained(out).eval()
    ids = torch.randint(4, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_a_rope_that_reads_the_length_keeps_it(tmp_path):
    """A decoder-initialised model whose RoPE scaling reads max_position_embeddings (dynamic, yarn) keeps it:
    changing it would move the frequencies."""
    import json

    from raybiphase.pretrain.checkpoint import record_trained_length

    for rope_type, expected in (("default", 64), ("llama3", 64), ("dynamic", 8192), ("yarn", 8192)):
        config = {"max_position_embeddings": 8192, "rope_parameters": {"rope_type": rope_type, "factor": 2.0}}
        (tmp_path / "config.json").write_text(json.dumps(config))
        record_trained_length(tmp_path, 64)
        assert json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"] == expected


@pytest.mark.slow  # a checkpoint saved and exported, seconds
@pytest.mark.parametrize("exported_by_the_run", [False, True])
def test_the_exports_stock_tokenizer_frames_texts_as_pretraining_and_fine_tuning_did(saved, small_shards, tmp_path,
                                                                                     exported_by_the_run):
    """A stock `AutoTokenizer` on an export (what an evaluation harness loads) gives `<bos> text <eos>`, the framing
    of every pretraining document (`pack`) and the heads' (a pair: `<bos> A <eos> B <eos>`); the heads themselves,
    which frame by hand, make the same ids from the export's tokenizer as from the data's."""
    from transformers import AutoTokenizer

    from raybiphase.data.prepare import pack
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task
    from raybiphase.pretrain.export import export_checkpoint

    path, model, _ = saved
    data_tokenizer = AutoTokenizer.from_pretrained(small_shards[1].local_tokenizer())
    if exported_by_the_run:  # a folder exported before its tokenizer framed texts: the export frames it
        model.save_pretrained(path / "hf")
        data_tokenizer.save_pretrained(path / "hf")
    export_checkpoint(str(path), str(tmp_path / "exported"))
    exported = AutoTokenizer.from_pretrained(tmp_path / "exported")
    bos, eos = data_tokenizer.bos_token_id, data_tokenizer.eos_token_id
    text, other = "The Normans gave their name to Normandy.", "Where is Normandy?"
    bare, bare_other = (data_tokenizer(t, add_special_tokens=False)["input_ids"] for t in (text, other))
    (blocks,) = pack([np.asarray(bare)], seq_len=len(bare) + 2, bos=bos, eos=eos)  # one document, one block
    assert exported(text)["input_ids"] == blocks[0].tolist() == [bos, *bare, eos]
    assert exported(text, other)["input_ids"] == [bos, *bare, eos, *bare_other, eos]
    assert exported([text, other])["input_ids"] == [[bos, *bare, eos], [bos, *bare_other, eos]]

    records = {"qnli": [{"text": other, "text_pair": text, "label": 0}],
               "squad_commas": [{"words": ["Yes", "the", "Normans", "came"], "tags": ["B-COMMA", "O", "O", "O"]}],
               "squad": [{"id": "q", "question": other, "context": text,
                          "answers": {"text": ["Normandy"], "answer_start": [30]}}]}
    for task, examples in records.items():
        heads = [head_for(get_task(task), tok, 64) for tok in (data_tokenizer, exported)]
        assert heads[0].train_units(examples) == heads[1].train_units(examples)
    assert heads[1].train_units(records["squad"])[0][0][:1] == [bos]
