"""Damaged journals (a file cut short or emptied in a bucket): a history is rebuilt from what its checkpoints hold,
a fine-tuning record is one line naming it and what to do; never a bare JSONDecodeError."""

from __future__ import annotations

import json

import pytest

from raybiphase import storage
from raybiphase.errors import DamagedFile, UserError


def _run_folder(tmp_path, history: str) -> str:
    """A run folder with checkpoints at steps 2 and 4 (their metas hold their reports) and a history."""
    run_dir = tmp_path / "runs" / "seg"
    for step in (2, 4):
        folder = run_dir / storage.checkpoint_name(step)
        folder.mkdir(parents=True)
        (folder / storage.META).write_text(json.dumps({"step": step, "metrics": {"step": step, "lr": 0.1 * step}}))
    (run_dir / storage.HISTORY).write_text(history)
    return str(run_dir)


@pytest.mark.parametrize("damage", ['[{"step": 1, "lr": 0.1}, {"step": 2, "l', ""])
def test_a_restarting_worker_rebuilds_a_damaged_history_from_its_checkpoints(tmp_path, capsys, damage):
    from raybiphase.telemetry.history import History

    run_dir = _run_folder(tmp_path, damage)
    history = History(run_dir)
    assert sorted(history.rows) == [2, 4] and history.rows[4]["lr"] == pytest.approx(0.4)
    assert history.rows[2]["checkpoint"].endswith(storage.checkpoint_name(2))
    said = capsys.readouterr().out.strip()
    assert said.startswith(f"{run_dir}/{storage.HISTORY}: damaged, not JSON") and said.endswith(
        "rebuilt from the 2 report(s) its committed checkpoints hold") and "\n" not in said
    history.add({"step": 5, "lr": 0.5})  # the run goes on: the history is whole again
    assert [row["step"] for row in json.loads((tmp_path / "runs" / "seg" / storage.HISTORY).read_text())] == [2, 4, 5]


def test_a_damaged_fine_tuning_record_is_one_line_naming_it(tmp_path):
    from raybiphase.finetune.records import read_record

    record = tmp_path / "records" / "r__0__tweets__lr0.001__seed0__abcd.json"
    record.parent.mkdir()
    record.write_text('{"run": "r", "pretrain_')
    with pytest.raises(DamagedFile) as raised:
        read_record(str(record))
    line = str(raised.value)
    assert isinstance(raised.value, UserError) and isinstance(raised.value, ValueError) and "\n" not in line
    assert line.startswith(f"{record}: damaged, not JSON (") and "move it away and run the same command again" in line
