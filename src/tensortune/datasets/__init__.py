"""Datasets of measured programs: Parquet tables with labels and cached features, built from
records, each with a card saying how it was made."""
