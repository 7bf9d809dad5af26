"""sweep.unmeasured_sd: how much noisier than the noisiest measured (size, objective) stratum the findings take one
that no replicated arm measures. It moves the verdicts of the widened strata only, the findings' note prints it,
the sweep's sweep.json carries it to `raybiphase report`, and a value below 1 is one line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from raybiphase.commands import report as report_command
from raybiphase.commands import run_main
from raybiphase.config import SweepConfig, SweepSpec
from raybiphase.errors import ConfigError
from raybiphase.results.html import run_info, unmeasured_sd_of
from raybiphase.results.stats.findings import Study, fixed_budget
from raybiphase.storage import RUN_INFO
from tests.results.test_calibration import _study


def test_a_wider_prior_for_an_unmeasured_size_moves_its_verdict_and_no_other() -> None:
    """Finding 4 with a true 2-point effect; 610m measured by its replicates, 210m never replicated."""
    rows = _study(np.random.default_rng(3), 2.0)
    lines = {}
    for factor in (1.0, 4.0):
        study = Study(rows, factor)
        lines[factor] = fixed_budget(study)[2]
        assert f"assumed {factor:g}x as noisy (SD) as the noisiest measured stratum" in study.regime()
        assert "sweep.unmeasured_sd" in study.regime()
    assert "210m: +2.26 pts [+0.94, +3.58] over 12 task(s), 36 pairs (replicates; 210m CLM→MLM, 210m MLM widened): " \
           "held" in lines[1.0]
    assert "210m: +2.26 pts [-0.34, +4.85] over 12 task(s), 36 pairs (replicates; 210m CLM→MLM, 210m MLM widened): " \
           "not resolved" in lines[4.0]
    assert "610m: +1.68 pts [+0.33, +3.04] over 12 task(s), 36 pairs (replicates): held" in lines[4.0]


def test_the_sweep_records_the_factor_and_the_report_reads_it_back(tmp_path) -> None:
    assert unmeasured_sd_of(str(tmp_path)) == 2.0  # nothing recorded: the default
    (tmp_path / RUN_INFO).write_text(json.dumps(run_info("sweeps/paper.yaml", unmeasured_sd=3.0)))
    assert unmeasured_sd_of(str(tmp_path)) == 3.0
    (tmp_path / RUN_INFO).write_text(json.dumps({"spec": "x.yaml", "unmeasured_sd": 0.5}))
    with pytest.raises(ConfigError, match=r"^sweep\.json unmeasured_sd \(sweep\.unmeasured_sd\): 0\.5 is out of "):
        unmeasured_sd_of(str(tmp_path))


@pytest.mark.parametrize("value", [0.5, 0.0, -2.0, float("nan"), float("inf")])
def test_a_factor_below_one_in_the_spec_is_one_line_naming_it(value) -> None:
    with pytest.raises(ConfigError, match=r"^sweep\.unmeasured_sd: .* allowed: an SD factor of at least 1"):
        SweepSpec(sweep=SweepConfig(unmeasured_sd=value))
    assert SweepSpec(sweep=SweepConfig(unmeasured_sd=1)).sweep.unmeasured_sd == 1


def test_a_factor_below_one_on_the_report_command_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["report", str(tmp_path), "--unmeasured-sd", "0.9"])
    with pytest.raises(SystemExit) as exit_info:
        run_main(report_command.main)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --unmeasured-sd: 0.9 is out of range; allowed: an SD factor of at least 1")
    assert err.count("\n") == 1


def test_the_reports_findings_section_judges_and_says_with_the_factor_it_is_given() -> None:
    from raybiphase.results.report import findings_section

    rows = _study(np.random.default_rng(3), 2.0).assign(knobs="")
    for factor, verdict_210m in ((1.0, "held"), (4.0, "not resolved")):
        section = findings_section(rows, factor)
        assert f"assumed {factor:g}x as noisy (SD) as the noisiest measured stratum" in section.note
        assert f"210m MLM widened): {verdict_210m}; 610m" in section.table
