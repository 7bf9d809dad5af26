"""Results: typed rows, the append-only Parquet store, aggregation, the report, the importer of the authors' trees, W&B."""
