"""Tasks that train on another's pairs share its trial. nq and mldr train on MS MARCO's pairs, so one trial per
checkpoint, LR and seed trains the model and scores it on each task's own validation and test splits; each task
keeps its own row, with its own validation score (each chooses its LR on its own validation, as the authors'
evaluation code does). The scheduler's trial runner is replaced by a recorder (no Ray, no hub); the trial-level
mechanism runs on offline retrieval tasks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from raybiphase.config import FinetuneConfig, SweepSpec, from_dict
from raybiphase.errors import UserError
from raybiphase.finetune import records
from raybiphase.finetune.spec import FinetuneSource, TrialSpec
from tests.finetune.recording import recording, result
from tests.finetune.test_finetune import make_tiny_checkpoint

RETRIEVAL = ["msmarco", "nq", "mldr"]
TINY_IR = FinetuneConfig(batch_size=8, max_steps=4, eval_every=4, max_examples=32)


@pytest.fixture(scope="module")
def checkpoint(offline_cache, tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("train-task") / "hf")


@pytest.fixture(scope="module")
def one_torch_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ grouping


@pytest.mark.parametrize("tasks, groups", [
    (["msmarco", "nq", "mldr"], {"msmarco": ("msmarco", "nq", "mldr")}),  # the training task trains
    (["mldr", "msmarco", "nq"], {"msmarco": ("msmarco", "mldr", "nq")}),  # wherever it is listed
    (["nq", "mldr"], {"nq": ("nq", "mldr")}),  # msmarco not asked for: the first listed trains
    (["nq", "sst2"], {"nq": ("nq",), "sst2": ("sst2",)}),  # alone in its group: trains for itself
    (["tweets", "squad_retrieval"], {"tweets": ("tweets",), "squad_retrieval": ("squad_retrieval",)}),
])
def test_tasks_sharing_a_training_task_form_one_group_trained_once(tasks, groups):
    from raybiphase.finetune.tasks import training_groups

    assert training_groups(tasks) == groups
    assert list(training_groups(tasks)) == list(groups)  # in the order of their first task listed


def test_the_planned_trials_are_the_trained_ones_and_every_task_keeps_its_row():
    from raybiphase.finetune import fanout

    cfg = from_dict(SweepSpec, {"finetune": {"tasks": ["nq", "sst2", "msmarco", "mldr"], "lrs": [1e-4, 2e-3],
                                             "seeds": [0, 1]}}).finetune
    source = FinetuneSource("a", 8, "/nowhere/hf", {"phases.steps": 8})
    rows = fanout.plan_specs([source], cfg, experiment="/x")
    trials = fanout.plan_trials([source], cfg, experiment="/x")
    assert len(rows) == 16 and len(trials) == 8  # 4 tasks x 2 LRs x 2 seeds; msmarco and sst2 train
    assert [t.task.name for t in trials] == ["sst2"] * 4 + ["msmarco"] * 4
    settings = records.trial_settings(cfg)
    for trial in (t for t in trials if t.task.name == "msmarco"):
        riders = trial.riders
        assert [r.task.name for r in riders] == ["nq", "mldr"]
        assert all(r.key[:2] == trial.key[:2] and r.key[3:] == trial.key[3:] for r in riders)
        assert all(r.record == records.record_path("/x", r.key, settings) for r in [trial, *riders])
        assert all(fanout.trained_in(r, cfg.tasks, "/x", settings) == trial for r in riders)
    assert all(t.riders == () for t in trials if t.task.name == "sst2")


# ------------------------------------------------------------------------------------------------ the fan-out


def _spec(tasks, **finetune):
    return from_dict(SweepSpec, {"finetune": {"tasks": tasks, "lrs": [1e-4, 2e-3], "seeds": [0, 1], "batch_size": 8,
                                              "max_steps": 9, "eval_every": 3, "max_examples": 64, **finetune}})


def _recording(launched: list, stop=frozenset()):
    """Each trial 'runs' to a result like run_trial's (its riders' under `also_tested`) unless ASHA is on and its
    (lr, seed) is in `stop` (stopped at step 3: no record); ended with the last report Tune would give."""
    def outcome(spec: TrialSpec) -> dict:
        rows = {}
        if not (spec.asha and (spec.lr, spec.seed) in stop):
            tests = {r.task.name: result(r.task, val=_validation(spec.lr, r.task.name), test=0.1 * (i + 2))
                     for i, r in enumerate(spec.riders)}
            rows = fanout.record_final(spec, result(spec.task, val=_validation(spec.lr, spec.task.name), test=0.1,
                                                    also_tested=tests))
        return {"val_score": 0.5, **{fanout.rider_metric(r.task.name): 0.4 for r in spec.riders}, "step": 3,
                "time_total_s": 2.0, **rows}

    from raybiphase.finetune import fanout

    return recording(launched, outcome)


def _run(sources, spec, tmp_path, launched, *, name="ft", stop=frozenset(), done=frozenset(), complete_best=True):
    """The fan-out of `sources` through the scheduler, on the recorder."""
    from raybiphase.finetune.fanout import Fanout
    from raybiphase.sweep.scheduler import finetune_checkpoints

    cfg = dataclasses.replace(Fanout.of(spec), complete_best=complete_best)
    return finetune_checkpoints(sources, cfg, storage=str(tmp_path), name=name, done=done,
                                trials=_recording(launched, stop))


def _validation(lr: float, task: str) -> float:
    """A finished trial's validation score of `task` in the recorder: each task's own."""
    return 0.6 + lr + 0.01 * RETRIEVAL.index(task)


@pytest.mark.parametrize("tasks, trained", [(RETRIEVAL, "msmarco"), (["nq", "mldr"], "nq")])
def test_one_trial_per_checkpoint_lr_and_seed_trains_for_the_group_and_every_task_gets_its_row(
        checkpoint, tmp_path, monkeypatch, tasks, trained):
    from raybiphase.finetune import fanout

    source = FinetuneSource("a", 8, str(checkpoint), {"phases.steps": 8},
                            shared_by=(FinetuneSource("b", 8, str(checkpoint), {"phases.steps": 16}),))
    launched = []
    rows = _run([source], _spec(tasks), tmp_path, launched)

    assert len(launched) == 4  # 2 LRs x 2 seeds, once for every task of the group
    assert {c.task.name for c in launched} == {trained} and {c.run for c in launched} == {"a"}
    assert all(c.group == ("a", 8, trained) for c in launched)  # one ASHA: the trained trials
    riders = [t for t in tasks if t != trained]
    assert all([r.task.name for r in c.riders] == riders for c in launched)
    for config in launched:  # three rows per launch (two when msmarco is not asked for), each its task's own
        lr, seed = config.lr, config.seed
        own = sorted((r for r in rows if (r["run"], r["lr"], r["seed"]) == ("a", lr, seed)), key=lambda r: r["task"])
        assert sorted(r["task"] for r in own) == sorted(tasks)
        assert all(r["dataset"] == fanout.get_task(r["task"]).dataset for r in own)
        assert [r["val_score"] for r in own] == [_validation(lr, r["task"]) for r in own]  # each task's own
        assert len({r["test_score"] for r in own}) == len(tasks)  # each scored on its own test set
    # a run sharing the checkpoint gets copies of every task's rows
    assert sorted((r["task"], r["lr"], r["seed"]) for r in rows if r["run"] == "b") == \
        sorted((r["task"], r["lr"], r["seed"]) for r in rows if r["run"] == "a")
    assert len(rows) == 2 * 4 * len(tasks)

    # resumed: every task's row is read back from its record, nothing launches
    launched.clear()
    again = _run([source], _spec(tasks), tmp_path, launched)
    assert launched == [] and sorted(map(_key, again)) == sorted(map(_key, rows))
    # a rider's row alone missing from the table reruns the trial that trains its model, and only its row returns
    settings = records.trial_settings(_spec(tasks).finetune)
    Path(records.record_path(str(tmp_path / "ft"), ("a", 8, riders[0], 1e-4, 0), settings)).unlink()
    done = {_key(r)[:5] for r in rows} - {(run, 8, riders[0], 1e-4, 0) for run in "ab"}
    again = _run([source], _spec(tasks), tmp_path, launched, done=done)
    assert [(c.task.name, c.lr, c.seed) for c in launched] == [(trained, 1e-4, 0)]
    assert sorted((r["run"], r["task"]) for r in again) == [("a", riders[0]), ("b", riders[0])]
    # ASHA stopping that rerun gives the rider a stopped row and leaves the trained task's record as it was
    rider = records.record_path(str(tmp_path / "ft"), ("a", 8, riders[0], 1e-4, 0), settings)
    Path(rider).unlink()
    again = _run([source], _spec(tasks), tmp_path, launched, done=done, stop={(1e-4, 0)}, complete_best=False)
    assert [r["stopped_early"] for r in again] == [True, True] and records.read_record(rider).stopped_early
    own = records.read_record(records.record_path(str(tmp_path / "ft"), ("a", 8, trained, 1e-4, 0), settings))
    assert not own.stopped_early and own.val_score == _validation(1e-4, trained)


def _key(row: dict) -> tuple:
    return row["run"], row["pretrain_step"], row["task"], row["lr"], row["seed"], row["test_score"]


def test_a_stopped_trial_stops_every_task_of_its_group_and_the_completion_pass_reruns_it_once(checkpoint, tmp_path,
                                                                                            monkeypatch):

    launched = []
    # 2e-3 leads on its finished seed (0.602 > 0.6001) for every task, so its stopped seed 1 is completed once
    source = FinetuneSource("a", 8, str(checkpoint))
    rows = _run([source], _spec(RETRIEVAL, asha=True), tmp_path, launched, stop={(2e-3, 1)})
    first, completion = launched[:4], launched[4:]
    assert [(c.task.name, c.lr, c.seed, c.asha) for c in completion] == [("msmarco", 2e-3, 1, False)]
    cell = sorted((r for r in rows if (r["lr"], r["seed"]) == (2e-3, 1)), key=lambda r: r["task"])
    assert [r["task"] for r in cell] == ["mldr", "msmarco", "nq"]
    assert all(r["completed_after_stop"] and r["steps_run"] == 3 + 9 and not math.isnan(r["test_score"])
               for r in cell)
    assert len(first) == 4 and len(rows) == 12

    # without completion the group's rows stay stopped; with ASHA then turned off, they are one trial to run again
    launched.clear()
    stopped = _run([source], _spec(RETRIEVAL, asha=True), tmp_path, launched, name="ft2", stop={(1e-4, 1)},
                   complete_best=False)
    cell = [r for r in stopped if (r["lr"], r["seed"]) == (1e-4, 1)]
    assert sorted(r["task"] for r in cell) == sorted(RETRIEVAL)
    assert all(r["stopped_early"] and r["steps"] == 3 and math.isnan(r["test_score"]) for r in cell)
    assert {r["task"]: r["val_score"] for r in cell} == {"msmarco": 0.5, "nq": 0.4, "mldr": 0.4}  # each its own
    launched.clear()
    _run([source], _spec(RETRIEVAL, asha=False), tmp_path, launched, name="ft2", complete_best=False)
    assert [(c.task.name, c.lr, c.seed) for c in launched] == [("msmarco", 1e-4, 1)]


def test_a_trial_retried_after_it_finished_reports_its_journaled_rows_and_trains_nothing(tmp_path, monkeypatch):
    """Tune runs a trial again when its process ended after it journaled its rows but before its last report
    arrived (a lost node): the rerun reports the journaled rows at once, so the finished rows stand and ASHA, which
    might stop a rerun early, never replaces them with stopped ones."""
    import ray.tune

    from raybiphase.finetune import fanout, tuner

    spec = fanout.plan_trials([FinetuneSource("a", 8, "/nowhere/hf")], _spec(RETRIEVAL).finetune,
                              experiment=str(tmp_path))[0]
    cfg, config = _spec(RETRIEVAL).finetune, {"spec": spec.to_config()}
    reports = []
    monkeypatch.setattr(ray.tune, "report", reports.append)
    monkeypatch.setattr(tuner, "run_trial", lambda spec, cfg, report: report(
        {"step": 3, "val_score": 0.5, "also_val": {r.task.name: 0.4 for r in spec.riders}}))
    tuner._trainable(config, cfg)  # no record yet: it trains (here, one report at step 3 that ASHA could stop)
    assert reports == [{"step": 3, "val_score": 0.5, **{fanout.rider_metric(t): 0.4 for t in ("nq", "mldr")}}]

    tests = {r.task.name: result(r.task, val=0.3, test=0.2) for r in spec.riders}
    value = fanout.record_final(spec, result(spec.task, val=0.7, test=0.1, also_tested=tests))
    reports.clear()
    monkeypatch.setattr(tuner, "run_trial", lambda *a, **k: pytest.fail("a finished trial trained again"))
    tuner._trainable(config, cfg)
    (rerun,) = reports
    assert rerun[fanout.ROWS] == value[fanout.ROWS] and rerun["step"] == 9 and rerun["val_score"] == 0.7
    rows = fanout.trial_rows(spec, rerun, failed=False)
    assert [r.task for r in rows] == ["msmarco", "nq", "mldr"] and not any(r.stopped_early for r in rows)


# ------------------------------------------------------------------------------------------------ the trial


@pytest.mark.slow  # two retrieval trials and an evaluation
def test_a_trial_tests_the_model_it_trained_on_each_extra_test_split(checkpoint, one_torch_thread, monkeypatch):
    """squad_retrieval's model scored on wiki_retrieval's test split too (offline stand-ins for msmarco and nq): the
    same model as the plain trial's, and the score evaluating that split with it gives."""
    from raybiphase.finetune import fanout
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.heads.ir import RetrievalHead
    from raybiphase.finetune.tasks import get_task, load_splits
    from raybiphase.finetune.trial import load_checked_tokenizer, run_trial

    plain = run_trial(TrialSpec.plain(checkpoint, "squad_retrieval", lr=1e-3, seed=0), cfg=TINY_IR)
    models, load_model = [], RetrievalHead.load_model
    monkeypatch.setattr(RetrievalHead, "load_model", lambda self, hf_dir: models.append(load_model(self, hf_dir))
                        or models[-1])
    reports = []
    riding = run_trial(TrialSpec.plain(checkpoint, "squad_retrieval", lr=1e-3, seed=0, also_test=("wiki_retrieval",)),
                       cfg=TINY_IR, report=reports.append)
    assert plain.also_tested == {}
    assert riding.val_score == plain.val_score and riding.test_per_example == plain.test_per_example
    extra = riding.also_tested["wiki_retrieval"]
    assert extra.steps == plain.steps == 4
    assert extra.metric == "ndcg@10" and extra.secondary_metric == "mrr@10" and not extra.diverged

    (model,) = models  # the trained model, evaluated here on wiki_retrieval's test split
    head = head_for(get_task("wiki_retrieval"), load_checked_tokenizer(checkpoint), TINY_IR.max_len)
    splits = load_splits(get_task("wiki_retrieval"), max_examples=TINY_IR.max_examples)
    test = splits.test
    evaluation = head.evaluate(model.eval(), head.prepare_eval(test))
    validation = head.evaluate(model, head.prepare_eval(splits.val)).score  # its own validation, not squad's
    assert extra.val_score == validation != plain.val_score
    assert reports[-1]["also_val"] == {"wiki_retrieval": validation}
    assert extra.test_score == evaluation.score and extra.test_per_example == evaluation.per_example
    assert extra.test_secondary == evaluation.secondary and len(extra.test_per_example) == len(test["queries"])
    assert extra.test_per_example != riding.test_per_example

    # the fan-out's records: one row per task from the trial's last report, each built from its spec and result
    spec = dataclasses.replace(TrialSpec.plain(checkpoint, "squad_retrieval", lr=1e-3, seed=0,
                                               also_test=("wiki_retrieval",)), run="r", pretrain_step=8)
    spec = TrialSpec.from_config(spec.to_config())  # what the trial's process reads from Tune's config
    written = {}
    monkeypatch.setattr(fanout, "write_record", lambda location, row: written.setdefault(row.task, row))
    value = fanout.record_final(spec, reports[-1]["final"])
    assert list(written) == ["wiki_retrieval", "squad_retrieval"]  # the riders' first: the trial's own last
    rows = fanout.trial_rows(spec, value, failed=False)  # the driver's, from the last report: the rows journaled
    assert [r.record() for r in rows] == [written[task].record() for task in ("squad_retrieval", "wiki_retrieval")]
    assert written["wiki_retrieval"].test_score == evaluation.score
    assert written["wiki_retrieval"].val_score == validation and written["squad_retrieval"].val_score == plain.val_score


def test_a_task_of_another_family_cannot_ride_along(checkpoint):
    from raybiphase.finetune.trial import run_trial

    with pytest.raises(UserError, match="cannot be tested on a model trained for 'squad_retrieval'"):
        run_trial(TrialSpec.plain(checkpoint, "squad_retrieval", lr=1e-3, seed=0, also_test=("tweets",)), cfg=TINY_IR)
