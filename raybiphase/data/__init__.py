"""Data: offline assets, text sources, corpus preparation into packed Parquet shards, counter-based masking, addressable streams."""
