"""The fan-out's pieces of Ray Tune (raybiphase.finetune.fanout): the trial slots that fan-outs running at once
share, the grid that starts a trial only when its fan-out's claim on those slots allows, and one ASHA per group of
trials."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator


class TrialSlots:
    """The trial slots shared by the fan-outs running at once (the sweep runs one per batch of ready checkpoints:
    raybiphase.sweep.finetuning). `bound()` says how many trials may run in all now (beside pretraining, the share
    of the slots that segments leave free); it is read each time a grid asks to start a trial.

    Each fan-out's launch holds a `Claim` on the slots, ranked by its fan-out's `priority`, then by when it was
    made. A claim may start a trial while the trials of every claim stay under the bound and no claim ranked before
    it still has trials waiting to start: earlier checkpoints come first (their completion pass included), and a
    later batch takes only the slots an earlier one leaves idle (its last trials, fewer than the slots, and the wait
    before its completion pass) instead of waiting for that batch to end."""

    def __init__(self, bound: Callable[[], int]):
        self.bound = bound
        self.lock = threading.RLock()  # re-entered: a grid's next_trial, holding it, asks its own is_finished
        self._claims: list[Claim] = []
        self._numbers = itertools.count()
        self._claimants: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # the threads that made a claim

    def claim(self, trials: int, priority: int = 0) -> Claim:
        """A claim for `trials` trials, ranked after every claim of a lower `priority` or made before it."""
        with self.lock:
            claim = Claim(self, (priority, next(self._numbers)), waiting=trials)
            self._claims = sorted([*self._claims, claim], key=lambda c: c.rank)
            self._claimants.add(threading.current_thread())
            return claim

    def release(self, claim: Claim) -> None:
        with self.lock:
            self._claims.remove(claim)

    def admits(self, claim: Claim) -> bool:
        """Whether `claim` may start a trial now (the caller holds `lock`)."""
        return self._free_after(self._claims[:self._claims.index(claim)])

    def idle(self) -> bool:
        """Whether a slot is free that no claim's waiting trial will take: a new fan-out would use it."""
        with self.lock:
            return self._free_after(self._claims)

    def room_for_another(self, fanouts: list[threading.Thread]) -> bool:
        """Whether another fan-out would start a trial now, beside `fanouts` (the threads running fan-outs on these
        slots): none of them is still planning its trials (it has made a claim, or ended), and a slot is `idle`."""
        with self.lock:
            planning = [t for t in fanouts if t.is_alive() and t not in self._claimants]
            return not planning and self.idle()

    def _free_after(self, ahead: list[Claim]) -> bool:
        """A slot is free and none of the claims `ahead` has a trial waiting for it."""
        return not any(c.waiting for c in ahead) and sum(c.running for c in self._claims) < self.bound()


class Claim:
    """One launch's hold on `TrialSlots`: its trials still `waiting` to start and those `running` (started, not yet
    ended, pending resources included). `rank` orders the claims: (its fan-out's priority, when it was made)."""

    def __init__(self, slots: TrialSlots, rank: tuple[int, int], *, waiting: int):
        self.slots, self.rank, self.waiting, self.running = slots, rank, waiting, 0

    @property
    def number(self) -> int:
        """0 for the first claim on its slots, then 1, 2, ..."""
        return self.rank[1]

    def may_start(self) -> bool:
        with self.slots.lock:
            return self.slots.admits(self)


class CappedGrid(BasicVariantGenerator):
    """Tune's grid search that starts a trial only when its launch's `claim` on the shared trial slots allows
    (asked each time Tune wants the next trial; a refusal holds every new trial back until a slot frees). Tune
    pickles its search algorithm with the experiment's state; the claim stays out of it (a restored grid runs at
    most `fallback` trials at once).

    While refused, the grid says it is finished: Tune asks it for no trial and keeps no ended trial's process idle
    for reuse (that process would hold CPUs or a GPU share that a segment, or another fan-out's trial given the
    slot, waits for). Refused with none of its trials running, the Tuner ends, its trials not yet created left for
    a later Tuner (raybiphase.finetune.fanout._launch). A Tuner left waiting would not free what its ended trials
    held: Tune 2.60 waits for the next trial without handling events, so their actors keep their CPUs and GPU
    shares from the segments holding the slots."""

    def __init__(self, claim: Claim | None, fallback: int):
        super().__init__()
        self._claim, self._fallback = claim, fallback

    def next_trial(self):
        claim = self._claim
        if claim is None:
            return None if len(self._live_trials) >= self._fallback else super().next_trial()
        with claim.slots.lock:  # the check and the start at once: two grids never take the same free slot
            if not claim.slots.admits(claim):
                return None
            trial = super().next_trial()
            if trial is not None:
                claim.waiting, claim.running = claim.waiting - 1, claim.running + 1
            return trial

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False):
        claim = self._claim
        if claim is not None and trial_id in self._live_trials:
            with claim.slots.lock:
                claim.running -= 1
        super().on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        """Also while its claim may not start a trial (Tune re-reads this every step): Tune then keeps no idle
        trial process for reuse, whose CPUs or GPU share another claim's trial (or a segment) would wait for, and
        with none of its trials running the Tuner ends."""
        claim = self._claim
        return super().is_finished() or (claim is not None and (claim.waiting == 0 or not claim.may_start()))

    def get_state(self):
        state = super().get_state()
        return state and {**state, "_claim": None}

    def __getstate__(self):
        return {**self.__dict__, "_claim": None}


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
