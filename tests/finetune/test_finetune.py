"""Fine-tuning trials on a tiny random EuroBERT with a real BPE tokenizer (the Ray Tune fan-out over them:
tests/finetune/test_fanout.py)."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from raybiphase.config import FinetuneConfig, SweepSpec, from_dict
from raybiphase.errors import UserError

TINY_RUN = FinetuneConfig(batch_size=8, max_steps=6, eval_every=3, max_examples=48)


def make_tiny_checkpoint(out: Path, *, vocab_size: int = 1024, seed: int = 0) -> Path:
    """A tiny random EuroBertForMaskedLM and a BPE trained on real offline text, saved as a pretraining export."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from raybiphase.data import sources
    from raybiphase.data.prepare import SPECIAL_TOKENS
    from raybiphase.pretrain.model import build_model

    docs = sources.squad_contexts("dev")[:600] + [t["text"] for t in sources.tweets()[:600]]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS.values()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, **SPECIAL_TOKENS)
    special_ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in SPECIAL_TOKENS.items()}
    model = build_model("tiny", vocab_size=len(tokenizer), special_ids=special_ids, seed=seed)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """A tiny model runs several times faster on one thread than on two contended ones (as in a 1-CPU trial)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_checkpoint(offline_cache, tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "hf")


# ------------------------------------------------------------------------------------------------ trials


def test_a_trial_reports_at_each_evaluation_and_returns_scores_in_range(tiny_checkpoint):
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    reports = []
    result = run_trial(TrialSpec.plain(tiny_checkpoint, "tweets", lr=5e-4, seed=0), cfg=TINY_RUN, report=reports.append)
    assert [r["step"] for r in reports] == [3, 6] and "final" in reports[-1]
    assert result.metric == "accuracy" and result.steps == 6 and result.seconds > 0
    assert 0.0 <= result.val_score <= 1.0 and result.val_score == reports[-1]["val_score"]
    assert len(result.test_per_example) == 48 and result.test_score == np.mean(result.test_per_example)


def test_cuda_batches_come_in_a_few_widths_and_cpu_batches_at_their_longest(tiny_checkpoint):
    """On CUDA a batch is padded to a multiple of CUDA_PAD_MULTIPLE, never past max_len, so a trial's process meets a
    few shapes; on the CPU to its longest sequence."""
    import torch

    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.heads.base import CUDA_PAD_MULTIPLE
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import load_checked_tokenizer

    head = head_for(get_task("tweets"), load_checked_tokenizer(tiny_checkpoint), max_len=100)
    short, longer, longest = [7] * 3, [7] * (CUDA_PAD_MULTIPLE + 6), [7] * 100
    ids, mask = head.batch([short, longer])
    assert ids.shape == mask.shape == (2, CUDA_PAD_MULTIPLE + 6) and mask.sum().item() == 3 + CUDA_PAD_MULTIPLE + 6
    assert (ids[0, 3:] == head.pad_id).all()
    head.device = torch.device("cuda")  # the width depends on the device's type only
    assert head.width([short]) == CUDA_PAD_MULTIPLE
    assert head.width([short, longer]) == 100  # 128, capped at max_len
    assert head.width([longest]) == 100


def test_the_same_seed_gives_the_same_scores(tiny_checkpoint):
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    first, second = (run_trial(TrialSpec.plain(tiny_checkpoint, "wiki_topics", lr=1e-3, seed=3), cfg=TINY_RUN) for _ in range(2))
    assert first.val_score == second.val_score
    assert first.test_per_example == second.test_per_example


def test_a_trial_reads_its_checkpoint_from_a_bucket(tiny_checkpoint, s3_bucket):
    """The same checkpoint in a bucket fine-tunes to the same scores as on disk (copied once into the node's cache)."""
    import uuid

    import pyarrow.fs as pafs

    from raybiphase import storage
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import resolve_hf_dir, run_trial

    uri = f"{s3_bucket}/{uuid.uuid4().hex}/step-00000008"  # checkpoint folders are never rewritten: a fresh one
    fs, path = storage.filesystem(storage.hf_dir(uri))
    pafs.copy_files(str(tiny_checkpoint), path, destination_filesystem=fs)
    remote = run_trial(TrialSpec.plain(uri, "tweets", lr=5e-4, seed=0), cfg=TINY_RUN)
    local = run_trial(TrialSpec.plain(tiny_checkpoint, "tweets", lr=5e-4, seed=0), cfg=TINY_RUN)
    assert remote.test_per_example == local.test_per_example and remote.val_score == local.val_score
    copy = resolve_hf_dir(uri)
    assert copy != tiny_checkpoint and (copy / "config.json").read_bytes() == (tiny_checkpoint / "config.json").read_bytes()
    with pytest.raises(UserError, match="does not exist"):
        run_trial(TrialSpec.plain(uri.replace("00000008", "00000009"), "tweets", lr=5e-4, seed=0), cfg=TINY_RUN)


def test_a_trial_whose_loss_turns_nan_is_recorded_as_diverged_and_scores_the_floor(tiny_checkpoint):
    """A diverged seed counts against its LR at the metric's floor: the majority class for accuracy."""
    from raybiphase.finetune.baselines import floor_scores
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    reports = []
    result = run_trial(TrialSpec.plain(tiny_checkpoint, "tweets", lr=1e9, seed=0), cfg=TINY_RUN, report=reports.append)
    floor = floor_scores("tweets", max_examples=TINY_RUN.max_examples)
    assert result.diverged and 0 < result.val_score == floor["val_score"] < 1
    assert result.test_score == floor["test_score"] == sum(result.test_per_example) / 48
    assert reports[-1]["final"] is not None and reports[-1]["val_score"] == floor["val_score"]
    row = TrialSpec.plain(tiny_checkpoint, "tweets", lr=1e9, seed=0).finished(result)
    assert row.diverged and row.test_score == floor["test_score"]
    healthy = run_trial(TrialSpec.plain(tiny_checkpoint, "tweets", lr=5e-4, seed=0), cfg=TINY_RUN)
    assert healthy.diverged is False and not math.isnan(healthy.test_score)
    commas = floor_scores("squad_commas", max_examples=48)  # no entity predicted: F1 0, each sentence's gold kept
    assert commas["test_score"] == 0.0 and len(commas["test_per_example"]) == 48


@pytest.mark.gpu
@pytest.mark.parametrize("task", ["tweets", "squad_retrieval"])  # a classification model and the bare encoder
def test_a_compiled_gpu_trial_scores_like_the_eager_one(tiny_checkpoint, task):
    """finetune.compile: each block compiled, the trial's scores within bf16 noise of the eager trial's."""
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    cfg = dataclasses.replace(TINY_RUN, gpus_per_trial=1)
    eager, compiled = (run_trial(TrialSpec.plain(tiny_checkpoint, task, lr=1e-3, seed=0),
                                 cfg=dataclasses.replace(cfg, compile=flag)) for flag in (False, True))
    assert abs(compiled.val_score - eager.val_score) < 0.1 and abs(compiled.test_score - eager.test_score) < 0.1


def test_a_gpu_trial_on_a_node_without_cuda_is_a_one_line_error(tiny_checkpoint):
    import torch

    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    if torch.cuda.is_available():
        pytest.skip("this node has CUDA")
    with pytest.raises(UserError, match="finetune.gpus_per_trial: 0.5 asked for, but this node's torch sees no CUDA"):
        run_trial(TrialSpec.plain(tiny_checkpoint, "tweets", lr=5e-4, seed=0), cfg=dataclasses.replace(TINY_RUN, gpus_per_trial=0.5))


@pytest.mark.gpu
@pytest.mark.parametrize("task", ["tweets", "squad_shuffle", "squad_commas", "squad_sentence", "squad_retrieval"])
def test_a_gpu_trial_trains_on_cuda_in_bf16_and_scores_like_cpu(tiny_checkpoint, task):
    """Every family runs on the trial's GPU (bf16 autocast); the scores are in range and close to the CPU's."""
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    cfg = dataclasses.replace(TINY_RUN, max_len=96)
    gpu = run_trial(TrialSpec.plain(tiny_checkpoint, task, lr=1e-3, seed=0), cfg=dataclasses.replace(cfg, gpus_per_trial=1))
    cpu = run_trial(TrialSpec.plain(tiny_checkpoint, task, lr=1e-3, seed=0), cfg=cfg)
    assert 0.0 <= gpu.test_score <= 1.0 and len(gpu.test_per_example) == len(cpu.test_per_example)
    assert abs(gpu.test_score - cpu.test_score) < 0.25


def test_trial_resources_follow_the_finetune_settings():
    from raybiphase.finetune.records import trial_settings
    from raybiphase.finetune.tuner import trial_resources

    assert trial_resources(FinetuneConfig()) == {"cpu": 1.0}
    assert trial_resources(FinetuneConfig(cpus_per_trial=4, gpus_per_trial=0.25)) == {"cpu": 4, "gpu": 0.25}
    # bf16 on a GPU and a longer input give other results: their records are not reused
    base = trial_settings(FinetuneConfig())
    assert trial_settings(FinetuneConfig(cpus_per_trial=4)) == base
    assert trial_settings(FinetuneConfig(gpus_per_trial=0.5)) != base != trial_settings(FinetuneConfig(max_len=512))
    assert trial_settings(FinetuneConfig(max_eval_examples=800)) != base
    assert trial_settings(FinetuneConfig(tc_labels="first_subtoken")) != base
    assert trial_settings(FinetuneConfig(ir_relevance="graded")) != base
    assert trial_settings(FinetuneConfig(compile=True)) == base  # compiled kernels only round differently
    # pinned: a digest changes only on purpose (records.PROTOCOL: records of an older protocol are redone)
    assert base == "c2d55968"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["squad_shuffle", "squad_bio", "squad_commas", "squad", "squad_sentence",
                                  "squad_retrieval", "qnli"])
def test_every_family_trains_and_scores(tiny_checkpoint, task):
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.tasks import get_task
    from raybiphase.finetune.trial import run_trial

    result = run_trial(TrialSpec.plain(tiny_checkpoint, task, lr=1e-3, seed=0), cfg=dataclasses.replace(TINY_RUN, max_len=96))
    assert 0.0 <= result.val_score <= 1.0 and 0.0 <= result.test_score <= 1.0
    assert len(result.test_per_example) == 48
    if get_task(task).family == "QA":
        assert result.secondary_metric == "exact_match" and 0.0 <= result.test_secondary <= result.test_score


@pytest.mark.parametrize("task", ["squad", "squad_sentence"])
def test_qa_training_targets_point_at_the_answer_text(tiny_checkpoint, task):
    from transformers import AutoTokenizer

    from raybiphase.data import sources
    from raybiphase.finetune import scoring
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import answer_sentences, get_task

    head = head_for(get_task(task), AutoTokenizer.from_pretrained(str(tiny_checkpoint)), 64)
    records = sources.squad("dev")[:150] if task == "squad" else answer_sentences(sources.squad("dev")[:150])
    matched = total = 0
    for record in records:
        windows = {tuple(w["ids"]): w for w in head.windows(record)}
        for ids, (start, end), _ in head.train_units([record]):
            if (start, end) == (0, 0):
                continue  # a window without the answer (test_qa_keeps_windows_without_the_answer_pointing_at_0)
            window = windows[tuple(ids)]
            begin, stop = window["offsets"][start - window["first"]][0], window["offsets"][end - window["first"]][1]
            found = scoring.normalize_answer(record["context"][begin:stop])
            matched += found == scoring.normalize_answer(record["answers"]["text"][0])
            total += 1
    assert total >= 0.95 * len(records) and matched / total > 0.98  # the rest: answers that end inside a subword ("7" of "1970")


def test_qa_picks_the_best_valid_span_across_windows():
    from raybiphase.finetune.heads.qa import QuestionAnsweringHead
    from raybiphase.finetune.tasks import get_task

    head = QuestionAnsweringHead.__new__(QuestionAnsweringHead)
    head.task = get_task("squad")
    record = {"context": "alpha beta gamma delta"}
    windows = [{"first": 2, "offsets": [(0, 5), (5, 10), (10, 16)]}, {"first": 2, "offsets": [(10, 16), (16, 22)]}]
    first, second = np.zeros((5, 2)), np.zeros((6, 2))
    first[4, 0], first[3, 1] = 5.0, 5.0  # end before start: invalid
    second[2, 0], second[3, 1] = 3.0, 4.0  # "gamma delta"
    assert head._best_span(record, windows, [first, second]) == "gamma delta"


def test_qa_keeps_windows_without_the_answer_pointing_at_0(tiny_checkpoint):
    """As transformers' run_qa: every window of the context trains; one without the answer points at position 0."""
    from transformers import AutoTokenizer

    from raybiphase.data import sources
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task

    head = head_for(get_task("squad"), AutoTokenizer.from_pretrained(str(tiny_checkpoint)), 48)
    record = next(r for r in sources.squad("dev") if len(head.windows(r)) >= 4)
    windows, units = head.windows(record), head.train_units([record])
    assert [ids for ids, _, _ in units] == [w["ids"] for w in windows]  # one unit per window, none dropped
    assert [first for _, _, first in units] == [w["first"] for w in windows]  # where each window's context starts
    empty = [target for _, target, _ in units if target == (0, 0)]
    assert 0 < len(empty) < len(units)  # some windows hold the answer, the others point at position 0


def test_qa_never_predicts_position_0_for_squad_v1():
    """Position 0 is trained as "no answer here", but a SQuAD v1.1 prediction is always a context span; only
    SQuAD v2 lets the empty answer win."""
    from raybiphase.finetune.heads.qa import QuestionAnsweringHead
    from raybiphase.finetune.tasks import get_task

    head = QuestionAnsweringHead.__new__(QuestionAnsweringHead)
    record = {"context": "alpha beta gamma"}
    windows = [{"first": 2, "offsets": [(0, 5), (5, 10), (10, 16)]}]
    scores = np.zeros((6, 2))
    scores[0] = 50.0  # position 0 scores far above every span
    scores[3, 0], scores[3, 1] = 1.0, 1.0  # "beta"
    head.task = get_task("squad")
    assert head._best_span(record, windows, [scores]) == "beta"
    head.task = get_task("squad_v2")
    assert head._best_span(record, windows, [scores]) == ""


def test_tc_trains_every_sub_token_of_a_word_on_its_tag_or_only_the_first(tiny_checkpoint):
    from transformers import AutoTokenizer

    from raybiphase.data.masking import IGNORE_INDEX
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task

    tokenizer, task = AutoTokenizer.from_pretrained(str(tiny_checkpoint)), get_task("squad_bio")
    record = {"words": ["Parisianisms", "are", "worldly"], "tags": ["B-ANS", "I-ANS", "O"]}
    pieces = [len(tokenizer((" " if i else "") + word, add_special_tokens=False)["input_ids"])
              for i, word in enumerate(record["words"])]
    assert pieces[0] > 2  # the first word is split into sub-tokens
    tags = [task.label_names.index(tag) for tag in record["tags"]]

    every = head_for(task, tokenizer, 64)  # the default: the authors' labelling
    [(ids, labels)] = every.train_units([record])
    assert labels == [IGNORE_INDEX] + [tag for tag, n in zip(tags, pieces) for _ in range(n)] + [IGNORE_INDEX]
    assert len(ids) == sum(pieces) + 2

    first = head_for(task, tokenizer, 64, tc_labels="first_subtoken")
    [(first_ids, first_labels)] = first.train_units([record])
    starts = [x for tag, n in zip(tags, pieces) for x in [tag] + [IGNORE_INDEX] * (n - 1)]
    assert first_ids == ids and first_labels == [IGNORE_INDEX] + starts + [IGNORE_INDEX]


def test_tc_votes_per_word_over_its_sub_tokens_ties_to_the_higher_summed_probability():
    from raybiphase.finetune.heads.tc import word_predictions

    probabilities = np.array([
        [0.1, 0.8, 0.1],  # <bos>: no word
        [0.6, 0.3, 0.1],  # word 0: votes 0
        [0.2, 0.7, 0.1],  # word 0: votes 1
        [0.1, 0.5, 0.4],  # word 0: votes 1 -> 1 wins, two votes to one
        [0.5, 0.1, 0.4],  # word 1: votes 0 (tied tags summed: 0 -> 0.8, 2 -> 1.0)
        [0.3, 0.1, 0.6],  # word 1: votes 2 -> the tie goes to 2
        [0.9, 0.05, 0.05],  # <eos>
    ])
    words = [-1, 0, 0, 0, 1, 1, -1]
    assert word_predictions(probabilities, words, 3) == [1, 2, None]  # word 2 was cut off: no tokens, no vote


def test_tc_evaluation_predicts_a_word_by_its_sub_tokens_vote(tiny_checkpoint):
    """A word whose first sub-token alone says "O" but whose other sub-tokens say "B-ANS" is predicted B-ANS;
    under first_subtoken it is predicted at its first sub-token."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoTokenizer

    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task

    task = get_task("squad_bio")
    record = {"words": ["Parisianisms", "rock"], "tags": ["B-ANS", "O"]}

    def score(tc_labels: str) -> float:
        head = head_for(task, AutoTokenizer.from_pretrained(str(tiny_checkpoint)), 64, tc_labels=tc_labels)
        [(_, ids, _)] = prepared = head.prepare_eval([record])
        [(_, labels)] = head_for(task, head.tokenizer, 64).train_units([record])  # every sub-token's word tag
        logits = torch.full((1, len(ids), 3), -5.0)
        logits[0, :, 0] = 5.0  # "O" everywhere ...
        later = [p for p, tag in enumerate(labels) if tag == 1][1:]
        assert len(later) >= 2
        logits[0, later] = torch.tensor([-5.0, 5.0, -5.0])  # ... but at the first word's later sub-tokens
        return head.evaluate(lambda input_ids, attention_mask: SimpleNamespace(logits=logits), prepared).score

    assert score("all_subtokens") == 1.0 and score("first_subtoken") == 0.0


def test_tc_labels_is_a_checked_setting():
    from raybiphase.config import ConfigError

    assert FinetuneConfig().tc_labels == "all_subtokens"
    with pytest.raises(ConfigError, match="finetune.tc_labels") as err:
        from_dict(SweepSpec, {"finetune": {"tc_labels": "every_token"}})
    assert "\n" not in str(err.value)


def test_a_max_len_beyond_the_checkpoints_positions_is_a_one_line_user_error(tiny_checkpoint, tmp_path):
    import json

    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    short = tmp_path / "short"  # as `raybiphase export` writes a run pretrained on 64-token blocks
    shutil.copytree(tiny_checkpoint, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(UserError, match="finetune.max_len: 128 exceeds the 64 positions") as err:
        run_trial(TrialSpec.plain(short, "tweets", lr=1e-4, seed=0), cfg=dataclasses.replace(TINY_RUN, max_len=128))
    assert "\n" not in str(err.value)
    result = run_trial(TrialSpec.plain(short, "tweets", lr=1e-4, seed=0), cfg=dataclasses.replace(TINY_RUN, max_len=64, max_steps=2))
    assert 0.0 <= result.test_score <= 1.0  # at the length it was trained on, it fine-tunes


def test_bad_checkpoints_and_tasks_are_one_line_user_errors(tiny_checkpoint, tmp_path):
    from raybiphase.finetune.spec import TrialSpec
    from raybiphase.finetune.trial import run_trial

    def error(hf_dir, task="tweets") -> str:
        with pytest.raises(UserError) as err:
            run_trial(TrialSpec.plain(hf_dir, task, lr=1e-4, seed=0), cfg=TINY_RUN)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "does not exist" in error(tmp_path / "nowhere")
    assert "unknown task 'nope'" in error(tiny_checkpoint, "nope")
    (tmp_path / "empty").mkdir()
    assert "no config.json" in error(tmp_path / "empty")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_checkpoint / name, bare / name)
    assert "has no tokenizer" in error(bare)
    other = make_tiny_checkpoint(tmp_path / "other", vocab_size=1536)
    mismatched = tmp_path / "mismatched"
    shutil.copytree(bare, mismatched)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(other / name, mismatched / name)
    assert "do not belong together" in error(mismatched)
    shutil.copytree(mismatched, tmp_path / "checkpoint" / "hf")
    assert "do not belong together" in error(tmp_path / "checkpoint")  # a checkpoint folder leads to its hf/


def test_checkpoints_sharing_a_tokenizer_share_its_tokenized_splits_yet_each_is_checked(tiny_checkpoint, tmp_path):
    import json

    from raybiphase.finetune import trial

    first = trial._tokenized(tiny_checkpoint, "tweets", (16, 0), 64, "auto")
    twin = tmp_path / "twin"  # another checkpoint of the same sweep: other weights, the same tokenizer
    shutil.copytree(tiny_checkpoint, twin)
    assert trial._tokenized(twin, "tweets", (16, 0), 64, "auto") is first  # tokenized once per process
    config = json.loads((twin / "config.json").read_text())
    (twin / "config.json").write_text(json.dumps({**config, "vocab_size": 10}))
    with pytest.raises(UserError, match="do not belong together"):
        trial._tokenized(twin, "tweets", (16, 0), 64, "auto")
