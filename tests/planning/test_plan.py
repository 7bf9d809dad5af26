"""The sweep planner: the paper's grid shares prefixes exactly; every committed spec loads and plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from raybiphase.config import ConfigError, SweepSpec, from_dict, load
from raybiphase.finetune.tasks import get_task
from raybiphase.planning.plan import describe, expand, make_plan, plan_runs, shared_steps

SWEEPS = sorted((Path(__file__).resolve().parents[2] / "sweeps").glob("*.yaml"))
PAPER_DATASETS = {"sst2", "mnli", "qqp", "conll2003", "ontonotes", "uner", "squad", "squad_v2", "record", "msmarco",
                  "nq", "mldr"}


def test_split_grid_plans_206k_of_380k_steps():
    spec = load(SweepSpec, "sweeps/split_grid.yaml")
    plan = make_plan(spec)
    assert len(plan.runs) == 15
    assert plan.naive_steps == 380_000
    assert plan.planned_steps == 206_000
    names = {name.rsplit("-", 1)[0] for name in plan.runs}
    assert {"610m-clm-42k", "610m-mlm40-42k", "610m-clm-10.5k-mlm40-42k", "610m-clm-5.5k-mlm40-22k"} <= names


def test_every_run_is_a_chain_of_segments_covering_its_steps():
    plan = make_plan(load(SweepSpec, "sweeps/split_grid.yaml"))
    for run in plan.runs.values():
        chain = [plan.segments[s] for s in run.segments]
        assert chain[0].start == 0 and chain[-1].end == run.steps
        assert all(a.end == b.start and b.parent == a.id for a, b in zip(chain, chain[1:]))
        for seg in chain:  # a segment's steps are identical for every run through it
            for other in seg.runs:
                assert shared_steps(plan.runs[other], run) >= seg.end


def test_runs_diverge_where_their_schedules_differ():
    base = {"optim": {"warmup_steps": 2, "decay_steps": 2}, "train": {"global_batch_tokens": 2048}}
    a = from_dict(SweepSpec, base, {"phases.steps": 10, "phases.clm_share": 1.0})
    b = from_dict(SweepSpec, base, {"phases.steps": 20, "phases.clm_share": 1.0})
    short, long = plan_runs([a.run, b.run]).values()
    assert shared_steps(short, long) == 8  # the shorter run's decay starts at step 8; until then they are the same run


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_committed_specs_load_and_plan(path):
    spec = load(SweepSpec, path)
    plan = make_plan(spec)
    assert plan.planned_steps <= plan.naive_steps
    text = describe(plan, spec)
    assert "naive" in text and "GPU-hours" in text
    from raybiphase.pretrain.budget import check_budget, data_budget

    check_budget(data_budget(plan, spec))  # no committed spec repeats data unless it says so (data.max_epochs)


def test_a_one_gpu_sweeps_estimates_say_minutes_and_hundredths_not_zeros():
    """A small sweep's dry run says what it costs (sweeps/gpu.yaml: a hundredth of a GPU-hour, seconds of steps);
    the paper's keep their whole GPU-hours, hours and days."""
    from raybiphase.planning.cost import gpu_hours_text, hours_text

    spec = load(SweepSpec, "sweeps/gpu.yaml")
    estimate = next(line for line in describe(make_plan(spec), spec).splitlines() if line.startswith("estimate: "))
    assert estimate.startswith("estimate: 0.01 GPU-hours planned vs 0.01 naive"), estimate
    assert [hours_text(h) for h in (19 / 3600, 59.7 / 3600, 4 / 60, 59.7 / 60, 12.44, 57.6)] == [
        "19 s", "1 min", "4 min", "1.0 hours", "12.4 hours", "2.4 days"]
    assert [gpu_hours_text(h) for h in (0.012, 9.5, 1496.4)] == ["0.01", "9.50", "1,496"]
    assert gpu_hours_text(1783.24, 1) == "1,783.2"


def test_quickstart_shares_the_clm_prefix():
    plan = make_plan(load(SweepSpec, "sweeps/quickstart.yaml"))
    assert len(plan.runs) == 3 and plan.planned_steps < plan.naive_steps


def test_bad_grid_values_name_the_key():
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={phases.mask_ratio: [0.3, 1.5]}"])
    with pytest.raises(ConfigError, match=r"sweep.grid \(phases.mask_ratio=1.5\): phases.mask_ratio: 1.5 is out of range"):
        expand(spec)
    with pytest.raises(ConfigError, match="^sweep.grid: phases.mask_ration: unknown key"):
        load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={phases.mask_ration: [0.3]}"])
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.runs=[{phases.steps: 800}, {optim.lr: -1}]"])
    with pytest.raises(ConfigError, match=r"^sweep.runs.1: optim.lr: -1.0 is out of range"):  # not "sweep.grid"
        expand(spec)


def test_two_run_entries_making_one_run_are_an_error():
    # eval_every and checkpoint_every leave the weights alone: one run, and the second entry's setting would be lost
    spec = load(SweepSpec, "sweeps/quickstart.yaml",
                ["sweep.runs=[{optim.lr: 1e-3, train.eval_every: 50}, {optim.lr: 1e-3, train.checkpoint_every: 100}]"])
    with pytest.raises(ConfigError, match=r"^sweep.runs.1: the same run as sweep.runs.0 \(tiny-mlm40-800-"):
        make_plan(spec)
    # so is an entry repeating a run of the grid (the quickstart's MLM-only run) with a setting it would lose
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.runs=[{train.eval_every: 50}]"])
    with pytest.raises(ConfigError, match=r"^sweep.runs.0: the same run as one of sweep.grid or the base run "
                                          r"\(tiny-mlm40-800-\w{6}\), with settings that do not change the weights"):
        make_plan(spec)
    assert len(make_plan(load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.runs=[{}]"])).runs) == 3  # as it is: fine


def test_an_ambiguous_run_reference_lists_the_candidates():
    runs = "sweep.runs=[{optim.lr: 1e-4}, {model.init_from: '@%s', phases.steps: 22000, phases.clm_share: 0.0}]"
    with pytest.raises(ConfigError, match=r"^sweep.runs.1: model.init_from: '@610m-mlm40-42k' matches 2 runs of this "
                                          r"sweep: 610m-mlm40-42k-\w{6}, 610m-mlm40-42k-\w{6}; name one in full"):
        make_plan(load(SweepSpec, "sweeps/cpt.yaml", [runs % "610m-mlm40-42k"]))
    full = next(n for n in make_plan(load(SweepSpec, "sweeps/cpt.yaml")).runs if n.startswith("610m-mlm40-42k-"))
    plan = make_plan(load(SweepSpec, "sweeps/cpt.yaml", [runs % full]))
    assert any(run.source == full for run in plan.runs.values())


def test_an_export_step_no_run_reaches_is_an_error():
    with pytest.raises(ConfigError, match=r"^train.export_steps.0: 99999 is beyond the last step of every run"):
        make_plan(load(SweepSpec, "sweeps/quickstart.yaml", ["train.export_steps=[99999]"]))


def test_continued_pretraining_hangs_below_its_source():
    spec = load(SweepSpec, "sweeps/cpt.yaml")
    plan = make_plan(spec)
    continued = [r for r in plan.runs.values() if r.source]
    assert {r.name.rsplit("-", 1)[0] for r in continued} == {"610m-clm-dec42k-mlm40-64k", "610m-mlm40-dec42k-mlm40-64k"}
    for run in continued:
        first = plan.segments[run.segments[0]]
        assert first.after_run == run.source and first.start == 0
    with pytest.raises(ConfigError, match="'@610m-clm-12k' names no run of this sweep"):
        make_plan(load(SweepSpec, "sweeps/cpt.yaml", ["sweep.runs=[{model.init_from: '@610m-clm-12k'}]"]))


def test_baselines_bm25_for_retrieval_and_the_majority_class_for_classification(offline_cache):
    from raybiphase.finetune.tasks import get_task, load_splits
    from raybiphase.sweep.driver import baseline_rows

    spec = load(SweepSpec, "sweeps/quickstart.yaml",
                ["finetune.tasks=[tweets, wiki_retrieval, squad]", "finetune.max_examples=200",
                 "finetune.max_eval_examples=100"])
    majority, bm25 = baseline_rows(spec)  # none for QA
    assert bm25["run"] == "bm25" and bm25["source"] == "baseline" and bm25["task"] == "wiki_retrieval"
    assert 0.3 < bm25["test_score"] <= 1.0 and len(bm25["test_per_example"]) == 100  # on the trials' test split
    splits = load_splits(get_task("tweets"), max_examples=200, max_eval_examples=100)
    labels = [r["label"] for r in splits.train]
    top = max(set(labels), key=lambda label: (labels.count(label), -label))
    assert majority["run"] == "majority" and majority["task"] == "tweets"
    assert majority["test_score"] == pytest.approx(sum(r["label"] == top for r in splits.test) / len(splits.test))


def test_every_run_from_scratch_shares_one_untrained_control():
    plan = make_plan(load(SweepSpec, "sweeps/quickstart.yaml"))
    (control,) = plan.controls.values()
    assert control.name.startswith("tiny-init-") and sorted(control.runs) == sorted(plan.runs)
    other_seed = make_plan(load(SweepSpec, "sweeps/quickstart.yaml", ["sweep.grid={train.seed: [0, 1]}"]))
    assert len(other_seed.controls) == 2  # another seed is another step 0
    assert not make_plan(load(SweepSpec, "sweeps/quickstart.yaml", ["finetune.control=false"])).controls
    cpt = make_plan(load(SweepSpec, "sweeps/cpt.yaml"))
    (control,) = cpt.controls.values()  # continued runs start from trained weights: no control of their own
    assert len(control.runs) == 2 and all(not cpt.runs[r].source for r in control.runs)
    spec = load(SweepSpec, "sweeps/quickstart.yaml")
    grid = len(spec.finetune.tasks) * len(spec.finetune.lrs) * len(spec.finetune.seeds)
    assert plan.finetune_trials(spec) == (len(plan.runs) + 1) * grid


STUDY = {  # the study's 37 models by their own names (sweeps/paper.yaml says which are seen on model pages)
    *(f"{size}-{obj}-42k" for size in ("210m", "610m", "1b") for obj in ("clm", "mlm20", "mlm30", "mlm40", "mlm50")),
    "610m-clm-12k", "610m-mlm40-12k", "610m-clm-3k-mlm40-12k", "610m-clm-6k-mlm40-12k", "610m-clm-9k-mlm40-12k",
    "610m-clm-22k", "610m-mlm40-22k", "610m-clm-5k-mlm40-22k", "610m-clm-11k-mlm40-22k", "610m-clm-17k-mlm40-22k",
    "610m-clm-10k-mlm40-42k", "610m-clm-21k-mlm40-42k", "610m-clm-32k-mlm40-42k",
    "610m-clm-40k-mlm20-42k", "610m-clm-40k-mlm40-42k", "1b-clm-10k-mlm40-42k",
    *(f"610m-{src}-dec42k-mlm40-{total}" for src in ("clm", "mlm40") for total in ("44k", "54k", "64k")),
}


def test_paper_spec_plans_every_model_of_the_study_under_its_own_name():
    import io

    from raybiphase.results.importer import parse_model_name
    from raybiphase.sweep.driver import run_sweep
    from raybiphase.telemetry.console import Console

    spec = load(SweepSpec, "sweeps/paper.yaml")
    out = io.StringIO()
    plan = run_sweep(spec, dry_run=True, console=Console(out))
    replicates = {f"{arm}-s{seed}" for arm in ("610m-mlm40-42k", "610m-clm-10k-mlm40-42k", "610m-mlm40-12k",
                                               "610m-clm-3k-mlm40-12k") for seed in (1, 2)}
    assert {name.rsplit("-", 1)[0] for name in plan.runs} == STUDY | replicates
    assert len(plan.runs) == len(STUDY) + len(replicates)
    for name, run in plan.runs.items():  # the name says what the run does, read back as the importer reads it
        parsed = parse_model_name(name.rsplit("-", 1)[0].removesuffix(f"-s{run.config.train.seed}"))
        assert parsed["phases.steps"] == run.steps and parsed["model.size"] == run.config.model.size
        assert parsed["phases.clm_steps"] == sum(p.steps for p in run.config.phases.resolved() if p.objective == "clm")
    assert plan.runs[next(n for n in plan.runs if n.startswith("1b-"))].config.model.size == "1b"
    printed = out.getvalue()
    assert "steps: naive 1,340,000, planned 1,030,000" in printed and "GPU-hours planned vs" in printed
    assert ("replicates: 4 arm(s) pretrained 3 times at most (train.seed 0, 1, 2: init and data order): "
            "610m-mlm40-42k-") in printed and "the 8 extra run(s) add 1,380 GPU-hours of pretraining" in printed
    assert "control: 610m-init-" in printed
    # 45 final checkpoints and 5 controls on the full grid (300 trials each), 147 intermediate ones on
    # finetune.exports' (60 each); the full grid at 1k, 2k and 10k alone was 30,900 trials
    assert ("fine-tuning: 192 distinct checkpoints for 252 run checkpoints (shared ones fine-tuned once), 5 control(s):"
            " 23,820 trials (full grid; 30,420 without de-duplication), at most 2,672.6 GPU-hours (1,184.6 of them "
            "evaluation; inputs at their measured p98 width for 10 of 12 tasks, at max_len for the rest; a step's FLOPs "
            "at 24% MFU plus a launch-bound 3.7 ms a layer) beside pretraining's 7,520\n") in printed
    assert ("finetune.exports.0: 147 intermediate checkpoint(s) at steps 1k, 2k, 4k, 6k, 10k, 16k, 24k, 32k, 40k, each"
            " on 4 task(s) (sst2, conll2003, squad, msmarco) x 3 LR(s) x 5 seed(s): 60 trials each, where a final "
            "checkpoint takes 300\n") in printed
    assert set(spec.finetune.tasks) == PAPER_DATASETS


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_spec_on_the_real_corpus_fine_tunes_on_the_papers_datasets_and_one_on_cpus_on_offline_tasks(path):
    """A sweep that pretrains on the real corpus decides findings on a GPU cluster: it fine-tunes on the paper's
    datasets only (tasks with a hub loader), one of every family at least, and holds all twelve out of its corpus,
    so its checkpoints can meet any of them. The offline tasks serve the specs on the offline corpus, which need no
    hub."""
    spec = load(SweepSpec, path)
    tasks = [get_task(name) for name in spec.finetune.tasks]
    if spec.run.data.source == "offline":
        assert all(task.offline for task in tasks), path.name
        return
    assert {task.name for task in tasks} <= PAPER_DATASETS and all(task.production for task in tasks)
    assert {task.family for task in tasks} == {"SC", "TC", "QA", "IR"}
    assert set(spec.run.data.decontam_tasks) == PAPER_DATASETS


@pytest.mark.parametrize("name, tasks, trials, hours, paper_runs", [
    ("split_grid", ["sst2", "conll2003", "squad", "msmarco"], "3,360", "317.7", 11),  # 28 checkpoints: one per family
    ("mask_ratio", sorted(PAPER_DATASETS), "3,000", "257.9", 8),
    ("cpt", sorted(PAPER_DATASETS), "1,500", "195.6", 4),
])
def test_the_cluster_sweeps_fine_tune_on_the_papers_datasets_and_their_headers_quote_the_dry_run(
        name, tasks, trials, hours, paper_runs):
    """split_grid, mask_ratio and cpt decide findings 4, 3 and 5 on the paper's datasets; the figures each file's
    header quotes are the ones its dry run prints, and its runs are sweeps/paper.yaml's where the configs agree
    (split_grid's 25% and 75% splits of 22k and 42k steps are 5.5k, 10.5k, 16.5k and 31.5k of CLM, not the study's)."""
    from raybiphase.data.fingerprint import fingerprint

    spec = load(SweepSpec, f"sweeps/{name}.yaml")
    assert sorted(spec.finetune.tasks) == sorted(tasks)
    plan = make_plan(spec)
    text = describe(plan, spec)
    assert f": {trials} trials (full grid" in text and f"at most {hours} GPU-hours" in text
    pretraining = next(line for line in text.splitlines() if line.startswith("estimate: ")).split()[1]
    header = (SWEEPS[0].parent / f"{name}.yaml").read_text().split("\nsweep:")[0]
    assert f"{trials} trials" in header and f"{hours} GPU-hours" in header and f"{pretraining} GPU-hours" in header
    paper = load(SweepSpec, "sweeps/paper.yaml")
    assert fingerprint(spec.run.data) == fingerprint(paper.run.data)  # one prepared corpus serves them all
    paper_plan = make_plan(paper)
    assert set(plan.controls) <= set(paper_plan.controls)
    assert len(set(plan.runs) & set(paper_plan.runs)) == paper_runs  # the same run, weights and name


def test_cpu_study_plans_the_papers_comparisons():
    spec = load(SweepSpec, "sweeps/cpu_study.yaml")
    plan = make_plan(spec)
    names = {name.rsplit("-", 1)[0] for name in plan.runs}
    assert names == {"tiny-mlm40-800", "tiny-clm-400-mlm40-800", "tiny-clm-800", "tiny-mlm40-1.6k",
                     "tiny-clm-800-mlm40-1.6k", "tiny-clm-1.6k", "tiny-mlm20-800", "tiny-mlm20-1.6k",
                     "tiny-clm-dec1.6k-mlm40-2k", "tiny-mlm40-dec1.6k-mlm40-2k"}
    assert len(plan.controls) == 1 and len(spec.finetune.seeds) >= 3  # intervals need 3 seeds
    families = {get_task(t).family for t in spec.finetune.tasks}
    assert families == {"SC", "TC", "QA", "IR"}
    assert plan.planned_steps < plan.naive_steps


def test_keep_checkpoints_prunes_only_what_no_resume_branch_or_export_needs(tmp_path):
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep.context import SweepContext
    from raybiphase.sweep.segments import prune_checkpoints, segment_job

    class AnyData(dict):
        def __missing__(self, key):
            return "data"

    def checkpoint_policy(segment):  # the one the segment's workers save by
        return segment_job(SweepContext(spec, plan, paths, AnyData()), segment).policy()

    # the quickstart's CLM-only run: its segment 400-800 has the decay start (720) and, here, an export at 600
    spec = load(SweepSpec, "sweeps/quickstart.yaml", ["train.keep_checkpoints=1", "train.export_steps=[600]",
                                                      f"sweep.storage={tmp_path}"])
    plan = make_plan(spec)
    segment = next(s for s in plan.segments.values() if s.start == 400 and s.id.startswith("tiny-clm"))
    paths = SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    saved = [500, 600, 700, 720, 740, 760, 780, 800]  # checkpoint_every 100 plus the milestones
    for step in saved:
        folder = Path(paths.checkpoint(segment.id, step))
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
    assert checkpoint_policy(segment).milestones == {600, 720, 800}
    assert prune_checkpoints(SweepContext(spec, plan, paths), segment, checkpoint_policy(segment)) == [
        500, 700, 740, 760, 780]  # 800 is also the last one
    assert sorted(int(p.name.split("-")[1]) for p in Path(paths.run_dir(segment.id)).iterdir()) == [600, 720, 800]
    parent = plan.segments[segment.parent]  # the shared CLM prefix ends at 400: the children start from it
    assert 400 in checkpoint_policy(parent).milestones
    unfinished = next(s for s in plan.segments.values() if s.id != segment.id and s.start == 400)
    assert prune_checkpoints(SweepContext(spec, plan, paths), unfinished,
                             checkpoint_policy(unfinished)) == []  # a segment not done is never touched
    keep_all = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.storage={tmp_path}"])
    default = make_plan(keep_all)
    assert segment.id in default.segments  # how many checkpoints are kept does not change what a segment is
    kept_all = default.segments[segment.id]
    assert prune_checkpoints(SweepContext(keep_all, default, paths), kept_all,
                             checkpoint_policy(kept_all)) == []  # the default keeps them all


@pytest.mark.parametrize("path", ["sweeps/quickstart.yaml", "sweeps/paper_mini.yaml"])
def test_workers_save_by_the_policy_pruning_keeps_by_and_every_runs_milestones_are_kept(path):
    """One checkpoint policy: the one a segment's workers get (segment_job), which its job prunes by; each run's
    own phase boundaries, decay start, exports and end are milestones of the segment that trains that step."""
    from raybiphase.pretrain.policy import CheckpointPolicy
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep.context import SweepContext
    from raybiphase.sweep.segments import segment_job

    class AnyData(dict):
        def __missing__(self, key):
            return "data"

    spec = load(SweepSpec, path, ["train.keep_checkpoints=1"])
    plan = make_plan(spec)
    ctx = SweepContext(spec, plan, SweepPaths.of("/tmp/unused", spec.sweep.name), AnyData())
    def checkpoint_policy(segment):
        return segment_job(ctx, segment).policy()

    for segment in plan.segments.values():
        policy = checkpoint_policy(segment)
        assert segment.end in policy.milestones and all(policy.evaluates(m) and policy.saves(m) for m in policy.milestones)
        assert [s for s in range(segment.start + 1, segment.end) if policy.saves(s) and s not in policy.milestones] == \
            [s for s in range(segment.start + 1, segment.end) if s % spec.run.train.checkpoint_every == 0 and s not in policy.milestones]
    for run in plan.runs.values():
        alone = CheckpointPolicy.of(run.config, exports=run.finetune_steps)
        for step in alone.milestones:
            holder = next(plan.segments[s] for s in run.segments if plan.segments[s].start < step <= plan.segments[s].end)
            assert step in checkpoint_policy(holder).milestones, (run.name, step)


@pytest.mark.parametrize("lengths", [[200, 100], [100, 200]])
def test_a_shared_segment_exports_what_every_run_through_it_fine_tunes(lengths):
    """With no decay the 100-step run is the 200-step run's prefix; their shared segment must
    export step 100 (the short run's end) whichever run the grid lists first, and step 50 for both."""
    spec = load(SweepSpec, "sweeps/quickstart.yaml",
                [f"sweep.grid={{phases.steps: {lengths}}}", "optim.decay_steps=0", "train.export_steps=[50]",
                 "phases.clm_share=0.0"])
    plan = make_plan(spec)
    shared = [s for s in plan.segments.values() if len(s.runs) == 2]
    assert len(shared) == 1 and (shared[0].start, shared[0].end) == (0, 100)
    assert shared[0].exports == [50, 100]
    (tail,) = [s for s in plan.segments.values() if len(s.runs) == 1]
    assert tail.exports == [200]


def test_replicates_share_prefixes_only_within_a_seed_and_the_dry_run_prices_them():
    from raybiphase.planning.replicate_cost import extra_runs, replicate_arms, replicate_lines

    one = make_plan(load(SweepSpec, "sweeps/quickstart.yaml"))
    grid = "sweep.grid={phases.clm_share: [0.0, 0.5, 1.0], train.seed: [0, 1, 2]}"
    spec = load(SweepSpec, "sweeps/quickstart.yaml", [grid])
    plan = make_plan(spec)
    assert len(plan.segments) == 3 * len(one.segments)  # no step is shared across seeds: init and data differ
    arms = replicate_arms(plan)
    assert len(arms) == len(one.runs) and all(len(names) == 3 for names in arms.values())
    assert {n.rsplit("-", 2)[1] for n in extra_runs(plan)} == {"s1", "s2"}  # the name says the replicate
    (line,) = replicate_lines(plan, spec)
    extra_pretraining = plan.gpu_hours(spec) * 2 / 3
    assert f"the 6 extra run(s) add {extra_pretraining:,.0f} GPU-hours of pretraining" in line
    extra_finetuning = plan.finetune_gpu_hours(spec) * 2 / 3  # two of three seeds' checkpoints and controls
    assert f"at most {extra_finetuning:,.1f} of fine-tuning" in line
    assert replicate_lines(one, load(SweepSpec, "sweeps/quickstart.yaml")) == []


def test_the_miniature_plans_every_run_of_the_paper_at_cpu_sizes_and_steps():
    """sweeps/paper_mini.yaml is sweeps/paper.yaml with 210m/610m/1b as micro/tiny/mini and steps / 100, less the
    2k continued runs and the 12k arms' replicates (which size the paper's finding-4 power; the miniature's 42k
    twins already exercise every replicate path): the same runs under the same names, the headline arms'
    pretraining replicates included."""
    import re

    def miniature(name: str) -> str:
        for big, small in (("210m", "micro"), ("610m", "tiny"), ("1b", "mini")):
            name = name.replace(f"{big}-", f"{small}-", 1) if name.startswith(big) else name
        return re.sub(r"(\d+)k", lambda m: str(int(m.group(1)) * 10), name)

    paper = {name.rsplit("-", 1)[0] for name in make_plan(load(SweepSpec, "sweeps/paper.yaml")).runs}
    expected = {miniature(name) for name in paper if not re.search(r"-44k$|-12k-s\d$", name)}
    plan = make_plan(load(SweepSpec, "sweeps/paper_mini.yaml"))
    assert {name.rsplit("-", 1)[0] for name in plan.runs} == expected and len(expected) == 39
    assert {name for name in expected if re.search(r"-s\d$", name)} == {
        f"tiny-{arm}-420-s{seed}" for arm in ("mlm40", "clm-100-mlm40") for seed in (1, 2)}
    assert sorted(c.config.model.size for c in plan.controls.values()) == ["micro", "mini", "tiny", "tiny", "tiny"]
    exported = {name.rsplit("-", 1)[0] for name, run in plan.runs.items() if run.finetune_steps != [run.steps]}
    assert exported == {f"{size}-{tag}-420" for size in ("micro", "tiny", "mini") for tag in ("clm", "mlm40")}


def test_the_sizes_of_the_miniature_order_as_the_papers():
    from raybiphase.config.sizes import SIZES

    counts = [SIZES[size].params(4096) for size in ("micro", "tiny", "mini")]
    assert counts == sorted(counts) and len(set(counts)) == 3


def test_the_dry_run_imports_no_torch():
    """Planning is arithmetic on configs: the dry run (the CLI's own path, with a data budget and a continued run)
    and every module of raybiphase.planning load in a fresh interpreter without torch, Ray or transformers ever
    being imported, so the dry run answers in seconds on any machine."""
    import subprocess
    import sys

    code = ("import importlib, io, pkgutil, sys\n"
            "import raybiphase.planning as planning\n"
            "for module in pkgutil.iter_modules(planning.__path__):\n"
            "    importlib.import_module(f'raybiphase.planning.{module.name}')\n"
            "from raybiphase.config import SweepSpec, load\n"
            "from raybiphase.planning.preflight import plan_sweep\n"
            "from raybiphase.telemetry.console import Console\n"
            "plan_sweep(load(SweepSpec, 'sweeps/beyond.yaml'), dry_run=True, console=Console(io.StringIO()))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'transformers')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_run_s_data_end_is_config_arithmetic_the_checkpoint_meta_agrees_with():
    from raybiphase.checkpoint_meta import CheckpointMeta
    from raybiphase.config import to_dict

    run = load(SweepSpec, "sweeps/split_grid.yaml").run
    assert run.rows_per_step == 1152  # 2,359,296 tokens a step in blocks of 2,048
    assert run.data_end(100, 42_000) == 100 + 42_000 * 1152
    meta = CheckpointMeta(run=to_dict(run), step=42_000, data_start=100, metrics={})
    assert meta.data_end == run.data_end(100, 42_000)


def test_a_preemption_notices_resume_point_leaves_no_row(tmp_path, monkeypatch):
    """A notice checkpoints at a step no report was due at; the run restarts from it. pretrain.parquet then holds
    what an uninterrupted run holds: the reports of the due steps, for every run through the segment, once."""
    from raybiphase import storage
    from raybiphase.results.store import read_rows
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep import context
    from raybiphase.sweep.context import SweepContext
    from raybiphase.sweep.segments import record_pretraining
    from raybiphase.telemetry.history import RESUME_POINT, History, read_history

    spec = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.storage={tmp_path}"])
    plan = make_plan(spec)
    prefix = next(s for s in plan.segments.values() if s.start == 0 and len(s.runs) == 2)  # the shared CLM prefix
    paths = SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    history = History(paths.run_dir(prefix.id))
    for step in (100, 200, 250, 300, 400):
        history.add({"step": step, "train/clm_loss": 5.0, **({RESUME_POINT: True} if step == 250 else
                                                           {"val/clm_loss": 5.5})})
    ctx = SweepContext(spec, plan, paths)
    read = []
    monkeypatch.setattr(context, "read_history", lambda run_dir: read.append(run_dir) or read_history(run_dir))
    record_pretraining(ctx, prefix)
    rows = read_rows(paths.table(storage.PRETRAIN_FILE))
    assert len(rows) == 2 * 4 and set(rows["run"]) == set(prefix.runs)
    assert sorted(set(rows["step"])) == [100, 200, 300, 400] and rows["val/clm_loss"].notna().all()
    assert record_pretraining(ctx, prefix) == 2 * 4 and len(ctx.history(prefix)) == 5  # all 8 skipped: once
    assert read == [paths.run_dir(prefix.id)]  # a done segment's history is read from storage once, whoever asks


def test_each_pretraining_run_reaches_wandb_once_even_when_an_earlier_invocation_finished_it(tmp_path, monkeypatch):
    """A driver killed after a run's last segment ended but before it logged that run to W&B: the next invocation
    logs it (every run whose segments are done and that the sweep's list does not name), and no run twice."""
    from raybiphase.storage import SweepPaths
    from raybiphase.sweep import segments
    from raybiphase.sweep.context import SweepContext
    from raybiphase.telemetry.history import History

    spec = load(SweepSpec, "sweeps/quickstart.yaml", [f"sweep.storage={tmp_path}", "sweep.wandb_project=p"])
    plan = make_plan(spec)
    paths = SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    for segment in plan.segments.values():
        History(paths.run_dir(segment.id)).add({"step": segment.end, "train/clm_loss": 5.0})
    logged = []
    monkeypatch.setattr(segments, "log_pretraining_run", lambda settings, name, config, history: logged.append(name))
    first = next(iter(plan.runs.values()))
    segments.log_runs(SweepContext(spec, plan, paths), done=set(first.segments))  # then the driver was killed
    assert logged == [first.name]
    everything = set(plan.segments)
    segments.log_runs(SweepContext(spec, plan, paths), done=everything)  # the next invocation, every segment done
    segments.log_runs(SweepContext(spec, plan, paths), done=everything)
    assert sorted(logged) == sorted(plan.runs)


def test_the_dry_runs_json_is_the_plan_its_text_prints(monkeypatch, capsys):
    """`raybiphase sweep SPEC --dry-run --json` prints one JSON object and nothing else: the runs, the segments
    they share, the controls and the step, trial and GPU-hour counts the text dry run prints; --json alone is
    refused (it only describes a plan)."""
    import json
    import re
    import sys

    from raybiphase.commands.sweep import main

    monkeypatch.setattr(sys, "argv", ["raybiphase sweep", "sweeps/split_grid.yaml", "--dry-run", "--json"])
    assert main() == 0
    plan = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(sys, "argv", ["raybiphase sweep", "sweeps/split_grid.yaml", "--dry-run"])
    main()
    text = capsys.readouterr().out
    steps = re.search(r"^steps: naive ([\d,]+), planned ([\d,]+)", text, re.M)
    assert (plan["steps"]["naive"], plan["steps"]["planned"]) == tuple(int(g.replace(",", "")) for g in steps.groups())
    assert f"{plan['finetune_trials']} trials" in text.replace(",", "")
    assert sum(len(s["runs"]) for s in plan["segments"].values()) == sum(len(r["segments"]) for r in plan["runs"].values())
    assert all(set(r["segments"]) <= set(plan["segments"]) for r in plan["runs"].values())
    monkeypatch.setattr(sys, "argv", ["raybiphase sweep", "sweeps/split_grid.yaml", "--json"])
    with pytest.raises(SystemExit) as refused:
        main()
    assert refused.value.code == 2 and "--json goes with --dry-run" in capsys.readouterr().err


def test_continued_runs_of_two_lengths_from_one_source_share_their_steps_until_the_shorter_one_decays():
    """The paper's continued runs (12k and 22k MLM steps on one decayed CLM checkpoint), in miniature: 4 and 6
    steps, each with its own warmup and 1-step decay, from the tiny grid's decayed CLM run. Their first 3 steps are
    the same, so they are one segment, trained once; each run then has a segment of its own from step 3, both
    below the source's last segment."""
    from raybiphase.planning.plan import dependencies
    from tests.conftest import SMALL_DATA, TINY_BASE

    spec = {**TINY_BASE, "sweep": {"name": "t", "storage": "/tmp/unused", "grid": {"phases.clm_share": [0.5, 1.0]},
                                   "runs": [{"model.init_from": "@tiny-clm-8", "phases.steps": steps,
                                             "phases.clm_share": 0.0, "optim.warmup_steps": 1,
                                             "optim.decay_steps": 1} for steps in (4, 6)]},
            "data": {**SMALL_DATA, "dir": "/tmp/unused"}}
    plan = make_plan(from_dict(SweepSpec, spec))
    continued = [run for run in plan.runs.values() if run.source]
    assert len(continued) == 2 and {run.source for run in continued} == {next(n for n in plan.runs
                                                                              if n.startswith("tiny-clm-8-"))}
    spans = {name: sorted((s.start, s.end) for s in plan.segments.values() if name in s.runs)
             for name in (run.name for run in continued)}
    assert sorted(spans.values()) == [[(0, 3), (3, 4)], [(0, 3), (3, 6)]]
    (shared,) = [s for s in plan.segments.values() if (s.start, s.end) == (0, 3) and len(s.runs) == 2]
    (parent,) = dependencies(shared, plan.runs)
    assert plan.segments[parent].end == 8 and list(plan.segments[parent].runs) == [continued[0].source]
