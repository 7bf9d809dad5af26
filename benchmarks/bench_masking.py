"""Throughput of the masking every Train worker's stream runs vs transformers' DataCollatorForLanguageModeling.

Both sides turn the same packed token blocks into MLM (input_ids, labels) torch tensors,
batch by batch, on one CPU thread:

* raybiphase: a numpy batch ``{"input_ids": (B, L), "sample_id": (B,)}`` as Ray Data's
  ``map_batches`` delivers it -> ``raybiphase.data.stream.make_inputs`` (what ``PhaseBatches`` runs on each
  batch after reading its blocks) -> ``torch.from_numpy``.
* transformers: a list of B ``{"input_ids": [int, ...]}`` dicts as a DataLoader over a
  datasets.Dataset delivers it -> ``DataCollatorForLanguageModeling`` (pads, collates to
  tensors, masks). A second row feeds it rows that are already torch tensors.

Blocks come from the wiki asset (``python -m raybiphase assets fetch``) tokenised with a
small BPE trained here; without the asset, random ids over a WordLevel vocab are used.
No network access is needed.

    python benchmarks/bench_masking.py [--blocks 256] [--length 512] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
from raybiphase.data.masking import IGNORE_INDEX, MaskingSpec  # noqa: E402
from raybiphase.data.stream import make_inputs  # noqa: E402

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around a `tokenizers` model, with the special tokens declared."""
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def wiki_texts() -> list[str] | None:
    """Wiki summaries from the raybiphase asset cache, or None when absent."""
    try:
        from raybiphase.data.assets import asset_path
        path = asset_path("wiki")
    except Exception as exc:  # no asset module, no cache, failed verification: fall back
        print(f"# wiki asset unavailable ({exc}); using random ids")
        return None
    data = json.loads(Path(path).read_text())
    return [v["extract"] for v in data.values() if isinstance(v, dict) and v.get("extract")]


def build_blocks(n_blocks: int, length: int, vocab: int, seed: int):
    """(blocks int32 (n, L), tokenizer, source description)."""
    texts = wiki_texts()
    if texts is not None:
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                                           show_progress=False))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        stream: list[int] = []
        for enc in tok.encode_batch(texts):  # pack documents: [CLS] doc [SEP] [CLS] doc [SEP] ...
            stream += [cls, *enc.ids, sep]
            if len(stream) >= n_blocks * length:
                break
        if len(stream) >= n_blocks * length:
            ids = np.asarray(stream[: n_blocks * length], dtype=np.int32).reshape(n_blocks, length)
            return ids, wrap(tok), f"wiki asset, BPE vocab {tok.get_vocab_size()}"
        print(f"# wiki gives only {len(stream)} tokens; using random ids")
    words = {t: i for i, t in enumerate(SPECIALS)}
    words.update({f"w{i}": i for i in range(len(SPECIALS), vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    ids = np.random.default_rng(seed).integers(len(SPECIALS), vocab, (n_blocks, length), dtype=np.int32)
    ids[:, 0] = words["[CLS]"]
    return ids, wrap(tok), f"random ids, WordLevel vocab {vocab}"


def best_of(fn, repeats: int) -> tuple[float, list]:
    """Smallest wall time of `repeats` calls and the last call's outputs."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def masked_share(outputs, blocks: np.ndarray, special_ids: list[int]) -> float:
    """Share of non-special tokens that got a label (sanity check that both sides mask alike)."""
    labels = np.concatenate([o["labels"].numpy() for o in outputs])
    return float((labels != IGNORE_INDEX).sum() / (~np.isin(blocks, special_ids)).sum())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--vocab", type=int, default=50_000)
    p.add_argument("--ratio", type=float, default=0.4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # one core each, for a like-for-like comparison

    blocks, tokenizer, source = build_blocks(args.blocks, args.length, args.vocab, args.seed)
    special_ids = sorted(tokenizer.all_special_ids)
    mask_id, vocab = tokenizer.mask_token_id, len(tokenizer)
    n_tok, bs = blocks.size, args.batch_size
    starts = range(0, len(blocks), bs)
    np_batches = [{"input_ids": blocks[s:s + bs], "sample_id": np.arange(s, s + len(blocks[s:s + bs]))}
                  for s in starts]
    list_rows = [{"input_ids": row.tolist()} for row in blocks]  # DataLoader over a HF dataset
    tensor_rows = [{"input_ids": torch.from_numpy(row.astype(np.int64))} for row in blocks]
    print(f"# {args.blocks} blocks x {args.length} tokens ({source}), batch {bs}, "
          f"mlm ratio {args.ratio}, best of {args.repeats}, torch threads {torch.get_num_threads()}")

    # make_inputs reads the vocabulary and the special tokens off the shards' manifest
    manifest = types.SimpleNamespace(vocab_size=vocab, special_ids={"mask_token": mask_id, **{
        f"special_{i}": i for i in special_ids if i != mask_id}})

    def ours(spec):
        def run():
            outs = []
            for b in np_batches:
                o = make_inputs(b["input_ids"], b["sample_id"], "mlm", manifest, args.seed, spec)
                outs.append({"input_ids": torch.from_numpy(o["input_ids"]),
                             "labels": torch.from_numpy(o["labels"])})
            return outs
        return run

    def theirs(mask_prob, random_prob, rows):
        collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=args.ratio, seed=args.seed,
                                                   mask_replace_prob=mask_prob,
                                                   random_replace_prob=random_prob)
        return lambda: [collator(rows[s:s + bs]) for s in starts]

    cases = [
        ("raybiphase make_inputs", "80/10/10", ours(MaskingSpec(mask_ratio=args.ratio, mask_prob=0.8,
                                                               random_prob=0.1))),
        ("transformers collator, list rows", "80/10/10", theirs(0.8, 0.1, list_rows)),
        ("transformers collator, tensor rows", "80/10/10", theirs(0.8, 0.1, tensor_rows)),
        ("raybiphase make_inputs", "100/0/0", ours(MaskingSpec(mask_ratio=args.ratio))),
        ("transformers collator, list rows", "100/0/0", theirs(1.0, 0.0, list_rows)),
    ]
    rates: dict[tuple[str, str], float] = {}
    print(f"{'method':<36} {'split':>9} {'best s':>8} {'Mtok/s':>8} {'masked':>7}")
    for name, split, fn in cases:
        seconds, outs = best_of(fn, args.repeats)
        rates[name, split] = n_tok / seconds
        share = masked_share(outs, blocks, special_ids)
        print(f"{name:<36} {split:>9} {seconds:>8.4f} {n_tok / seconds / 1e6:>8.2f} {share:>7.3f}")

    for split in ("80/10/10", "100/0/0"):
        a, b = rates["raybiphase make_inputs", split], rates["transformers collator, list rows", split]
        print(f"masking+collation ({split}): raybiphase {a / 1e6:.1f}M tok/s vs "
              f"transformers {b / 1e6:.2f}M tok/s -> {a / b:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
