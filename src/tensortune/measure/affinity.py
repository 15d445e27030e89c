"""Keep the thread that launches kernels off the cores TVM's thread pool is pinned to.

TVM pins each of its pool's worker threads to a core of its own, starting from the second,
and leaves the calling thread (which runs the first share of every parallel loop) free to
run on any core.  When Linux leaves that thread on a pinned worker's core, the two take turns
there while a core stays idle: a kernel of several parallel loops then times up to twice as
slow, and stays so for as long as the thread stays put.  Seen on a 2-core Zen 4 guest: the
same Winograd convolution timed 0.52 ms with the caller on core 0 and 1.03 ms on core 1, in
every one of three processes.  Restricting the caller to the cores no pinned thread holds
keeps it off theirs in every process (with SMT, a free core's sibling may still be a pinned
one's).  It does not steady a machine whose timings move for reasons of its own: there
``bench tune`` compares methods on one clock (``compare.retime``).
"""

from __future__ import annotations

import contextlib
import os
import threading

# The calling thread's cores before this module first restricted it, and what it gave it
# last: a thread started since inherits that set, and is no pinned pool thread.
_before: frozenset[int] | None = None
_given: frozenset[int] | None = None


def keep_caller_off_pool_cores() -> frozenset[int] | None:
    """Restrict the calling thread to the cores that TVM's pinned pool threads leave free.

    Makes TVM's thread pool first (it pins its threads when made), then reads the other
    threads' affinities from ``/proc``.  Returns the calling thread's new set of cores, or
    ``None`` where nothing was pinned (one thread, ``TVM_BIND_THREADS=0``, not Linux) or no
    core would be left.  Cheap enough to call before each timing: TVM may remake its pool.
    """
    import tvm

    global _before, _given
    tvm.get_global_func("runtime.NumThreads")()  # the calling thread's pool, made if new
    try:
        me = threading.get_native_id()
        mine = os.sched_getaffinity(0)
        pinned: set[int] = set()
        for name in os.listdir("/proc/self/task"):
            if int(name) == me:
                continue
            try:
                cores = os.sched_getaffinity(int(name))
            except OSError:  # the thread ended meanwhile
                continue
            if len(cores) == 1 and cores != _given:
                pinned |= cores
        free = mine - pinned
        if not pinned or not free:
            return None
        if free != mine:
            if _before is None:
                _before = frozenset(mine)
            os.sched_setaffinity(0, free)  # 0: this thread only, on Linux
        _given = frozenset(free)
        return _given
    except (OSError, AttributeError, ValueError):  # no /proc, no affinity calls
        return None


def release_caller() -> None:
    """Give the calling thread back the cores it had before it was kept off the pool's (a
    measurement worker taken over for other work, builds say, needs them all)."""
    global _before, _given
    if _before is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, _before)
    _before = _given = None
