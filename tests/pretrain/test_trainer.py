"""Pretraining on Ray Train: phases, checkpoints, HF exports, a killed worker, continued pretraining."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from raybiphase.checkpoint_meta import read_meta
from tests.conftest import TINY_BASE, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _weights(result) -> dict[str, torch.Tensor]:
    return load_file(str(Path(result.checkpoint.path) / "hf" / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_run):
    return tiny_run


@pytest.fixture
def polled_often(monkeypatch):
    """Ray Train's controller polls its workers every 0.5 s (every 2 s by default), so that it notices a worker's
    exit, a report to commit and the end of the run sooner; a slow poll is only a missed one, never a failure."""
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


def test_run_reports_phases_losses_and_checkpoints(uninterrupted):
    import pandas as pd

    from raybiphase.telemetry.history import read_history

    history = pd.DataFrame(read_history(uninterrupted.path))
    assert list(history["step"]) == list(range(1, 9))
    assert list(history["objective"]) == ["clm"] * 4 + ["mlm"] * 4
    for column in ("val/clm_loss", "val/mlm_loss", "lr", "tokens_per_s", "tokens_seen"):
        assert history[column].notna().all()
    assert history["train/clm_loss"].notna().sum() == 4 and history["train/mlm_loss"].notna().sum() == 4
    steps = sorted(p.name for p in Path(uninterrupted.path).glob("step-*"))
    assert steps == ["step-00000004", "step-00000006", "step-00000008"]  # phase switch, decay start, end
    meta = read_meta(uninterrupted.checkpoint.path)
    assert meta.step == 8 and meta.tokens_seen == 8 * 2048 and meta.objective == "mlm" and meta.decayed
    assert meta.code_version and meta.config.phases.clm_share == 0.5 and meta.data_start == 0


def test_hf_export_loads_with_stock_transformers_and_scores_as_reported(uninterrupted, small_data):
    """The export is the trained model: stock transformers reproduces the held-out losses the run reported."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from raybiphase.data.stream import validation_batches
    from raybiphase.pretrain.loop import evaluate

    folder = Path(uninterrupted.checkpoint.path) / "hf"
    model = AutoModelForMaskedLM.from_pretrained(folder)
    assert type(model).__name__ == "EuroBertForMaskedLM" and AutoTokenizer.from_pretrained(folder).mask_token
    _, manifest = small_data
    train = TINY_BASE["train"]
    val = validation_batches(manifest, batch_size=train["micro_batch_size"], batches=train["eval_batches"],
                             mask_ratio=0.4)
    losses = evaluate(model, val, torch.device("cpu"))
    reported = read_meta(uninterrupted.checkpoint.path).metrics
    for key in ("val/clm_loss", "val/mlm_loss"):
        assert losses[key] == pytest.approx(reported[key], rel=1e-5), key


def _loop_interrupted(loop_config: dict, *, notice_at: int, kill_at: int, marks: Path) -> None:
    """The production loop, interrupted twice as clouds do: right after `notice_at` is reported, SIGTERM to the last
    worker's process (a spot VM's preemption notice; it waits until the handler has seen it, so the notice lands
    in the next step); right after `kill_at`, that process killed hard (a lost worker). Each happens once; rank 0
    appends the first step each attempt reports to `marks`/starts."""
    import os
    import signal
    import time

    import ray.train

    from raybiphase.pretrain import preemption
    from raybiphase.pretrain.loop import train_loop

    report, first = ray.train.report, []

    def report_then_interrupt(metrics, *args, **kwargs):
        report(metrics, *args, **kwargs)
        context = ray.train.get_context()
        if context.get_world_rank() == 0 and not first:
            first.append(metrics["step"])
            with open(marks / "starts", "a") as starts:
                starts.write(f"{metrics['step']}\n")
        if context.get_world_rank() != context.get_world_size() - 1:
            return
        if metrics["step"] == notice_at and not (marks / "noticed").exists():
            (marks / "noticed").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not preemption._NOTICE.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
        if metrics["step"] == kill_at and not (marks / "killed").exists():
            (marks / "killed").write_text(str(kill_at))
            os._exit(1)

    ray.train.report = report_then_interrupt
    train_loop(loop_config)


def test_a_preemption_notice_and_a_killed_worker_each_resume_to_identical_weights(uninterrupted, small_data,
                                                                                  tmp_path, polled_often):
    """A preemption notice and a lost worker. SIGTERM after step 2: the workers finish step 3, write a checkpoint
    there (no periodic or milestone checkpoint falls on it) and Ray Train restarts the group from it, so nothing
    finished is redone. A worker killed hard after step 5: the group restarts from the latest checkpoint (step 4,
    the phase switch). The weights end as without either."""
    import pandas as pd
    import ray.cloudpickle

    from raybiphase.pretrain.trainer import run_pretrain
    from raybiphase.telemetry.history import read_history

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this test module
    cfg = tiny_config(tmp_path / "results", small_data)
    result = run_pretrain(cfg, max_failures=2, train_fn=functools.partial(_loop_interrupted, notice_at=2,
                                                                            kill_at=5, marks=tmp_path))
    assert (tmp_path / "noticed").exists() and (tmp_path / "killed").read_text() == "5"
    steps = sorted(p.name for p in Path(result.path).glob("step-*"))
    assert steps == ["step-00000003", "step-00000004", "step-00000006", "step-00000008"]  # 3: the notice's
    from raybiphase.checkpoint_meta import read_meta

    assert [read_meta(Path(result.path) / step).notice for step in steps] == ["signal", "", "", ""]
    assert (tmp_path / "starts").read_text().split() == ["1", "4", "5"]  # after the notice at 3, the kill at 4
    assert pd.DataFrame(read_history(result.path))["step"].tolist() == list(range(1, 9))
    final, reference = _weights(result), _weights(uninterrupted)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in final)


def test_a_run_resized_from_two_workers_to_one_trains_the_same_batches(uninterrupted, small_data, tmp_path,
                                                                       polled_often):
    """What an elastic segment does when a node is lost: the run's 2 workers trained steps 1-4 and committed a
    checkpoint at 4 (the never-resized run's, at its phase switch); the same run resumes from it on 1 worker, which
    reads the same global batches in the same order (accumulating 4 micro-batches where each of 2 workers
    accumulated 2) from the checkpoint resharded for 1. Its every loss is the never-resized run's: equal up to the
    summation order of the gradients, which differs once the world size does (steps 5-8): within 1e-6 relative
    (measured: 1.6e-7). Each report says how many workers trained it."""
    import pandas as pd

    from raybiphase.pretrain.trainer import run_pretrain
    from raybiphase.telemetry.history import read_history

    switch = Path(uninterrupted.path) / "step-00000004"
    assert read_meta(switch).step == 4 and read_meta(switch).metrics["workers"] == 2
    resized = run_pretrain(tiny_config(tmp_path / "results", small_data, **{"resources.num_workers": 1}),
                           resume_from=str(switch))
    assert Path(resized.path).name == Path(uninterrupted.path).name  # one run: num_workers is not part of its name

    history, reference = (pd.DataFrame(read_history(r.path)).set_index("step") for r in (resized, uninterrupted))
    assert history.index.tolist() == list(range(5, 9)) and reference.index.tolist() == list(range(1, 9))
    assert reference["workers"].tolist() == [2] * 8 and history["workers"].tolist() == [1] * 4
    losses = [c for c in history.columns if c.endswith("_loss") and history[c].notna().any()]
    assert sorted(losses) == ["train/mlm_loss", "val/clm_loss", "val/mlm_loss"]  # steps 5-8: the MLM phase
    gap = ((history[losses] - reference.loc[5:8, losses]).abs() / reference.loc[5:8, losses].abs()).max().max()
    print(f"resized 2 -> 1 workers at step 4: largest relative gap of a loss over steps 5-8: {gap:.2e}")
    assert gap <= 1e-6
    final, never = _weights(resized), _weights(uninterrupted)
    assert final.keys() == never.keys()
    weight_gap = max((final[k] - never[k]).abs().max().item() for k in final)
    print(f"largest weight difference after step 8: {weight_gap:.2e}")
    assert all(torch.allclose(final[k], never[k], rtol=1e-5, atol=1e-6) for k in final)
