"""The fan-out's pieces of Ray Tune (raybiphase.finetune.fanout): the grid whose concurrency may change while it
runs, and one ASHA per group of trials."""

from __future__ import annotations

from collections.abc import Callable

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator


class CappedGrid(BasicVariantGenerator):
    """Tune's grid search with a bound on running trials that may change while it runs (`capacity()`, read each
    time Tune asks for the next trial; 0 holds every new trial back until a slot frees). Tune pickles its search
    algorithm with the experiment's state; the live bound stays out of it (a restored grid runs at `fallback`).

    Held at 0 with none of its trials running, the grid says it is finished and the Tuner ends, its trials not yet
    created left for a later Tuner (raybiphase.finetune.fanout._launch). A Tuner left waiting would not free what
    its ended trials held: Tune 2.60 waits for the next trial without handling events, so their actors (one kept
    idle for reuse, the others being stopped) keep their CPUs and GPU shares from the segments holding the slots."""

    def __init__(self, capacity: Callable[[], int], fallback: int):
        super().__init__()
        self._capacity, self._fallback = capacity, fallback

    def _bound(self) -> int:
        return (self._capacity or (lambda: self._fallback))()

    def next_trial(self):
        if len(self._live_trials) >= self._bound():
            return None
        return super().next_trial()

    def is_finished(self) -> bool:
        return super().is_finished() or (not self._live_trials and self._bound() <= 0)

    def get_state(self):
        state = super().get_state()
        return state and {**state, "_capacity": None}

    def __getstate__(self):
        return {**self.__dict__, "_capacity": None}


class GroupedASHA(FIFOScheduler):
    """One ASHA per trial group (run x task): its rungs compare trials of one task on one checkpoint only."""

    def __init__(self, make_asha):
        super().__init__()
        self._make_asha, self._by_group, self._metric = make_asha, {}, "val_score"

    def _asha(self, trial) -> ASHAScheduler:
        group = tuple(trial.config["trial"]["group"])
        if group not in self._by_group:
            self._by_group[group] = self._make_asha()
        return self._by_group[group]

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return True

    def on_trial_add(self, controller, trial):
        self._asha(trial).on_trial_add(controller, trial)

    def on_trial_result(self, controller, trial, result):
        return self._asha(trial).on_trial_result(controller, trial, result)

    def on_trial_complete(self, controller, trial, result):
        self._asha(trial).on_trial_complete(controller, trial, result)

    def on_trial_remove(self, controller, trial):
        self._asha(trial).on_trial_remove(controller, trial)

    def on_trial_error(self, controller, trial):
        self._asha(trial).on_trial_error(controller, trial)
