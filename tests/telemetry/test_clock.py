"""The sweep's wall-time breakdown: time inside optimizer steps from the loop's reports, named spans."""

from raybiphase.telemetry.clock import Clock, duration, step_seconds


def test_step_seconds_follow_the_report_windows():
    # 2 steps at 1,000 tokens/s then 3 steps at 2,000, 1,000 tokens per step; a re-reported step counts once
    history = [{"step": 6, "tokens_per_s": 1000.0}, {"step": 9, "tokens_per_s": 2000.0},
               {"step": 9, "tokens_per_s": 2000.0}, {"step": 9}]
    assert step_seconds(history, start=4, tokens_per_step=1000) == 2.0 + 1.5


def test_the_summary_names_every_stage_and_the_overhead():
    clock = Clock()
    clock.spans = {"Ray start": 3.0, "data": 15.2, "pretraining": 190.0, "fine-tuning": 170.0, "report": 6.0}
    clock.segments, clock.most_at_once, clock.in_steps = 4, 2, 41.0
    clock.trials, clock.in_trials = 24, 98.0
    text = clock.summary()
    assert text.startswith("time: ") and "\n" not in text
    assert "pretraining 3m10s (4 segment(s), at most 2 at once: 41s in optimizer steps, 2m29s start-up" in text
    assert "fine-tuning 2m50s (24 trial(s): 1m38s inside trials" in text and "data 15s" in text
    assert duration(59.6) == "1m00s" and duration(7) == "7s"


def test_segments_side_by_side_never_show_a_negative_overhead():
    clock = Clock()
    clock.spans = {"pretraining": 295.0}
    clock.segments, clock.most_at_once, clock.in_steps = 4, 2, 381.0  # two segments at once: step time sums past the wall
    text = clock.summary()
    assert "6m21s in optimizer steps, summed over those running at once" in text and "-" not in text
