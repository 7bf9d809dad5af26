"""The GPU sweep's figures as a record: `sweeps/gpu.yaml` end to end on one GPU, against the plain loop there.

    bash benchmarks/gpu_checks.sh OUT sweep          # on the GPU machine: the sweep, the plain loop, this record
    python benchmarks/gpu_sweep_record.py results/gpu --log OUT/sweep.log --plain OUT/plain-210m.json \
        --out benchmarks/results/h100-sweep-DATE.json  # the same, from a sweep's folder and the two files

Reads the sweep's own files (pretrain.parquet, finetune.parquet, the fine-tuning trials' result.json, sweep.json)
and writes one JSON record:
- per segment, the tokens/s and MFU of each logged window and of its best one, against the plain loop's compiled
  step of the same objective measured on the same machine (`bench_train_gpu.py run --modes plain`); while two
  segments share the GPU each window counts only its own tokens, so the pair's sum is what compares with the plain
  loop (`pairs`: the windows of the segments that started together from step 0, ending at the same step);
- the fine-tuning trials: how many, their span from the first start to the last end, trials per hour over it, the
  mean trial's seconds, and when the first started against the last segment's end (beside pretraining or after);
- the sweep's own `time:` line (where the wall time went), and the versions of torch, transformers and Ray.
It prints the headline. What a run adds by hand (the setup, the machine, notes) belongs beside these fields.
"""

from __future__ import annotations

import argparse
import json
import statistics
from importlib.metadata import version
from pathlib import Path

from raybiphase.results.store import read_rows
from raybiphase.storage import FINETUNE_FILE, PRETRAIN_FILE, read_json
from raybiphase.sweep.driver import trials_run


def segment_windows(results: Path) -> dict[str, list[dict]]:
    """Each segment's logged windows (step, objective, tokens/s, MFU, peak memory), from its history."""
    out = {}
    for history in sorted((results / "runs").glob("*/history.json")):
        out[history.parent.name] = [
            {"step": m["step"], "objective": m["objective"], "tokens_per_s": round(m["tokens_per_s"]),
             "mfu": round(m["mfu"], 4), "peak_mem_gb": round(m["peak_mem_gb"], 1)}
            for m in json.loads(history.read_text()) if m.get("tokens_per_s")]
    return out


def segments(windows: dict[str, list[dict]], plain: dict[str, dict]) -> list[dict]:
    rows = []
    for name, seen in windows.items():
        best = max(seen, key=lambda w: w["tokens_per_s"])
        base = plain[best["objective"]]
        rows.append({"segment": name, "objective": best["objective"], "windows": seen,
                     "best_tokens_per_s": best["tokens_per_s"], "best_mfu": best["mfu"],
                     "plain_loop_tokens_per_s": round(base["tokens_per_s"]),
                     "best_ratio_to_plain": round(best["tokens_per_s"] / base["tokens_per_s"], 3)})
    return rows


def pairs(windows: dict[str, list[dict]]) -> list[dict]:
    """Windows of two segments that both start at step 0 (started together, side by side on the GPU) and end at
    the same step: the GPU's total tokens/s while both trained."""
    by_step: dict[int, list[tuple[str, dict]]] = {}
    for name, seen in windows.items():
        if name.split("-")[2] != "0":  # <size>-<objective>-<start>-<end>-<hash>
            continue
        for w in seen:
            by_step.setdefault(w["step"], []).append((name, w))
    return [{"step": step, "segments": [n for n, _ in both],
             "tokens_per_s_sum": sum(w["tokens_per_s"] for _, w in both)}
            for step, both in sorted(by_step.items()) if len(both) == 2]


def trials(results: Path) -> dict:
    spans = []
    for result in results.glob("finetune*/trial_*/result.json"):
        lines = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
        if lines and not lines[0].get("keepalive"):
            end = lines[-1]["timestamp"]
            spans.append((end - lines[-1]["time_total_s"], end))
    ran = trials_run(read_rows(results / FINETUNE_FILE).to_dict("records"))  # not the copies of shared weights
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    segment_end = max(json.loads(p.read_text())["time"] for p in (results / "runs").glob("*/progress.json"))
    return {"trials": len(spans), "span_s": round(last - first, 1),
            "trials_per_hour": round(len(spans) * 3600 / (last - first)),
            "trial_seconds_mean": round(statistics.mean(r["seconds"] for r in ran), 1),
            "first_start_before_last_segment_end_s": round(segment_end - first, 1)}


def record(results: Path, log: Path, plain_json: Path) -> dict:
    plain = {r["objective"]: r for r in json.loads(plain_json.read_text())}
    windows = segment_windows(results)
    text = log.read_text()
    time_line = next(line for line in reversed(text.splitlines()) if line.startswith("time: "))
    sweep = read_json(str(results / "sweep.json"))
    first = next(iter(plain.values()))
    pre = read_rows(results / PRETRAIN_FILE)
    out = {"benchmark": "gpu_sweep", "device": first["device"], "torch": first["torch"],
           "transformers": first["transformers"], "ray": version("ray"), "date": first["date"], "code": sweep["code"],
           "hardware": sweep["hardware"], "time_line": time_line,
           "pretrain_rows": len(pre), "segments": segments(windows, plain), "pairs": pairs(windows),
           "plain_loop": {k: {"tokens_per_s": round(v["tokens_per_s"]), "mfu": round(v["mfu"], 4),
                              "micro_batch": v["micro_batch"], "peak_mem_gb": round(v["peak_mem_gb"], 1)}
                          for k, v in plain.items()},
           "fine_tuning": trials(results)}
    best_pair = max(out["pairs"], key=lambda p: p["tokens_per_s_sum"], default=None)
    ratios = [s["best_ratio_to_plain"] for s in out["segments"]]
    ft = out["fine_tuning"]
    out["headline"] = (
        f"{time_line[6:].split(' in all', 1)[0]} end to end; the segments' best windows at {min(ratios):.2f}-"
        f"{max(ratios):.2f}x the plain loop's tokens/s (a window counts only its own segment's tokens)"
        + (f"; the two segments started together {best_pair['tokens_per_s_sum'] / 1e3:.0f}k tok/s together"
           if best_pair else "")
        + " (plain: " + ", ".join(f"{k} {v['tokens_per_s'] / 1e3:.0f}k" for k, v in out["plain_loop"].items())
        + f"); {ft['trials']} fine-tuning trials at {ft['trials_per_hour']}/hour, {ft['trial_seconds_mean']} s each")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("results", type=Path, help="the sweep's folder (<sweep.storage>/<sweep.name>)")
    parser.add_argument("--log", type=Path, required=True, help="the sweep's console output")
    parser.add_argument("--plain", type=Path, required=True, help="bench_train_gpu.py run --json of the plain loop")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out = record(args.results, args.log, args.plain)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(out["headline"])


if __name__ == "__main__":
    main()
