"""Encoders other than EuroBERT through the same protocol: tiny random BERT and ModernBERT configs, saved locally
with real tokenizers trained on offline text, fine-tuned on a task of every family (one seed each)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from raybiphase.config import FinetuneConfig
from raybiphase.errors import UserError
from tests.finetune.test_finetune import one_torch_thread  # noqa: F401 (autouse: one torch thread, as a trial has)

TINY = FinetuneConfig(batch_size=8, max_steps=4, eval_every=4, max_examples=32, max_eval_examples=24, max_len=96)
FAMILY_TASKS = ("tweets", "squad_bio", "squad_sentence", "squad_retrieval")  # SC, TC, QA, IR


def _texts() -> list[str]:
    from raybiphase.data import sources

    return sources.squad_contexts("dev")[:400] + [t["text"] for t in sources.tweets()[:400]]


def make_tiny_bert(out: Path) -> Path:
    """A tiny random BertModel and a WordPiece BertTokenizerFast (`[CLS] a [SEP] b [SEP]`)."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(_texts(), vocab_size=800, min_frequency=2)
    tokenizer = BertTokenizerFast(tokenizer_object=wordpiece._tokenizer)
    assert len(tokenizer) > 500  # the trained vocabulary (transformers 5 ignores a vocab_file argument)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    BertModel(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def make_tiny_modernbert(out: Path) -> Path:
    """A tiny random ModernBertModel and a byte-level BPE tokenizer writing `[CLS] a [SEP]`, as ModernBERT's."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import ModernBertConfig, ModernBertModel, PreTrainedTokenizerFast

    specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
                "unk_token": "[UNK]"}
    bpe = ByteLevelBPETokenizer(add_prefix_space=True)
    bpe.train_from_iterator(_texts(), vocab_size=800, min_frequency=2, special_tokens=list(specials.values()))
    cls_id, sep_id = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
    bpe._tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, **specials)
    assert len(tokenizer) > 500
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in specials.items()}
    config = ModernBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=128, pad_token_id=ids["pad_token"],
                              cls_token_id=cls_id, sep_token_id=sep_id, bos_token_id=cls_id, eos_token_id=sep_id,
                              global_attn_every_n_layers=2, local_attention=16)
    ModernBertModel(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def make_tiny_roberta(out: Path, positions: int = 64) -> Path:
    """A tiny random RobertaModel (positions numbered from pad_token_id + 1, as RoBERTa's: `positions` tokens in
    a table of positions + 2) and a byte-level BPE tokenizer writing `<s> a </s></s> b </s>`, as RoBERTa's."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaModel

    specials = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
                "mask_token": "<mask>"}  # RoBERTa's order: <pad> is id 1
    bpe = ByteLevelBPETokenizer(add_prefix_space=True)
    bpe.train_from_iterator(_texts(), vocab_size=800, min_frequency=2, special_tokens=list(specials.values()))
    bpe._tokenizer.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")),
                                                      ("<s>", bpe.token_to_id("<s>")))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, cls_token="<s>", sep_token="</s>",
                                        model_input_names=["input_ids", "attention_mask"], **specials)
    assert tokenizer.pad_token_id == 1 and len(tokenizer) > 500
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=positions + 2, type_vocab_size=1,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2)
    RobertaModel(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def encoders(offline_cache, tmp_path_factory) -> dict[str, Path]:
    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("encoders")
    return {"bert": make_tiny_bert(root / "bert"), "modernbert": make_tiny_modernbert(root / "modernbert")}




@pytest.mark.slow  # every family trained and scored: about 10 s a model
@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_every_family_fine_tunes_a_foreign_encoder_with_its_own_tokenizer(encoders, kind):
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    for task in FAMILY_TASKS:
        result = run_trial(TrialSpec.plain(encoders[kind], task, lr=1e-3, seed=0), cfg=TINY)
        assert result.steps == 4 and 0.0 <= result.val_score <= 1.0 and 0.0 <= result.test_score <= 1.0, task
        assert len(result.test_per_example) > 0 and not result.diverged, task


def test_inputs_follow_the_models_own_special_tokens(encoders):
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import load_checked_tokenizer

    tokenizer = load_checked_tokenizer(encoders["bert"])
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    sc = head_for(get_task("tweets"), tokenizer, 64)
    ids, _ = sc.train_units([{"text": "the game", "text_pair": None, "label": 0}])[0]
    assert ids[0] == cls_id and ids[-1] == sep_id and ids.count(sep_id) == 1
    qa = head_for(get_task("squad"), tokenizer, 64)
    window = qa.windows({"question": "who won", "context": "the home team won", "answers": {"text": [],
                                                                                         "answer_start": []}})[0]
    assert window["ids"] == [cls_id, *tokenizer("who won", add_special_tokens=False)["input_ids"], sep_id,
                             *tokenizer("the home team won", add_special_tokens=False)["input_ids"], sep_id]


def test_the_same_seed_gives_the_same_scores_and_padding_does_not_change_them(encoders):
    import torch

    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import load_checked_tokenizer, run_trial

    spec = TrialSpec.plain(encoders["modernbert"], "tweets", lr=1e-3, seed=3)
    first, again = run_trial(spec, cfg=TINY), run_trial(spec, cfg=TINY)
    assert first.test_per_example == again.test_per_example and first.val_score == again.val_score
    head = head_for(get_task("tweets"), load_checked_tokenizer(encoders["bert"]), 64)
    model = head.load_model(str(encoders["bert"])).eval()
    short, long = head.wrap(head.ids("a good day")), head.wrap(head.ids("a much longer tweet about the match today"))
    with torch.no_grad():
        alone = head.forward_logits(model, [short])[0]
        padded = head.forward_logits(model, [short, long])[0]
    assert torch.allclose(alone, padded, atol=1e-5)


def test_a_bert_reads_a_qa_windows_context_as_segment_b_as_its_own_pair_encoding_marks_it(encoders):
    import torch

    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import load_checked_tokenizer

    tokenizer = load_checked_tokenizer(encoders["bert"])
    head = head_for(get_task("squad"), tokenizer, 64)
    model = head.load_model(str(encoders["bert"])).eval()
    record = {"question": "who won the game", "context": "the home team won the game",
              "answers": {"text": [], "answer_start": []}}
    (window,) = head.windows(record)
    own = tokenizer(record["question"], record["context"], return_tensors="pt")  # BERT's own pair: B marked 1
    assert window["ids"] == own["input_ids"][0].tolist() and 0 < int(own["token_type_ids"].sum()) < len(window["ids"])
    ((ids, _, first),) = head.train_units([record])
    assert head.inputs([ids], [first])["token_type_ids"].tolist() == own["token_type_ids"].tolist()  # training too
    with torch.no_grad():
        ours = head.forward_logits(model, [window["ids"]], [window["first"]])
        as_bert = model(**own).logits
        all_segment_a = model(input_ids=own["input_ids"], attention_mask=own["attention_mask"]).logits
    assert torch.allclose(ours, as_bert, atol=1e-6) and not torch.allclose(ours, all_segment_a, atol=1e-6)


def test_a_roberta_length_check_leaves_out_the_positions_it_reserves(tmp_path):
    import torch

    from raybiphase.finetune.encoders import usable_positions
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import load_checked_tokenizer

    roberta = make_tiny_roberta(tmp_path / "roberta", positions=64)  # a table of 66 positions, numbered from 2
    tokenizer = load_checked_tokenizer(roberta)
    with pytest.raises(UserError, match=r"finetune.max_len: 66 exceeds the 64 positions .*max_len <= 64$"):
        head_for(get_task("tweets"), tokenizer, 66).load_model(str(roberta))
    head = head_for(get_task("tweets"), tokenizer, 64)
    model = head.load_model(str(roberta)).eval()
    assert usable_positions(model) == 64 and model.config.max_position_embeddings == 66
    longest = head.wrap(head.ids(" ".join(["the game was played at home today"] * 20)))
    assert len(longest) == 64
    with torch.no_grad():
        assert torch.isfinite(head.forward_logits(model, [longest])).all()  # the longest input max_len allows
        with pytest.raises((IndexError, RuntimeError), match="out of"):  # 66 tokens: indexed past the table
            model(input_ids=torch.tensor([longest + longest[1:3]]), attention_mask=torch.ones(1, 66, dtype=torch.long))


def test_what_a_foreign_encoder_lacks_is_one_line_that_says_what_to_set(encoders, tmp_path):
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    def error(hf_dir, task="tweets", **settings) -> str:
        with pytest.raises(UserError) as err:
            run_trial(TrialSpec.plain(hf_dir, task, lr=1e-3, seed=0), cfg=dataclasses.replace(TINY, **settings))
        assert "\n" not in str(err.value)
        return str(err.value)

    unknown = shutil.copytree(encoders["bert"], tmp_path / "unknown")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "no-such-encoder"}))
    assert "AutoModel cannot load" in error(unknown)
    remote = shutil.copytree(encoders["bert"], tmp_path / "remote")
    (remote / "config.json").write_text(json.dumps({**config, "model_type": "my-encoder",
                                                    "auto_map": {"AutoConfig": "modeling.MyConfig",
                                                                 "AutoModel": "modeling.MyModel"}}))
    assert "finetune.trust_remote_code" in error(remote)
    bare = shutil.copytree(encoders["bert"], tmp_path / "no-pad")
    tokenizer_config = json.loads((bare / "tokenizer_config.json").read_text())
    (bare / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "pad_token": None}))
    tokenizer_json = json.loads((bare / "tokenizer.json").read_text())
    tokenizer_json["padding"] = None
    (bare / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    (bare / "special_tokens_map.json").unlink(missing_ok=True)
    assert "no pad token" in error(bare)
    mismatched = shutil.copytree(encoders["bert"], tmp_path / "mismatched")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (mismatched / name).unlink(missing_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(encoders["modernbert"] / name, mismatched / name)
    assert "do not belong together" in error(mismatched)


def test_a_hub_id_that_cannot_be_downloaded_is_one_line(monkeypatch):
    from raybiphase.finetune.encoders import encoder_source, is_hub_id

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert is_hub_id("answerdotai/ModernBERT-base") and is_hub_id("bert-base-uncased@main")
    assert not is_hub_id("s3://bucket/model") and not is_hub_id("./here")
    with pytest.raises(UserError, match="as a Hub model id it cannot be downloaded") as err:
        encoder_source("no-such-org-here/no-such-encoder")
    assert "\n" not in str(err.value)


def test_a_qa_head_needs_a_leading_token_and_says_so(encoders):
    from transformers import AutoTokenizer

    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task

    tokenizer = AutoTokenizer.from_pretrained(str(encoders["modernbert"]))
    tokenizer.backend_tokenizer.post_processor = None  # writes nothing around a text, and has no bos
    with pytest.raises(UserError, match="writes no <bos> or \\[CLS\\]"):
        head_for(get_task("squad"), tokenizer, 64)
    assert head_for(get_task("tweets"), tokenizer, 64).open == []  # SC pools every token: it needs none


def test_the_command_refuses_an_unloadable_encoder_a_misfit_tokenizer_and_a_bad_revision_in_one_line(
        encoders, tmp_path, capsys, monkeypatch):
    import sys

    from raybiphase.__main__ import main

    unknown = shutil.copytree(encoders["bert"], tmp_path / "unknown")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "no-such-encoder"}))
    misfit = shutil.copytree(encoders["bert"], tmp_path / "misfit")
    (misfit / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets sys.argv for the command
    cases = [(unknown, [], "error: finetune: transformers' AutoModel cannot load"),
             (misfit, [], "error: finetune: the tokenizer in"),
             (encoders["bert"], ["--set", "finetune.dataset_revisions=[nyu-mll/glu@main]"],
              "error: finetune.dataset_revisions: 'nyu-mll/glu@main' is not")]
    for model, extra, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(["finetune", str(model), str(tmp_path / "out"), "--set", "finetune.tasks=[tweets]", *extra])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith(expected) and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()  # nothing written before the refusal
