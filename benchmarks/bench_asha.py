"""Fine-tuning steps with ASHA against the full LR x seed grid, and whether ASHA picks the same best LR.

On a quickstart-like grid (a tiny random EuroBERT with a BPE trained on real offline text; tweets and Wikipedia
topics; 6 LRs x 3 seeds; capped examples) the same fan-out runs twice on one local Ray (2 CPUs, one CPU per
trial): once with ASHA (`finetune.asha: true`, plus the completion pass that reruns the stopped seeds of each
task's best LR), once as the full grid. Printed, all measured in this run:

* total optimizer steps of each, and their ratio (aim: ASHA <= 0.4 of the full grid), with and without the
  completion pass;
* per (task, seed): the LR with the best final validation score among the trials that finished, ASHA vs full
  grid (aim: the same pick in >= 90% of cases); per task: the LR with the best mean validation (the protocol's pick);
* that every trial finished under both agrees on its validation score (trials are deterministic given the seed).

    python benchmarks/bench_asha.py [--tasks tweets wiki_topics] [--max-steps 60] [--eval-every 10]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
from raybiphase.config import SweepSpec, from_dict  # noqa: E402
import dataclasses  # noqa: E402

from raybiphase.finetune.fanout import Fanout, best_lr  # noqa: E402
from raybiphase.finetune.spec import FinetuneSource  # noqa: E402
from raybiphase.results.rows import FinetuneRow, trial_key  # noqa: E402
from raybiphase.sweep.scheduler import finetune_checkpoints  # noqa: E402


def tiny_checkpoint(out: Path, vocab_size: int = 2048) -> Path:
    """A tiny random EuroBertForMaskedLM plus a byte-level BPE trained on real offline text, as an HF folder."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from raybiphase.data import sources
    from raybiphase.pretrain.model import build_model
    from raybiphase.data.prepare import SPECIAL_TOKENS

    docs = sources.squad_contexts("dev")[:1500] + [t["text"] for t in sources.tweets()[:1500]]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS.values()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, **SPECIAL_TOKENS)
    special_ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in SPECIAL_TOKENS.items()}
    build_model("tiny", vocab_size=len(tokenizer), special_ids=special_ids, seed=0).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def per_seed_picks(rows: list[dict], *, with_completion: bool = True) -> dict[tuple, float]:
    """(task, seed) -> the LR with the best final validation among finished trials (ties: the smaller LR)."""
    finished = defaultdict(list)
    for row in rows:
        if not row["stopped_early"] and (with_completion or not row["completed_after_stop"]):
            finished[(row["task"], row["seed"])].append(row)
    return {key: max(group, key=lambda r: (r["val_score"], -r["lr"]))["lr"] for key, group in finished.items()}


def asha_pass_steps(row: dict) -> int:
    return row["steps_run"] - row["steps"] if row["completed_after_stop"] else row["steps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["tweets", "wiki_topics"])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-examples", type=int, default=960)
    parser.add_argument("--reduction-factor", type=float, default=3)
    args = parser.parse_args()

    from raybiphase.raycluster import ensure_ray

    ensure_ray(num_cpus=2)
    work = Path(tempfile.mkdtemp(prefix="bench_asha_"))
    checkpoints = [FinetuneSource("tiny-random", 0, str(tiny_checkpoint(work / "hf")))]
    finetune = {"tasks": args.tasks, "lrs": args.lrs, "seeds": args.seeds, "batch_size": args.batch_size,
                "max_steps": args.max_steps, "eval_every": args.eval_every, "max_examples": args.max_examples}
    rows, seconds = {}, {}
    for mode in ("asha", "grid"):
        cfg = from_dict(SweepSpec, {"finetune": {**finetune, "asha": mode == "asha"}, "resources": {"max_concurrent": 2}})
        began = time.perf_counter()
        fanout = dataclasses.replace(Fanout.of(cfg), reduction_factor=args.reduction_factor)
        rows[mode] = finetune_checkpoints(checkpoints, fanout, storage=str(work / "results"), name=mode)
        seconds[mode] = time.perf_counter() - began

    grid_steps = sum(r["steps"] for r in rows["grid"])
    pass_steps = sum(asha_pass_steps(r) for r in rows["asha"])
    all_steps = sum(r["steps_run"] for r in rows["asha"])
    stopped = sum(r["stopped_early"] or r["completed_after_stop"] for r in rows["asha"])
    print(f"grid: {len(args.tasks)} tasks x {len(args.lrs)} LRs x {len(args.seeds)} seeds = {len(rows['grid'])} "
          f"trials, max_steps {args.max_steps}, eval every {args.eval_every}, "
          f"ASHA reduction factor {args.reduction_factor:g}")
    print(f"full grid   : {grid_steps:5d} steps  {seconds['grid']:6.1f} s")
    print(f"ASHA pass   : {pass_steps:5d} steps  ratio {pass_steps / grid_steps:.3f}  ({stopped} of "
          f"{len(rows['asha'])} trials stopped early)")
    print(f"ASHA + completion of the best LR: {all_steps:5d} steps  ratio {all_steps / grid_steps:.3f}  "
          f"{seconds['asha']:6.1f} s  (wall-clock ratio {seconds['asha'] / seconds['grid']:.3f})")

    grid_picks = per_seed_picks(rows["grid"])
    asha_picks = per_seed_picks(rows["asha"])
    pass_picks = per_seed_picks(rows["asha"], with_completion=False)
    for (task, seed), lr in sorted(grid_picks.items()):
        print(f"  {task:12s} seed {seed}: best LR full grid {lr:g}, ASHA {asha_picks.get((task, seed), math.nan):g}"
              f" (ASHA pass alone {pass_picks.get((task, seed), math.nan):g})")
    for label, picks in (("ASHA + completion", asha_picks), ("ASHA pass alone", pass_picks)):
        same = sum(picks.get(key) == lr for key, lr in grid_picks.items())
        print(f"same best LR per seed, {label}: {same}/{len(grid_picks)} = {same / len(grid_picks):.0%}")
    for task in args.tasks:
        picks = [best_lr([FinetuneRow.from_record(r) for r in rows[mode] if r["task"] == task]) for mode in ("grid", "asha")]
        print(f"  {task:12s} best LR by mean validation: full grid {picks[0]:g}, ASHA {picks[1]:g}")

    grid_val = {trial_key(r): r["val_score"] for r in rows["grid"]}
    finished = [r for r in rows["asha"] if not r["stopped_early"]]
    agree = sum(r["val_score"] == grid_val[trial_key(r)] for r in finished)
    print(f"finished under both with the same validation score: {agree}/{len(finished)}")
    print(f"(results kept in {work})")


if __name__ == "__main__":
    main()
