"""One sweep under way, as the driver and its scheduler see it (raybiphase.sweep.driver)."""

from __future__ import annotations

import dataclasses

from raybiphase import storage
from raybiphase.config import RunConfig, SweepSpec
from raybiphase.data.fingerprint import fingerprint
from raybiphase.errors import DamagedFile
from raybiphase.failures import FailurePolicy
from raybiphase.planning.plan import Plan, Segment
from raybiphase.storage import SweepPaths
from raybiphase.telemetry.console import STDOUT, Console
from raybiphase.telemetry.history import checkpoint_reports, read_history


@dataclasses.dataclass
class SweepContext:
    """One sweep under way: its spec, plan and paths, the prepared data of each corpus, and where lines go."""

    spec: SweepSpec
    plan: Plan
    paths: SweepPaths
    data_dirs: dict[str, str] = dataclasses.field(default_factory=dict)
    """fingerprint(data config) -> prepared shards."""
    console: Console = STDOUT
    histories: dict[str, list[dict]] = dataclasses.field(default_factory=dict)
    """segment id -> its reports once it is done (final): its fit's value's (raybiphase.sweep.segments), or its
    history.json read once."""

    @property
    def policy(self) -> FailurePolicy:
        """The sweep's one failure policy (raybiphase.failures), from its spec."""
        return FailurePolicy.of(self.spec.sweep)

    def data_dir(self, config: RunConfig) -> str:
        return self.data_dirs[fingerprint(config.data)]

    def segment_done(self, segment: Segment) -> bool:
        return storage.is_checkpoint(self.paths.checkpoint(segment.id, segment.end))

    def history(self, segment: Segment) -> list[dict]:
        """Every report a done segment's workers made (raybiphase.telemetry.history), read from storage once; a
        damaged history is said in a line and stood in for by the reports its checkpoints hold."""
        if segment.id not in self.histories:
            try:
                self.histories[segment.id] = read_history(self.paths.run_dir(segment.id))
            except DamagedFile as err:
                self.histories[segment.id] = checkpoint_reports(self.paths.run_dir(segment.id))
                self.say(f"{err}; its rows come from the {len(self.histories[segment.id])} report(s) its "
                         "committed checkpoints hold")
        return self.histories[segment.id]

    def final_checkpoint(self, run: str) -> str:
        last = self.plan.segments[self.plan.runs[run].segments[-1]]
        return self.paths.checkpoint(last.id, last.end)

    def say(self, line: str) -> None:
        self.console.say(line)
