"""One pretraining run on Ray Train: `raybiphase pretrain CONFIG [--set k=v] [--resume-from CKPT]`.

Prepares the shards if needed, then runs `raybiphase.pretrain.loop.train_loop` under a `TorchTrainer` with
`resources.num_workers` workers (FSDP2; gloo on CPU); checkpoints go under <sweep.storage>/<sweep.name>/runs/<run
name>/ (raybiphase.storage). Running the same command again resumes from the run's latest checkpoint; a finished
run is not recomputed. Workers receive the run config only; the sweep section says where things go.
"""

from __future__ import annotations

from raybiphase import storage
from raybiphase.checkpoint_meta import check_blocks
from raybiphase.config import SweepSpec
from raybiphase.config.estimates import resolve_checkpoint_every
from raybiphase.config.resources import check_room
from raybiphase.data import assets
from raybiphase.data.prepare import check_data, prepare
from raybiphase.errors import UserError
from raybiphase.failures import FailurePolicy
from raybiphase.naming import run_name
from raybiphase.pretrain.budget import check_run_budget
from raybiphase.pretrain.job import SegmentJob
from raybiphase.pretrain.loop import train_loop
from raybiphase.raycluster import ensure_ray, own_machine
from raybiphase.telemetry.progress import Watch, interval
from raybiphase.telemetry.wandb import sweep_settings


def make_trainer(job: SegmentJob, *, max_failures: int = 0, callbacks=(), train_fn=None):
    """A TorchTrainer for one run (or one segment of a sweep): `train_fn` (default: the production loop) on a worker
    group of `resources`' shape (FSDP2 over gloo on CPU, NCCL on GPU), each worker given `job`; Ray Train's run
    folder is `job.run_dir`, where checkpoints and the history land; `max_failures`: its restarts (FailureConfig)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    res = job.run.resources
    use_gpu = res.gpus_per_worker > 0
    per_worker = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if use_gpu else {})}
    return TorchTrainer(
        train_fn or train_loop,
        train_loop_config={"job": job},
        # a [min, max] range makes the worker group elastic: Ray Train restarts it with the workers it can place
        # (its workers resume from the newest committed checkpoint), and looks every resize_check_s for room to
        # grow back to max
        scaling_config=ray.train.ScalingConfig(num_workers=res.num_workers, use_gpu=use_gpu,
                                               resources_per_worker=per_worker,
                                               elastic_resize_monitor_interval_s=res.resize_check_s),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=job.name,
            storage_path=storage.parent(job.run_dir),
            # a drained node's restart (a spot notice) is counted apart, without bound: it never fails a segment
            failure_config=ray.train.FailureConfig(max_failures=max_failures,
                                                   max_preemption_failures=FailurePolicy().preemption_restarts),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
            callbacks=list(callbacks),
        ),
    )


def run_pretrain(spec: SweepSpec, *, resume_from: str | None = None, max_failures: int = 0, train_fn=None,
                 evaluation_texts=None, trainer_factory=None):
    """Prepare data (decontaminated against `evaluation_texts`' tasks: raybiphase.data.prepare), train the spec's
    base run, return the ray.train.Result. The run's data budget is checked as a sweep checks it
    (`check_run_budget`), before Ray starts and once its data is prepared. `trainer_factory`: what makes the run's
    trainer from its job (`make_trainer`'s signature; run_sweep's make_trainer is the same seam), for a library
    user who fits runs their own way."""

    if spec.sweep.grid or spec.sweep.runs:
        raise UserError("sweep.grid: this config is a sweep; run it with raybiphase sweep")

    run, root = resolve_checkpoint_every(spec.run, spec.sweep), storage.absolute(spec.sweep.storage)
    storage.check_writable(root, "sweep.storage")
    check_data(run.data, storage_root=root)  # before Ray starts, as are these
    check_run_budget(run, root)  # reads model.init_from; the size stated, or the manifest of data already prepared
    check_blocks(run)  # frozen_layers against the depth of the model trained (a decoder's own)
    if resume_from and not storage.is_checkpoint(resume_from):
        raise UserError(f"--resume-from: {resume_from} is not a raybiphase checkpoint (no {storage.META})")
    assets.use_mirror(root)
    ensure_ray()
    if machine := own_machine():  # a Ray of its own: no worker group larger than this machine ever starts
        check_room(run.resources, run.model.attn_implementation, machine[0], flash_attn=machine[1],
                   who=f"run {run_name(run)}")
    data_dir = prepare(run.data, storage_root=root, evaluation_texts=evaluation_texts)
    check_run_budget(run, root)  # again on the prepared manifest: a stated size is an estimate, a local source unknown
    name, paths = run_name(run), storage.SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    job = SegmentJob(run=run, name=name, run_dir=paths.run_dir(name), data_dir=data_dir, resume_from=resume_from,
                     wandb=sweep_settings(spec), progress_every=interval())
    trainer = (trainer_factory or make_trainer)(job, max_failures=max_failures, train_fn=train_fn)
    with Watch({name: job.progress}):  # step, loss, tok/s, ETA every few seconds
        return trainer.fit()
