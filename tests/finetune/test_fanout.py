"""The Ray Tune fan-out over checkpoints x tasks x LRs x seeds: ASHA, resuming from records and rows, the
completion pass, the settings a row was made under, bad input refused before anything runs, and the capacity the
sweep gives it beside pretraining. (One trial: tests/finetune/test_finetune.py.)"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shutil
import time
import types
from pathlib import Path

import pytest

from raybiphase import storage
from raybiphase.config import SweepSpec, from_dict
from raybiphase.errors import UserError
from raybiphase.finetune import records, tuner
from raybiphase.finetune.spec import FinetuneSource, TrialSpec
from raybiphase.results.rows import FINETUNE_KEY, FinetuneRow, trial_key
from raybiphase.sweep.scheduler import finetune_checkpoints
from raybiphase.telemetry.console import Console
from tests.finetune.recording import recording
from tests.finetune.test_finetune import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_checkpoint(offline_cache, tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("fanout") / "hf")


def fanout_config(**finetune):
    base = {"tasks": ["tweets"], "lrs": [1e-4, 2e-3], "seeds": [0, 1], "batch_size": 8, "max_steps": 9,
            "eval_every": 3, "max_examples": 64, "asha": True}
    return from_dict(SweepSpec, {"finetune": {**base, **finetune}, "resources": {"max_concurrent": 2}})


@pytest.mark.ray
@pytest.mark.slow
def test_fanout_with_asha_gives_a_row_per_trial_and_resumes_without_recomputing(ray_cluster, tiny_checkpoint,
                                                                             tmp_path, monkeypatch):
    from raybiphase.finetune import fanout

    checkpoints = [FinetuneSource("tiny-run", 8, str(tiny_checkpoint), {"phases.clm_share": 0.5})]
    cfg = fanout_config()
    out = io.StringIO()
    logs: dict[str, str] = {}  # Tune's per-trial files, read as its private folder is removed when fine-tuning ends
    states: list[str] = []  # and its experiment state, each trial's last result in it

    def read_then_remove(path, **kwargs):
        logs.update({str(p.relative_to(path)): p.read_text() if p.name == "result.json" else ""
                     for p in Path(path).glob("**/trial_*/*") if p.is_file()})
        states.extend(p.read_text() for p in Path(path).glob("**/experiment_state*.json"))
        shutil.rmtree(path, **kwargs)

    monkeypatch.setattr(tuner, "shutil", types.SimpleNamespace(rmtree=read_then_remove))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    wandb = {"project": "raybiphase-test", "group": "ft", "mode": "offline", "sync_to": None}
    rows = finetune_checkpoints(checkpoints, dataclasses.replace(fanout.Fanout.of(cfg), wandb=wandb),
                                storage=str(tmp_path), name="ft", console=Console(out))
    # progress on the driver: the last trial always prints its line, stops by ASHA counted
    stopped = sum(r["stopped_early"] or r["completed_after_stop"] for r in rows)  # in the first launch
    finals = [x for x in out.getvalue().splitlines() if x.startswith("fine-tuning: 4/4 trials done")]
    assert finals and (f"({stopped} stopped by ASHA)" in finals[0]) == bool(stopped), out.getvalue()
    assert len(rows) == 4 and {(r["lr"], r["seed"]) for r in rows} == {(1e-4, 0), (1e-4, 1), (2e-3, 0), (2e-3, 1)}
    for row in rows:
        assert row["phases.clm_share"] == 0.5 and row["family"] == "SC" and row["metric"] == "accuracy"
        assert row["steps_run"] >= row["steps"] and 0.0 <= row["val_score"] <= 1.0
        if row["stopped_early"]:
            assert math.isnan(row["test_score"]) and row["steps"] < 8 and row["test_per_example"] == []
        else:
            assert 0.0 <= row["test_score"] <= 1.0 and len(row["test_per_example"]) == 64 and row["steps"] == 8
    best = fanout.best_lr(rows)
    assert all(not r["stopped_early"] for r in rows if r["lr"] == best)  # the completion pass ran them all
    assert {r[records.SETTINGS_COLUMN] for r in rows} == {records.trial_settings(cfg.finetune)}
    # the rows came back as values, and Tune's per-trial logs hold no copy of them (nor of per-example scores)
    results = [text for name, text in logs.items() if name.endswith("/result.json")]
    assert results and all(fanout.ROWS not in json.loads(line) for text in results for line in text.splitlines())
    assert not [name for name in logs if name.endswith("progress.csv") or "tfevents" in name], sorted(logs)
    assert states and not [text for text in states if "test_per_example" in text]  # it does not grow with rows
    assert not list(tmp_path.glob("**/trial_*")), "Tune's folders reached the sweep's storage"
    # W&B: the (checkpoint, task) run got a point as each trial ended (the completion pass's too), then its table
    from raybiphase.telemetry.wandb import stable_id
    from raybiphase.telemetry.wandb_files import logged

    (folder,) = (tmp_path / "wb" / "wandb").glob(f"offline-run-*-{stable_id('ft', 'finetune', 'tiny-run@8|tweets')}")
    found = logged(folder)
    points = [(h["trial/lr"], h["trial/seed"]) for h in found["history"] if "trial/lr" in h]
    assert len(points) >= 4 and set(points) == {(r["lr"], r["seed"]) for r in rows}
    assert found["summary"]["best_lr"] == best and any(h.get("trials/nrows") == 4 for h in found["history"])

    def no_launch(spec):
        raise AssertionError("a resumed fan-out launched trials")

    keys = {trial_key(r) for r in rows}
    resume = {"storage": str(tmp_path), "name": "ft", "trials": recording([], no_launch)}
    assert finetune_checkpoints(checkpoints, fanout.Fanout.of(cfg), done=keys, **resume) == []
    again = finetune_checkpoints(checkpoints, fanout.Fanout.of(cfg), **resume)  # records on disk, no `done`
    assert [trial_key(r) for r in again] == [trial_key(r) for r in rows]
    assert [r["val_score"] for r in again] == [r["val_score"] for r in rows]

    launched = []

    def fails(spec):  # launched, then failed: the fan-out says so
        raise OSError("not run here")

    def launch(cfg):
        with pytest.raises(RuntimeError, match="fine-tuning trials failed; first: .*OSError: not run here"):
            finetune_checkpoints(checkpoints, dataclasses.replace(fanout.Fanout.of(cfg), complete_best=False),
                                 storage=str(tmp_path), name="ft", trials=recording(launched, fails))

    launch(fanout_config(asha=False))
    assert sorted(t.key for t in launched) == sorted(trial_key(r) for r in rows if r["stopped_early"])
    launched.clear()  # records made under other trial settings are not reused
    launch(fanout_config(max_examples=32))
    assert len(launched) == 4


def test_a_finished_trials_rows_reach_the_driver_but_not_tunes_saved_state():
    """The callback takes a finished trial's rows out of its last report as Tune hands it over (Tune lets callbacks
    change a result in place before keeping it as the trial's last result, which its experiment state saves), and
    gives them back with the trial's end; a stopped or failed trial ends with its last report as it was."""
    from raybiphase.finetune.fanout import ROWS

    ended = []
    callback = tuner.TrialEndedCallback(lambda ticket, metrics, error: ended.append((ticket, metrics, error)))
    trials = {name: types.SimpleNamespace(trial_id=name, config={"ticket": i}, last_result=None,
                                          get_pickled_error=lambda: None, get_error=lambda: None)
              for i, name in enumerate(["finished", "stopped", "failed"])}

    def tune_reports(trial, result):  # what Tune's controller does with a result
        callback.on_trial_result(iteration=1, trials=[], trial=trial, result=result)
        trial.last_result = result

    tune_reports(trials["finished"], {"step": 9, "val_score": 0.7, ROWS: [{"task": "sst2"}]})
    tune_reports(trials["stopped"], {"step": 3, "val_score": 0.5})
    tune_reports(trials["failed"], {"step": 3, "val_score": 0.4})
    assert all(ROWS not in trial.last_result for trial in trials.values())  # what Tune keeps and saves
    callback.on_trial_complete(iteration=2, trials=[], trial=trials["finished"])
    callback.on_trial_complete(iteration=2, trials=[], trial=trials["stopped"])
    callback.on_trial_error(iteration=2, trials=[], trial=trials["failed"])
    assert ended[0] == (0, {"step": 9, "val_score": 0.7, ROWS: [{"task": "sst2"}]}, None)
    assert ended[1] == (1, {"step": 3, "val_score": 0.5}, None)
    assert ended[2][:2] == (2, {"step": 3, "val_score": 0.4}) and isinstance(ended[2][2], RuntimeError)
    assert callback.rows == {}


def test_a_table_of_trials_made_under_other_settings_is_refused_in_one_line(tmp_path):
    from raybiphase.results import store

    table = str(tmp_path / "finetune.parquet")
    cfg = fanout_config().finetune
    records.check_settings(table, cfg)  # no table yet
    row = {**FinetuneRow(run="r", pretrain_step=8, task="tweets", lr=1e-3, seed=0, test_score=0.5).record()}
    store.append_rows(table, [row], key=FINETUNE_KEY)  # a row from before the column: not checked
    records.check_settings(table, cfg)
    store.append_rows(table, [{**row, "seed": 1, records.SETTINGS_COLUMN: records.trial_settings(cfg)}], key=FINETUNE_KEY)
    records.check_settings(table, cfg)  # the same settings: resumed
    records.check_settings(table, dataclasses.replace(cfg, cpus_per_trial=2.0))  # resources are not results
    with pytest.raises(UserError) as err:
        records.check_settings(table, dataclasses.replace(cfg, max_steps=300))
    assert str(err.value).startswith(f"finetune: {table} holds trials fine-tuned under other settings")
    assert "sweep.name" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # a whole `raybiphase sweep` process: its imports (torch, Ray, transformers)
def test_a_sweep_over_trials_made_under_other_settings_stops_before_any_work(tmp_path):
    import subprocess
    import sys

    from raybiphase.results import store

    table = tmp_path / "quickstart" / "finetune.parquet"
    table.parent.mkdir()
    row = FinetuneRow(run="r", pretrain_step=8, task="squad_shuffle", lr=2e-3, seed=0, test_score=0.5).record()
    store.append_rows(table, [{**row, records.SETTINGS_COLUMN: "0ther5et"}], key=FINETUNE_KEY)
    proc = subprocess.run([sys.executable, "-m", "raybiphase.sweep", "sweeps/quickstart.yaml", "--set",
                           f"sweep.storage={tmp_path}"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: finetune: {table} holds trials fine-tuned under other settings")
    assert "pretraining:" not in proc.stdout  # nothing ran, nothing was written beside the table (and its lock)
    # beside the table, only the released lease's folder (raybiphase.sweep.lease): no holder left in it
    assert {p.name for p in table.parent.iterdir()} <= {"finetune.parquet", ".finetune.parquet.lock", "lease"}
    assert not (table.parent / "lease" / "holder.json").exists()


@pytest.mark.parametrize("complete_lrs", [False, True])
def test_the_completion_pass_reruns_the_best_lrs_stopped_seeds_or_every_stopped_trial(tmp_path, monkeypatch,
                                                                                     complete_lrs):
    from raybiphase.finetune import fanout

    def row(lr, seed, val, stopped):
        return FinetuneRow(run="r", pretrain_step=8, task="tweets", lr=lr, seed=seed, val_score=val,
                           test_score=math.nan if stopped else val, stopped_early=stopped, steps=3 if stopped else 9,
                           steps_run=3 if stopped else 9)

    # 1e-4 is best on finished seeds (0.8) though 2e-3's stopped seed showed a lucky early 0.95
    plan = [row(1e-4, 0, 0.8, False), row(1e-4, 1, 0.5, True), row(2e-3, 0, 0.6, False), row(2e-3, 1, 0.95, True)]
    specs = [TrialSpec("r", 8, "/hf", fanout.get_task("tweets"), r.lr, r.seed, str(tmp_path / f"{r.lr}-{r.seed}.json"))
             for r in plan]
    records = {t.key: t for t in plan}
    cfg = fanout.Fanout.of(fanout_config(complete_lrs=complete_lrs, lrs=[1e-4, 2e-3]))
    tasks, experiment = {("r", 8): ("tweets",)}, str(tmp_path / "ft")
    launched = [fanout.completion_wave(records, specs, cfg, tasks, experiment, "")]  # one pass, without ASHA
    completed = [dataclasses.replace(t.planned(), test_score=0.7, val_score=0.7, steps=9, steps_run=9)
                 for t in launched[0]]
    assert fanout.record_completed(records, specs, completed) == {t.key for t in launched[0]}
    assert fanout.completion_wave(records, specs, cfg, tasks, experiment, "") == []  # the best LR is complete
    assert not any(t.asha for t in launched[0])
    launched = [sorted(t.key for t in wave) for wave in launched]
    if complete_lrs:
        assert launched == [sorted([plan[1].key, plan[3].key])]  # every stopped trial, in one pass
    else:
        assert launched == [[plan[1].key]]  # only the best LR's stopped seed; 2e-3's stays stopped
    assert records[plan[1].key].completed_after_stop and records[plan[1].key].steps_run == 3 + 9


def test_fanout_refuses_a_bad_checkpoint_before_starting_anything(tmp_path):
    from raybiphase.finetune.fanout import Fanout

    with pytest.raises(UserError, match="does not exist"):
        finetune_checkpoints([FinetuneSource("x", 1, str(tmp_path / "missing"))], Fanout.of(fanout_config()), storage=str(tmp_path),
                   name="ft")
    with pytest.raises(UserError, match="unknown task"):
        finetune_checkpoints([], Fanout.of(fanout_config(tasks=["nope"])), storage=str(tmp_path), name="ft")


def test_fanout_refuses_a_missing_bucket_checkpoint_before_starting_anything(s3_bucket, tmp_path):
    from raybiphase.finetune.fanout import Fanout

    with pytest.raises(UserError, match=f"checkpoint {s3_bucket}/nowhere/step-00000008 does not exist"):
        finetune_checkpoints([FinetuneSource("x", 8, f"{s3_bucket}/nowhere/step-00000008")], Fanout.of(fanout_config()),
                   storage=str(tmp_path), name="ft")


def test_finetune_command_refuses_bad_input_before_anything_runs(tmp_path, capsys, monkeypatch):
    import sys

    from raybiphase.__main__ import main
    from raybiphase.sweep.published import finetune_model

    spec = fanout_config()
    with pytest.raises(UserError, match="does not exist"):
        finetune_model(str(tmp_path / "missing"), str(tmp_path / "out"), spec)
    with pytest.raises(UserError, match="finetune.tasks: empty"):
        finetune_model(str(tmp_path), str(tmp_path / "out"), fanout_config(tasks=[]))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets sys.argv for the command
    with pytest.raises(SystemExit) as exit_info:  # in-process: the console command's one line and exit code
        main(["finetune", str(tmp_path / "missing"), str(tmp_path / "out"), "--set", "finetune.tasks=[nope]"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: finetune.tasks: unknown task 'nope'")
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a bucket out of reach: one line, at once
    monkeypatch.setattr(storage, "RETRY_SECONDS", 0.2)
    with pytest.raises(UserError, match="^OUT: cannot reach s3://raybiphase-test/ft: .*connect"):
        finetune_model(str(tmp_path), "s3://raybiphase-test/ft", spec)


@pytest.mark.ray
@pytest.mark.slow
def test_finetune_command_puts_any_hf_checkpoint_through_the_protocol(ray_cluster, tiny_checkpoint, tmp_path):
    from raybiphase.results.store import read_rows
    from raybiphase.sweep.published import finetune_model

    spec = fanout_config(lrs=[1e-3], seeds=[0], max_steps=4, eval_every=2, max_examples=32, asha=False)
    rows = finetune_model(str(tiny_checkpoint), str(tmp_path / "out"), spec, name="published-encoder")
    assert [(r["run"], r["pretrain_step"], r["task"]) for r in rows] == [("published-encoder", 0, "tweets")]
    assert 0.0 <= rows[0]["test_score"] <= 1.0
    assert (tmp_path / "out" / "report" / "report.md").exists()
    summary = read_rows(tmp_path / "out" / "summary.parquet")
    assert list(summary["run"]) == ["published-encoder"]
    assert finetune_model(str(tiny_checkpoint), str(tmp_path / "out"), spec, name="published-encoder") == []


@pytest.mark.ray
@pytest.mark.slow
def test_trials_held_back_leave_their_cpus_to_the_segments(ray_cluster, tiny_checkpoint, tmp_path):
    """While the capacity the scheduler gives fine-tuning holds every trial back (segments hold the slots), no
    ended trial's actor keeps its CPU: a task asking for what a trial held beside what is free runs before
    fine-tuning resumes. (Tune keeps an idle actor for reuse, and with no trial live it stops handling events; it
    once starved a segment's data tasks and stalled the sweep for good.)"""
    import queue
    import threading

    import ray

    from raybiphase import storage
    from raybiphase.finetune import fanout
    from raybiphase.finetune.tuner import TuneTrials

    cfg = fanout_config(lrs=[2e-3], asha=False, max_steps=3, cpus_per_trial=1.0).finetune
    experiment = str(tmp_path / "ft")
    released, ran, ended = threading.Event(), threading.Event(), queue.Queue()

    def first_done() -> bool:
        records = storage.join(experiment, storage.RECORDS)
        return storage.exists(records) and bool(storage.list_files(records))

    def capacity() -> int:  # one trial, then none until the segment's task has run (or 90 s passed)
        return 0 if first_done() and not released.is_set() else 1

    @ray.remote(num_cpus=1.5)
    def segment_task():
        return True

    def segment():
        while not first_done():
            time.sleep(0.2)
        try:
            ray.get(segment_task.remote(), timeout=90)
            ran.set()
        except ray.exceptions.GetTimeoutError:
            pass
        finally:
            released.set()

    watcher = threading.Thread(target=segment, daemon=True)
    watcher.start()
    trials = TuneTrials(cfg, experiment=experiment, max_concurrent=2, capacity=capacity,
                        ended=lambda *event: ended.put(event))
    source = FinetuneSource("tiny-run", 8, str(tiny_checkpoint), {})
    for ticket, spec in enumerate(fanout.plan_specs([source], cfg, experiment=experiment)):
        trials.submit(ticket, (0,), spec)
    events = [ended.get(timeout=300) for _ in range(2)]
    trials.close()
    trials.join()
    watcher.join()
    assert ran.is_set(), "an idle trial actor kept its CPU while every trial was held back"
    assert sorted(ticket for ticket, _, error in events if error is None) == [0, 1]
