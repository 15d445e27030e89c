"""Datasets of measured programs: collection into the records store, and (later) Parquet files."""
