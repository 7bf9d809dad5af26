"""One pretraining run on Ray Train: `raybiphase pretrain CONFIG [--set k=v] [--resume-from CKPT]`.

Prepares the shards if needed, then runs `raybiphase.pretrain.loop.train_loop` under a `TorchTrainer` with
`resources.num_workers` workers (FSDP2; gloo on CPU); checkpoints go under <sweep.storage>/<sweep.name>/runs/<run
name>/ (raybiphase.storage). Running the same command again resumes from the run's latest checkpoint; a finished
run is not recomputed. Workers receive the run config only; the sweep section says where things go.
"""

from __future__ import annotations


from raybiphase import storage
from raybiphase.telemetry.history import HistoryCallback
from raybiphase.errors import UserError
from raybiphase.config import RunConfig, SweepSpec, to_dict
from raybiphase.telemetry.wandb import sweep_settings
from raybiphase.naming import run_name
from raybiphase.telemetry.progress import PROGRESS_FILE, Watch, interval
from raybiphase.pretrain.loop import train_loop
from raybiphase.data.prepare import prepare
from raybiphase.raycluster import ensure_ray
from raybiphase.data import assets


def make_trainer(run: RunConfig, *, name: str, paths: storage.SweepPaths, data_dir: str,
                 resume_from: str | None = None, stop_at: int | None = None, wandb: dict | None = None,
                 max_failures: int = 0, callbacks=(), train_fn=None, exports: list[int] | None = None,
                 serves: list[str] = ()):
    """A TorchTrainer for one run (or one segment of a sweep): `train_fn` (default: the production loop) on
    `resources.num_workers` workers, checkpoints under `paths.run_dir(name)`."""
    import ray.train
    from ray.train import UserCallback
    from ray.train.torch import TorchConfig, TorchTrainer


    history = type("History", (HistoryCallback, UserCallback), {})(paths.run_dir(name))
    res = run.resources
    use_gpu = res.gpus_per_worker > 0
    per_worker = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if use_gpu else {})}
    loop_config = {"run": to_dict(run), "name": name, "data_dir": data_dir, "resume_from": resume_from,
                   "stop_at": stop_at, "exports": exports, "serves": list(serves), "wandb": wandb, "progress": storage.join(paths.run_dir(name), PROGRESS_FILE),
                   "progress_every": interval()}
    return TorchTrainer(
        train_fn or train_loop,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(num_workers=res.num_workers, use_gpu=use_gpu,
                                               resources_per_worker=per_worker if res.num_workers else None),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=paths.runs,
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
            callbacks=[history, *callbacks],
        ),
    )


def run_pretrain(spec: SweepSpec, *, resume_from: str | None = None, max_failures: int = 0, train_fn=None):
    """Prepare data, train the spec's base run, return the ray.train.Result."""

    if spec.sweep.grid or spec.sweep.runs:
        raise UserError("sweep.grid: this config is a sweep; run it with raybiphase sweep")

    run = spec.run
    storage.check_writable(storage.absolute(spec.sweep.storage), "sweep.storage")
    assets.use_mirror(storage.absolute(spec.sweep.storage))
    ensure_ray()
    data_dir = prepare(run.data, storage_root=storage.absolute(spec.sweep.storage))
    name, paths = run_name(run), storage.SweepPaths.of(spec.sweep.storage, spec.sweep.name)
    trainer = make_trainer(run, name=name, paths=paths, data_dir=data_dir, resume_from=resume_from,
                           wandb=sweep_settings(spec), max_failures=max_failures, train_fn=train_fn)
    with Watch({name: storage.join(paths.run_dir(name), PROGRESS_FILE)}):  # step, loss, tok/s, ETA every few seconds
        return trainer.fit()
