"""Live progress: rank 0's beats (at most one write per interval, the loss read only then), the driver's lines
(only what moved), the fine-tuning line. No Ray here: the killed-and-resumed sweep test sees the lines live."""

import io
import json

from raybiphase.telemetry import progress
from raybiphase.telemetry.console import Console
from raybiphase.telemetry.progress import ProgressWriter, Watch, line, trials_line


def test_a_beat_is_written_once_per_interval_and_reads_the_loss_only_then(tmp_path, monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 11.0, 12.0, 25.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    target = tmp_path / "progress.json"
    beacon = ProgressWriter(str(target), stop_at=100, tokens_per_step=1000, every_s=10.0)  # starts at t=0
    reads = []

    def loss():
        reads.append(1)
        return 5.25

    for step in (1, 2):  # t=1, 2: inside the interval
        beacon.beat(step, "clm", loss)
    assert not target.exists() and not reads
    beacon.beat(3, "clm", loss)  # t=11: 3 steps of 1,000 tokens in 11 s
    beat = json.loads(target.read_text())
    assert beat["step"] == 3 and beat["loss"] == 5.25 and reads == [1]
    assert abs(beat["tokens_per_s"] - 3000 / 11) < 1e-9
    beacon.beat(4, "clm", loss)  # t=12
    assert json.loads(target.read_text())["step"] == 3
    beacon.beat(5, "mlm", loss, mfu_per_token_s=1e-4)  # t=25: 2 steps in 14 s
    beat = json.loads(target.read_text())
    assert beat["step"] == 5 and beat["objective"] == "mlm" and abs(beat["mfu"] - 2000 / 14 * 1e-4) < 1e-12


def test_the_last_step_of_a_segment_always_beats(tmp_path, monkeypatch):
    monkeypatch.setattr(progress.time, "perf_counter", lambda: 1.0)
    target = tmp_path / "progress.json"
    ProgressWriter(str(target), stop_at=7, tokens_per_step=10, every_s=60.0).beat(7, "mlm", lambda: 3.0)
    assert json.loads(target.read_text())["step"] == 7


def test_with_progress_lines_off_a_beat_still_says_the_fit_is_alive_every_minute(tmp_path, monkeypatch):
    """The driver stops a fit with no sign of life for sweep.stall_s: a beat is one, so it never stops beating."""
    clock = iter([0.0, 30.0, 61.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    target = tmp_path / "progress.json"
    beacon = ProgressWriter(str(target), stop_at=100, tokens_per_step=10, every_s=0.0)  # RAYBIPHASE_PROGRESS_S=0
    beacon.beat(1, "clm", lambda: 3.0)  # t=30
    assert not target.exists()
    beacon.beat(2, "clm", lambda: 3.0)  # t=61
    assert json.loads(target.read_text())["step"] == 2 and progress.LIFE_S == 60.0


def test_the_line_names_step_loss_throughput_and_eta():
    beat = {"step": 240, "stop_at": 400, "objective": "clm", "loss": 5.834, "tokens_per_s": 3100.0,
            "tokens_per_step": 2048}
    assert line("tiny-clm-0-400-8f7d", beat) == ("pretraining: tiny-clm-0-400-8f7d step 240/400, clm loss 5.83, "
                                                 "3.1k tok/s, ETA 1m46s")  # 160 steps x 2,048 / 3,100
    gpu = line("s", {**beat, "tokens_per_s": 2.5e6, "mfu": 0.412, "step": 400})
    assert "2.5M tok/s, MFU 41%" in gpu and "ETA" not in gpu


def test_the_watch_prints_only_segments_that_moved(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    beat = {"step": 10, "stop_at": 20, "objective": "mlm", "loss": 6.0, "tokens_per_s": 100.0, "tokens_per_step": 10}
    a.write_text(json.dumps(beat))
    watch = Watch({"seg-a": str(a), "seg-b": str(b)}, Console(io.StringIO()), every_s=0)  # b has not beaten yet
    assert [x.split(" step")[0] for x in watch.poll()] == ["pretraining: seg-a"]
    assert watch.poll() == []  # nothing moved
    b.write_text("{")  # being written: skipped, not an error
    a.write_text(json.dumps({**beat, "step": 15}))
    assert watch.poll() == [line("seg-a", {**beat, "step": 15})]


def test_the_fine_tuning_line_counts_stops_and_estimates_the_rest():
    assert trials_line(12, 48, 3, 2, per_trial=5.0) == ("fine-tuning: 12/48 trials done (3 stopped by ASHA), "
                                                         "2 running, ETA 3m00s")  # 36 trials x 5 s
    assert trials_line(1, 48, 0, 2, per_trial=None) == "fine-tuning: 1/48 trials done, 2 running"  # no pace yet
    assert trials_line(48, 48, 0, 0, per_trial=5.0) == "fine-tuning: 48/48 trials done, 0 running"
