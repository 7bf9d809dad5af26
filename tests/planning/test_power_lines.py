"""The dry run's power lines: each finding's design read from the plan, replicates counted as runs."""

from raybiphase.config import SweepSpec, load
from raybiphase.planning.plan import make_plan
from raybiphase.planning.power_lines import FINDINGS, designs, power_lines, strata_df


def test_the_paper_plan_prices_findings_1_4_and_5_with_the_replicated_headline_arms(tmp_path):
    spec = load(SweepSpec, "sweeps/paper.yaml", [f"sweep.storage={tmp_path}"])  # no rows there: the assumption
    plan = make_plan(spec)
    found = designs(plan, spec)
    pairs, runs = found[FINDINGS[1]]["610m"]  # every 610m split against the MLM arm of its budget
    assert len(pairs[["arm_a", "arm_b"]].drop_duplicates()) == 11 and pairs["task"].nunique() == 12
    assert max(runs.values()) == 3  # the headline arms: three pretraining runs each
    assert set(found[FINDINGS[2]]) == {"610m"}  # continued runs exist at 610m only
    lines = power_lines(plan, spec)
    assert lines[0].startswith("power: ") and "assumed: fine-tuning seed SD 1.00 pts" in lines[0]
    assert any(line.startswith(f"power: {FINDINGS[0]}: 1b ") for line in lines)
    # the replicated 12k and 42k arms give the 610m strata 4 degrees of freedom each: a +2-point finding-4 effect is
    # found in about 99% of studies under 0.8 points of pretraining noise, half shared by a run's tasks
    (f4,) = [line for line in lines if line.startswith(f"power: {FINDINGS[1]}")]
    assert "610m 1.29 pts, +2 found in 99% (11 pair(s), 12 task(s), up to 3 runs an arm, 4 df)" in f4
    assert "1b " in f4 and "unreplicated strata widened" in f4.split("610m")[0]
    assert strata_df(plan) == {("610m", "MLM"): 4, ("610m", "CLM→MLM"): 4}


def test_a_sweep_without_fine_tuning_prints_no_power_line():
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["finetune.tasks=[]"])
    assert power_lines(make_plan(spec), spec) == []


def test_the_specs_widening_of_unmeasured_strata_prices_the_unreplicated_sizes_only(tmp_path):
    """sweep.unmeasured_sd, as the report judges with it: 1b's arms are never replicated, 610m's headline arms are."""
    lines = {}
    for factor in (1, 4):
        spec = load(SweepSpec, "sweeps/paper.yaml", [f"sweep.storage={tmp_path}", f"sweep.unmeasured_sd={factor}"])
        lines[factor] = power_lines(make_plan(spec), spec)
        assert f"an unreplicated size and objective at {factor}x the noisiest measured one's SD" in lines[factor][0]
    f4 = {factor: next(line for line in found if line.startswith(f"power: {FINDINGS[1]}"))
          for factor, found in lines.items()}
    assert "1b 3.78 pts, +2 found in 16% (1 pair(s), 12 task(s), 4 df)" in f4[1]  # taken as quiet as the noisiest
    assert "1b 15.13 pts, +2 found in 2% (1 pair(s), 12 task(s), 4 df, unreplicated strata widened)" in f4[4]
    for factor in (1, 4):  # measured strata: the same MDE whatever the prior
        assert "610m 1.29 pts, +2 found in 99% (11 pair(s), 12 task(s), up to 3 runs an arm, 4 df)" in f4[factor]
