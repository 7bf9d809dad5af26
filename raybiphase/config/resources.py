"""The resources section of a run config: how many Ray Train workers a pretraining segment holds, what each holds,
and how many segments or trials run at once. None of it changes a run's weights (`metadata=NOT_WEIGHTS`), so none
of it enters a run's name or the planner's shared segments (raybiphase.config.identity).

`num_workers: [min, max]` makes a segment elastic (Ray Train's elastic worker group): it trains with any count in
the range that the cluster can place, and the run config checks that every such count shares the global batch
evenly (RunConfig), so the losses do not depend on the count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raybiphase.config.load import NOT_WEIGHTS, check, non_negative, positive
from raybiphase.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ResourcesConfig:
    num_workers: int | tuple[int, int] = field(default=2, metadata=NOT_WEIGHTS)
    """Ray Train workers per pretraining segment (at least 1); [min, max]: an elastic segment on spot GPUs, which starts with as many as it can place (at least min), restarts from its latest checkpoint with those left when a node is lost, and grows back to max by the same restart (checked every resources.resize_check_s). Every size in the range reads the same global batch in the same order, so the losses do not depend on it; the cost estimates and the bill plan for max."""
    resize_check_s: float = field(default=60.0, metadata=NOT_WEIGHTS)
    """An elastic segment (num_workers [min, max]) below max looks this often, in seconds, for room to grow; each growth restarts the segment from its latest checkpoint, so the steps since it are trained again."""
    cpus_per_worker: float = field(default=0.5, metadata=NOT_WEIGHTS)
    """CPUs each Train worker holds (leave room for Ray Data on small machines)."""
    gpus_per_worker: float = field(default=0.0, metadata=NOT_WEIGHTS)
    """GPUs each Train worker holds."""
    max_concurrent: int = field(default=1, metadata=NOT_WEIGHTS)
    """Segments or fine-tuning trials running at once."""

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, tuple):
            low, high = self.num_workers
            check(low >= 1, "resources.num_workers", f"{list(self.num_workers)}: the minimum {low} is out of range; "
                  "allowed: [min, max] with 1 <= min <= max")
            check(low <= high, "resources.num_workers", f"{list(self.num_workers)}: the minimum is above the "
                  "maximum; allowed: [min, max] with 1 <= min <= max")
        else:
            positive(self.num_workers, "resources.num_workers")
        positive(self.resize_check_s, "resources.resize_check_s")
        positive(self.cpus_per_worker, "resources.cpus_per_worker")
        non_negative(self.gpus_per_worker, "resources.gpus_per_worker")
        positive(self.max_concurrent, "resources.max_concurrent")

    @property
    def worker_counts(self) -> range:
        """Every number of workers a segment may train with: the one given, or each size of [min, max]."""
        low, high = self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers,) * 2
        return range(low, high + 1)

    @property
    def max_workers(self) -> int:
        """The most workers a segment holds: what the cost estimates, the bill and the timeline plan for."""
        return self.worker_counts[-1]


def check_room(res: ResourcesConfig, attention: str, available: dict[str, float], *, flash_attn: bool,
               who: str) -> None:
    """On one machine's own Ray (no autoscaler to add a node): a ConfigError naming the setting when the fewest
    workers `res` allows do not fit in `available` (Ray's total resources), which would wait for them forever, or
    when `attention` is flash_attention_2 and flash-attn is not installed (`flash_attn`), which fails every try.
    `who` names the asker in the message ("run X", "a segment of run X")."""
    least = res.worker_counts[0]
    if least:
        check_fits("resources.cpus_per_worker", least * res.cpus_per_worker, "CPU", available,
                   f"{who} asks for {least} worker(s) x {res.cpus_per_worker:g}")
        check_fits("resources.gpus_per_worker", least * res.gpus_per_worker, "GPU", available,
                   f"{who} asks for {least} worker(s) x {res.gpus_per_worker:g}")
    if attention == "flash_attention_2" and not flash_attn:
        raise ConfigError("model.attn_implementation: flash_attention_2 needs the flash-attn package, which this "
                          "machine lacks (pip install '.[flash]' where a prebuilt wheel exists); or use sdpa")


def check_fits(key: str, need: float, kind: str, available: dict[str, float], asks: str) -> None:
    """A ConfigError naming `key` when `need` of resource `kind` ("CPU", "GPU") exceeds what `available` holds;
    `asks` says who asks for what ("a trial asks for 0.25"), the resource's name follows."""
    if need > available.get(kind, 0.0) + 1e-9:
        raise ConfigError(f"{key}: {asks} {kind}, but this machine's Ray has {available.get(kind, 0.0):g} {kind}; "
                          "ask for less, or set RAY_ADDRESS to run on a cluster that has them")
