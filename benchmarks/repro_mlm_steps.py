"""The quickstart's pretraining steps in one process, every loss to full precision: where two installs part.

The quickstart's MLM-only (or CLM-only) run as sweeps/quickstart.yaml writes it, on its prepared data (the shards
`python -m raybiphase prepare sweeps/quickstart.yaml` makes, found where the sweep finds them), trained by the steps
the production loop takes on one worker (raybiphase.pretrain.loop: the same model build, parameter groups, AdamW
without foreach, schedule, masking by sample id, token-weighted loss, clipping and held-out evaluation), without Ray:
one CPU thread, as a quickstart worker of 0.45 CPU has. Each step prints its training loss as a float's hex (equal
hex: equal bits) and a digest of the weights after it; `--eval-every` steps also print the held-out losses. Run it
under two installs and compare the lines: the first line that differs is the first step the two compute
differently, and whether its loss or only the digest moved says whether the forward pass or the update did.

    python benchmarks/repro_mlm_steps.py --objective mlm --steps 800 --out /tmp/mlm-new.jsonl
    PYTHONPATH=/tmp/tf523:$PWD python benchmarks/repro_mlm_steps.py --objective mlm --steps 800 --out /tmp/mlm-old.jsonl
    python benchmarks/repro_mlm_steps.py --compare /tmp/mlm-old.jsonl /tmp/mlm-new.jsonl

At 800 steps the held-out losses are the run's own (the quickstart record's `held_out_loss` of that run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import numpy as np  # noqa: E402
import torch  # noqa: E402

from raybiphase.config import SweepSpec, load, replace  # noqa: E402
from raybiphase.data.prepare import dataset_location  # noqa: E402
from raybiphase.data.stream import make_inputs, open_dataset, read_samples, validation_batches  # noqa: E402
from raybiphase.optim import adamw, set_lr  # noqa: E402
from raybiphase.phases import Schedule  # noqa: E402
from raybiphase.pretrain.loop import evaluate, masking_spec, step_tokens  # noqa: E402
from raybiphase.pretrain.loss import token_weighted  # noqa: E402
from raybiphase.pretrain.model import initial_model, loss_terms  # noqa: E402

PACKAGES = ("torch", "transformers", "tokenizers", "numpy")
CLM_SHARE = {"mlm": 0.0, "clm": 1.0}


def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def train(config: Path, objective: str, steps: int, eval_every: int, out) -> None:
    spec = load(SweepSpec, config)
    run = replace(spec.run, {"phases.clm_share": CLM_SHARE[objective]})
    manifest = open_dataset(dataset_location(run.data, spec.sweep.storage), seq_len=run.data.seq_len)
    torch.use_deterministic_algorithms(True, warn_only=True)  # as the loop
    schedule = Schedule.from_config(run)
    rows, micro = run.rows_per_step, run.train.micro_batch_size
    model = initial_model(run, manifest).train()
    optimizer = adamw(model, lr=run.optim.lr, betas=run.optim.betas, eps=run.optim.eps,
                      weight_decay=run.optim.weight_decay, decay_embeddings=run.optim.decay_embeddings, foreach=False)
    val = validation_batches(manifest, batch_size=micro, batches=run.train.eval_batches,
                             mask_ratio=run.train.eval_mask_ratio)
    emit = lambda line: (print(json.dumps(line), flush=True), out and out.write(json.dumps(line) + "\n"))  # noqa: E731
    emit({"packages": {name: metadata.version(name) for name in PACKAGES}, "objective": objective,
          "weights": weights_digest(model)})
    for step in range(min(steps, schedule.total_steps)):
        phase, lr = schedule.at(step)
        mask = masking_spec(phase, run, first_sample=0, rows_per_step=rows) if phase.objective == "mlm" else None
        set_lr(optimizer, lr)
        batches = []
        for start in range(step * rows, (step + 1) * rows, micro):  # the loop's micro-batches, in order
            ids = np.arange(start, start + micro, dtype=np.int64)
            blocks = read_samples(manifest, ids, run.train.seed, run.data.row_order == "shuffled")
            batch = make_inputs(blocks, ids, phase.objective, manifest, run.train.seed, mask)
            batches.append({k: torch.from_numpy(batch[k]) for k in ("input_ids", "labels")})
        tokens, total = step_tokens(batches, world=1), torch.zeros(())
        for batch in batches:
            loss_sum, _ = loss_terms(model, batch, phase.objective, run.train.head_chunk_rows)
            token_weighted(loss_sum, tokens, world=1).backward()
            total += loss_sum.detach()
        if run.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        line = {"step": step + 1, "loss": float(total / tokens).hex(), "weights": weights_digest(model)}
        if (step + 1) % eval_every == 0:
            line.update({k: round(v, 6) for k, v in evaluate(model, val, torch.device("cpu")).items()})
        emit(line)


def compare(first: Path, second: Path) -> int:
    """The first line where two outputs differ (their package versions aside); 0 when none does."""
    a, b = ([json.loads(s) for s in p.read_text().splitlines()] for p in (first, second))
    print("packages:", a[0]["packages"], "vs", b[0]["packages"])
    for one, two in zip(a, b):
        one, two = ({k: v for k, v in line.items() if k != "packages"} for line in (one, two))
        if one != two:
            print("first difference:", one, "vs", two)
            return 1
    print(f"equal over {min(len(a), len(b)) - 1} steps")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("sweeps/quickstart.yaml"))
    parser.add_argument("--objective", choices=sorted(CLM_SHARE), default="mlm")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a quickstart worker has one)")
    parser.add_argument("--out", type=Path, help="also write the lines to this file")
    parser.add_argument("--compare", type=Path, nargs=2, metavar="FILE", help="compare two outputs instead")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with open(args.out, "w") if args.out else open("/dev/null", "w") as out:
        train(args.config, args.objective, args.steps, args.eval_every, out)
    print(f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
