"""Which programs to measure: samplers for dataset collection (active learning builds on these)."""
