"""A trial runner without Ray for the scheduler (raybiphase.sweep.scheduler.finetune_checkpoints(trials=...)): each
trial submitted 'runs' at once, in the loop's thread, as `outcome(spec)` says (it writes the records a finished
trial writes and returns the trial's last report, a finished trial's with its rows under fanout.ROWS; or raises:
the trial failed), and is ended as Tune would end it."""

from __future__ import annotations

from raybiphase.finetune.trial import TrialResult


class RecordingTrials:
    def __init__(self, ended, outcome, launched: list):
        self.ended, self.outcome, self.launched = ended, outcome, launched

    def submit(self, ticket, rank, spec) -> None:
        self.launched.append(spec)
        try:
            metrics = self.outcome(spec)
        except Exception as err:  # the trial failed for good
            self.ended(ticket, {}, err)
            return
        self.ended(ticket, metrics, None)

    def settle(self) -> None:
        pass

    def unsettle(self) -> None:
        pass

    def close(self) -> None:
        pass

    def join(self) -> None:
        pass


def recording(launched: list, outcome):
    """The `trials` factory: a RecordingTrials appending each spec it runs to `launched`."""
    return lambda capacity, ended: RecordingTrials(ended, outcome, launched)


def result(task, *, val: float, test: float, steps: int = 9, also_tested=None) -> TrialResult:
    """A finished trial's TrialResult for `task` (a Task)."""
    return TrialResult(val_score=val, test_score=test, metric=task.metric, steps=steps, seconds=1.0,
                       test_per_example=[test, test], secondary_metric=task.secondary_metric,
                       test_secondary=test / 2, also_tested=also_tested or {})
