"""The decontamination rule on its own (raybiphase.data.decontam): word 13-grams, short texts matched whole, a task
mask per document; and how its settings enter the shards' fingerprint, the run's identity and a sweep. No Ray."""

from __future__ import annotations

import pytest

from raybiphase.config import DataConfig, RunConfig, SweepSpec, from_dict, run_hash
from raybiphase.data import decontam
from raybiphase.data.prepare import fingerprint
from raybiphase.errors import UserError

LONG = "The committee met on a grey Tuesday morning to decide the fate of the old harbour bridge."
SHORT = "An uneven but often hilarious comedy about grief."  # 8 words: matched whole
TINY = "A gripping film."  # under 8 words: not looked for
OTHER = "Quantum dots emit light of a colour set by their size, which chemists tune by growing them slowly."


def held(texts_by_task: dict[str, list[str]], n: int = 13) -> decontam.HeldOut:
    return decontam.HeldOut.build(sorted(texts_by_task), n, lambda task: texts_by_task[task])


def test_a_shared_13_gram_drops_a_document_whatever_its_case_and_punctuation():
    index = held({"sst2": [LONG]})
    words = LONG.split()
    thirteen = " ".join(words[2:15])  # "met on a ... old": 13 words of the text, inside a longer document
    twelve = " ".join(words[2:14])
    documents = [f"Minutes. {thirteen.upper()} -- adjourned.",
                 f"Minutes; {thirteen.replace(' ', ', ')}!",  # commas between every word
                 f"Minutes. {twelve} adjourned.",  # 12 words in a row: not an overlap
                 " ".join(reversed(words))]  # the same words, in another order
    assert index.overlaps(documents).tolist() == [1, 1, 0, 0]


def test_a_short_evaluation_text_is_matched_whole_and_a_tiny_one_not_at_all():
    index = held({"sst2": [SHORT, TINY]})
    assert index.short_lengths == (8,)
    documents = [f"Reviews: {SHORT.lower()} Three stars.", "an uneven but often hilarious comedy about loss",
                 f"Our verdict: {TINY}"]
    assert index.overlaps(documents).tolist() == [1, 0, 0]


def test_a_document_overlapping_two_tasks_carries_both_and_the_counts_take_it_under_each():
    index = held({"sst2": [LONG], "squad": [OTHER, LONG]})
    masks = index.overlaps([f"{LONG} {OTHER}", OTHER, "nothing to see here at all"])
    assert [index.task_names(m) for m in masks] == [["squad", "sst2"], ["squad"], []]
    dropped = decontam.DropCounts()
    kept = decontam.drop_overlapping(index, [LONG, OTHER, "clean"], [[1, 2], [3], [4, 5, 6]], dropped)
    assert kept == [[4, 5, 6]]
    assert dropped.as_record() == {"documents": 2, "tokens": 4 + 3, "per_task": {
        "squad": {"documents": 2, "tokens": 7}, "sst2": {"documents": 1, "tokens": 4}}}


def test_the_index_is_stable_across_processes_and_round_trips():
    index = held({"sst2": [LONG, SHORT], "squad": [OTHER]})
    again = decontam.HeldOut.from_bytes(index.to_bytes())
    assert (again.tasks, again.n, again.short_lengths) == (index.tasks, 13, (8,))
    assert (again.hashes == index.hashes).all() and (again.masks == index.masks).all()
    # blake2b of the normalised word, not Python's salted hash(): every Ray worker hashes a word alike
    assert decontam.word_hashes("Bridge!").tolist() == decontam.word_hashes("bridge").tolist() == [0x26C4BC17A58C0FEE]


def test_n_is_a_setting():
    documents = [" ".join(LONG.split()[:9])]
    assert held({"sst2": [LONG]}, n=13).overlaps(documents).tolist() == [0]
    assert held({"sst2": [LONG]}, n=8).overlaps(documents).tolist() == [1]


def test_the_settings_enter_the_fingerprint_and_the_run_identity_only_when_they_hold_something_out():
    plain, off = DataConfig(), DataConfig(decontaminate=False, decontam_tasks=("sst2",))
    sst2, both = DataConfig(decontam_tasks=("sst2",)), DataConfig(decontam_tasks=("squad", "sst2"))
    assert fingerprint(plain) == fingerprint(off) == fingerprint(DataConfig(decontam_ngram=8))
    assert len({fingerprint(plain), fingerprint(sst2), fingerprint(both),
                fingerprint(DataConfig(decontam_tasks=("sst2",), decontam_ngram=8))}) == 4
    assert fingerprint(both) == fingerprint(DataConfig(decontam_tasks=("sst2", "squad")))  # a set of tasks
    runs = [from_dict(RunConfig, {"data": {"decontam_tasks": list(tasks)}}) for tasks in ((), ("sst2",))]
    assert run_hash(runs[0]) == run_hash(RunConfig()) != run_hash(runs[1])


def test_a_sweep_holds_out_the_tasks_it_fine_tunes_on_unless_it_names_others():
    spec = from_dict(SweepSpec, {"finetune": {"tasks": ["sst2", "squad"]}})
    assert spec.run.data.decontam_tasks == ("sst2", "squad")
    named = from_dict(SweepSpec, {"finetune": {"tasks": ["sst2"]}, "data": {"decontam_tasks": ["sst2", "mnli"]}})
    assert named.run.data.decontam_tasks == ("sst2", "mnli")
    off = from_dict(SweepSpec, {"finetune": {"tasks": ["sst2"]}, "data": {"decontaminate": False}})
    assert off.run.data.decontamination() is None


def test_shards_made_with_other_settings_are_refused_in_one_line():
    manifest = {"decontamination": {"tasks": ["sst2"], "ngram": 13, "dropped": {}}}
    decontam.check_prepared(DataConfig(decontam_tasks=("sst2",)), manifest, "/data")
    with pytest.raises(UserError, match=r"^data.decontam_tasks: the shards at /data were made with 1 task\(s\) held "
                                        r"out by 13-grams \(sst2\), unlike this config \(nothing held out\)"):
        decontam.check_prepared(DataConfig(), manifest, "/data")
    with pytest.raises(UserError, match="made with nothing held out"):
        decontam.check_prepared(DataConfig(decontam_tasks=("sst2",)), {}, "/data")
