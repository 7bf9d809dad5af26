"""The compute-matched view: training FLOPs as executed (the sparse MLM head on masked rows only), a continued run
charged for its source, one table per size."""

from __future__ import annotations

import pandas as pd
import pytest

from raybiphase.config.sizes import SIZES
from raybiphase.results.compute import compute_section, run_flops, with_flops

BATCH = 2_359_296


def _row(run: str, objective: str, score: float, *, size: str = "610m", steps: int = 42000, clm: int = 0,
         ratio: float = 0.4, init: str | None = None, task: str = "sst2") -> dict:
    return {"source": "raybiphase", "run": run, "objective": objective, "final": True, "task": task,
            "score": score, "size": size, "model.size": size, "phases.steps": steps, "phases.clm_steps": clm,
            "phases.mask_ratio": ratio, "train.global_batch_tokens": BATCH, "data.tokenizer": "meta-llama/x",
            "data.seq_len": 2048, "model.init_from": init}


def test_mlm_is_charged_its_head_on_the_masked_tokens_only() -> None:
    size = SIZES["610m"]
    blocks, head = size.flops_per_token(0, 2048), 6 * 128_256 * size.hidden
    mlm = run_flops(pd.Series(_row("610m-mlm40-42k-aaaaaa", "MLM", 90.0)))
    clm = run_flops(pd.Series(_row("610m-clm-42k-bbbbbb", "CLM", 88.0, clm=42000)))
    split = run_flops(pd.Series(_row("610m-clm-10k-mlm40-42k-cccccc", "CLM→MLM", 91.0, clm=10000)))
    assert mlm == pytest.approx(BATCH * 42000 * (blocks + 0.4 * head))
    assert clm == pytest.approx(BATCH * 42000 * (blocks + head))  # the dense head: the standard 6N + attention
    assert clm == pytest.approx(BATCH * 42000 * size.flops_per_token(128_256, 2048))
    assert split == pytest.approx(BATCH * (10000 * (blocks + head) + 32000 * (blocks + 0.4 * head)))
    assert mlm < split < clm


def test_a_continued_run_is_charged_for_its_source() -> None:
    rows = pd.DataFrame([_row("610m-clm-42k-bbbbbb", "CLM", 88.0, clm=42000),
                         _row("610m-clm-dec42k-mlm40-54k-dddddd", "continued", 92.0, steps=12000, init="@610m-clm-42k"),
                         _row("610m-llama-mlm40-12k-eeeeee", "continued", 80.0, steps=12000, init="/ckpt/llama")])
    out = with_flops(rows).set_index("run")
    source, own = run_flops(rows.iloc[0]), run_flops(rows.iloc[1])
    assert out.loc["610m-clm-dec42k-mlm40-54k-dddddd", "flops"] == pytest.approx(source + own)
    assert out.loc["610m-clm-dec42k-mlm40-54k-dddddd", "total_steps"] == 54000
    assert out.loc["610m-llama-mlm40-12k-eeeeee", "flops_note"] == "upstream not counted"


def test_the_view_has_a_table_per_size_smallest_first() -> None:
    rows = [_row("1b-mlm40-42k-aaaaaa", "MLM", 93.0, size="1b"), _row("1b-clm-42k-bbbbbb", "CLM", 91.0, size="1b", clm=42000),
            _row("210m-mlm40-42k-cccccc", "MLM", 85.0, size="210m"), _row("210m-mlm40-42k-cccccc", "MLM", 75.0, size="210m",
                                                                    task="squad"),
            _row("210m-clm-42k-dddddd", "CLM", 84.0, size="210m", clm=42000)]  # no squad: the mean is over sst2 only
    table = compute_section(pd.DataFrame(rows)).table
    assert table.index("**210m**") < table.index("**1b**")
    assert "| 210m-mlm40-42k | MLM | 42k |" in table and "| 85 |" in table and "| 80 |" not in table
    ratio = run_flops(pd.Series(rows[0])) / run_flops(pd.Series(rows[1]))
    assert f"| {ratio:.3f}x |" in table and "| 1.000x |" in table
