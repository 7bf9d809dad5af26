"""Ray Data reads a sweep's tables as they stand: the folder of parts, in its one declared schema."""

from __future__ import annotations

import pytest

from raybiphase.results.store import read_rows
from tests.test_docs import QUICKSTART_RESULTS

pytestmark = [pytest.mark.ray]


@pytest.mark.parametrize("table", ["pretrain.parquet", "finetune.parquet"])
def test_ray_data_reads_every_row_and_column_of_a_real_sweeps_table(ray_cluster, table):
    import ray.data

    dataset = ray.data.read_parquet(str(QUICKSTART_RESULTS / table))
    expected = read_rows(QUICKSTART_RESULTS / table)
    assert dataset.count() == len(expected) and dataset.schema().names == list(expected.columns)
