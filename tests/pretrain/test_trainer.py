"""Pretraining on Ray Train: phases, checkpoints, HF exports, a killed worker, continued pretraining."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from raybiphase.pretrain.checkpoint import read_meta
from tests.conftest import TINY_BASE, tiny_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _weights(result) -> dict[str, torch.Tensor]:
    return load_file(str(Path(result.checkpoint.path) / "hf" / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_run):
    return tiny_run


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


def _loop_killed_once(loop_config: dict, *, step: int, marker: Path) -> None:
    """The production loop, with the last worker's process killed hard right after it reports `step` (once)."""
    import os

    import ray.train

    from raybiphase.pretrain.loop import train_loop

    report = ray.train.report

    def report_then_die(metrics, *args, **kwargs):
        report(metrics, *args, **kwargs)
        context = ray.train.get_context()
        last = context.get_world_rank() == context.get_world_size() - 1
        if metrics["step"] == step and last and not marker.exists():
            marker.write_text(str(step))
            os._exit(1)

    ray.train.report = report_then_die
    train_loop(loop_config)


def _loop_preempted_once(loop_config: dict, *, step: int, marker: Path) -> None:
    """The production loop, with SIGTERM sent to the last worker's process once, right after it reports `step`
    (a spot VM's preemption notice); it waits until the handler has seen it, so the notice lands in step + 1.
    Rank 0 appends the first step each attempt reports to `marker`.starts."""
    import os
    import signal
    import time

    import ray.train

    from raybiphase.pretrain import preemption
    from raybiphase.pretrain.loop import train_loop

    report, first = ray.train.report, []

    def report_then_notice(metrics, *args, **kwargs):
        report(metrics, *args, **kwargs)
        context = ray.train.get_context()
        if context.get_world_rank() == 0 and not first:
            first.append(metrics["step"])
            with open(f"{marker}.starts", "a") as starts:
                starts.write(f"{metrics['step']}\n")
        last = context.get_world_rank() == context.get_world_size() - 1
        if metrics["step"] == step and last and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not preemption._NOTICE.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)

    ray.train.report = report_then_notice
    train_loop(loop_config)


def test_a_preemption_notice_checkpoints_at_once_and_resumes_to_identical_weights(uninterrupted, small_data,
                                                                                  tmp_path):
    """SIGTERM to a worker (issue 29, point 5): the workers finish the step under way, write a checkpoint there
    (step 5: no periodic or milestone checkpoint falls on it), and Ray Train restarts the group from it. Nothing
    after the checkpoint was trained, so the resume loses no finished step; the weights end as without a notice."""
    import pandas as pd

    from raybiphase.pretrain.trainer import run_pretrain
    from raybiphase.telemetry.history import read_history

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = tiny_config(tmp_path, small_data)
    marker = tmp_path / "noticed"
    result = run_pretrain(cfg, max_failures=1, train_fn=functools.partial(_loop_preempted_once, step=4,
                                                                            marker=marker))
    assert marker.exists()  # a worker really got SIGTERM after step 4
    steps = sorted(p.name for p in Path(result.path).glob("step-*"))
    assert steps == ["step-00000004", "step-00000005", "step-00000006", "step-00000008"]  # 5: the notice's
    assert Path(f"{marker}.starts").read_text().split() == ["1", "6"]  # the restart began after step 5
    history = pd.DataFrame(read_history(result.path))
    assert history["step"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    final, reference = _weights(result), _weights(uninterrupted)
    assert all(torch.equal(final[k], reference[k]) for k in reference)


def test_killed_worker_restarts_from_checkpoint_to_identical_weights(uninterrupted, small_data, tmp_path):
    from raybiphase.pretrain.trainer import run_pretrain

    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this test module
    cfg = tiny_config(tmp_path, small_data, **{"train.checkpoint_every": 3})
    marker = tmp_path / "killed"
    result = run_pretrain(cfg, max_failures=1,
                          train_fn=functools.partial(_loop_killed_once, step=5, marker=marker))
    assert marker.read_text() == "5"  # a worker really died at step 5; Ray Train restarted from step 4
    final, reference = _weights(result), _weights(uninterrupted)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in final)
