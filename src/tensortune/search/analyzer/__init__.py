"""The analyzer: a cheap latency estimate of a scheduled program from its loop-nest symbols, on
a roofline of the platform's machine.  Draft-then-verify drafts candidates with it.

``symbols`` reads the TIR; ``machine`` gives the roofline its parameters; ``roofline`` turns
both into a latency (``Analyzer``); ``cost_model`` wraps it for MetaSchedule; ``quality``
checks how well its drafts recall a dataset's best programs.
"""

from tensortune.search.analyzer.roofline import Analyzer, estimate_latency

__all__ = ["Analyzer", "estimate_latency"]
