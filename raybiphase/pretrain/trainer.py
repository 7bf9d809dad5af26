"""One pretraining run on Ray Train: `python -m raybiphase pretrain CONFIG [--set k=v] [--resume-from CKPT]`.

Prepares the shards if needed, then runs `raybiphase.pretrain.loop.train_loop` under a `TorchTrainer` with
`resources.num_workers` workers (FSDP2; gloo on CPU), checkpoints under <storage>/<sweep.name>/<run name>/.
Running the same command again resumes from the run's latest checkpoint; a finished run is not recomputed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from raybiphase.cli import UserError, config_parser, run_main
from raybiphase.config import Config, load_config, to_dict
from raybiphase.sweep.naming import run_name


def storage_root(cfg: Config) -> str:
    """Absolute local path or a cloud URI (Ray Train refuses relative storage paths)."""
    storage = cfg.sweep.storage
    if "://" in storage:
        return storage.rstrip("/") + "/" + cfg.sweep.name
    return str(Path(storage).expanduser().resolve() / cfg.sweep.name)


HISTORY = "history.json"


def _fs(uri: str):
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(uri)


def read_history(run_dir: str) -> list[dict]:
    """Every metrics report of a run (rank 0's), one dict per step, in step order."""
    import pyarrow.fs

    fs, path = _fs(run_dir)
    target = f"{path}/{HISTORY}"
    if fs.get_file_info(target).type == pyarrow.fs.FileType.NotFound:
        return []
    with fs.open_input_stream(target) as handle:
        return json.loads(handle.read().decode())


class HistoryCallback:
    """Runs in the Train controller: keeps every report in <run dir>/history.json (a restart re-reports a step,
    the later report wins). Ray Train's own Result keeps only the reports that carried a checkpoint."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.rows = {row["step"]: row for row in read_history(run_dir)}

    def after_report(self, run_context, metrics, checkpoint):
        row = dict(metrics[0])
        if checkpoint is not None:
            row["checkpoint"] = checkpoint.path
        self.rows[row["step"]] = row
        fs, path = _fs(self.run_dir)
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{HISTORY}.tmp") as handle:
            handle.write(json.dumps([self.rows[k] for k in sorted(self.rows)]).encode())
        fs.move(f"{path}/{HISTORY}.tmp", f"{path}/{HISTORY}")

    def after_exception(self, run_context, worker_exceptions):
        pass


def make_trainer(cfg: Config, *, name: str, data_dir: str, resume_from: str | None = None,
                 max_failures: int = 0, callbacks=(), **loop_extra):
    """A TorchTrainer for one run (or one segment of a sweep)."""
    import ray.train
    from ray.train import UserCallback
    from ray.train.torch import TorchConfig, TorchTrainer

    history = type("History", (HistoryCallback, UserCallback), {})(f"{storage_root(cfg)}/runs/{name}")

    res = cfg.resources
    use_gpu = res.gpus_per_worker > 0
    per_worker = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if use_gpu else {})}
    from raybiphase.pretrain.loop import train_loop

    return TorchTrainer(
        train_loop,
        train_loop_config={"config": to_dict(cfg), "name": name, "data_dir": data_dir, "resume_from": resume_from, **loop_extra},
        scaling_config=ray.train.ScalingConfig(num_workers=res.num_workers, use_gpu=use_gpu,
                                               resources_per_worker=per_worker if res.num_workers else None),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_root(cfg) + "/runs",
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
            callbacks=[history, *callbacks],
        ),
    )


def run_pretrain(cfg: Config, *, resume_from: str | None = None, max_failures: int = 0, **loop_extra):
    """Prepare data, train, return the ray.train.Result."""
    from raybiphase.data.prepare import prepare
    from raybiphase.raycluster import ensure_ray

    if cfg.sweep.grid:
        raise UserError("sweep.grid: this config is a sweep; run it with python -m raybiphase.sweep")
    ensure_ray()
    data_dir = prepare(cfg.data)
    trainer = make_trainer(cfg, name=run_name(cfg), data_dir=str(data_dir), resume_from=resume_from,
                           max_failures=max_failures, **loop_extra)
    return trainer.fit()


def main() -> int:
    parser = config_parser("raybiphase pretrain", "Pretrain one encoder on Ray Train.")
    parser.add_argument("--resume-from", help="checkpoint directory to continue from (same schedule)")
    parser.add_argument("--max-failures", type=int, default=int(os.environ.get("RAYBIPHASE_MAX_FAILURES", 2)))
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    result = run_pretrain(cfg, resume_from=args.resume_from, max_failures=args.max_failures)
    print(f"pretrain: done; final metrics {result.metrics}; checkpoint {result.checkpoint.path if result.checkpoint else None}")
    return 0


if __name__ == "__main__":
    run_main(main)
