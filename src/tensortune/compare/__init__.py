"""Benchmarks that compare methods on the same footing (``tensortune bench``): search methods
on one budget (``search_methods``)."""
