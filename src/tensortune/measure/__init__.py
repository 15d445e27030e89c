"""Measuring candidates: builders, runners, their worker processes and device farms.

This module imports nothing heavy: a command checks what it was given before TVM loads.
"""


def names_a_farm(spec: object) -> bool:
    """Whether a runner the user named (``"local"``, ``None``, a URL) is a device farm."""
    return isinstance(spec, str) and spec.strip() != "local"
