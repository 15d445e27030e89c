"""A shipped artifact timed in a process of its own, as a user's service runs it.

``bench e2e`` times ``tensortune.load`` in its own process too, but that process has built,
tuned and run other runtimes: its heap, its thread pools and the pages of the model already
mapped are not what a fresh service has. The artifact here is loaded by a child interpreter
that has imported nothing else, and timed there on request, one round at a time, so it can
take turns with the tuned build timed in the parent (``e2e._time_own_process``).

The parent and the child speak one JSON object per line over the child's stdin and stdout:
``{"do": "outputs", "to": PATH}`` (the child saves its outputs to an ``.npz``) and
``{"do": "time", "repeat": N}`` (the median of ``N`` timings, each looping calls for at least
50 ms as every system's do); the child answers ``{"ok": ...}`` or ``{"error": ONE_LINE}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from tensortune.errors import TensortuneError, last_line


class OwnProcess:
    """``run()`` gives the artifact's outputs on ``inputs``; ``median_of(repeat)`` a round's
    median seconds per call, measured in the child. ``close()`` ends the child. A child that
    does not answer within ``timeout_s`` (a kernel that hangs) is killed, with a one-line
    error."""

    def __init__(self, artifact: Path, inputs: list[np.ndarray], threads: int, work: Path,
                 timeout_s: float = 600.0) -> None:  # fmt: skip
        self._work = work
        self._timeout_s = timeout_s
        inputs_file = work / f"{artifact.stem}-inputs.npz"
        np.savez(inputs_file, *inputs)
        self._log_path = work / f"{artifact.stem}-own-process.log"
        self._log = open(self._log_path, "w")  # noqa: SIM115
        env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
        self._child = subprocess.Popen(
            [sys.executable, "-m", __name__, str(artifact), str(inputs_file)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
        )  # fmt: skip
        try:
            self._ask({"do": "ready"})
        except TensortuneError:
            self.close()
            raise

    def __call__(self) -> list[np.ndarray]:
        to = self._work / "own-process-outputs.npz"
        self._ask({"do": "outputs", "to": str(to)})
        with np.load(to) as z:
            return [z[f"arr_{i}"] for i in range(len(z.files))]

    def median_of(self, repeat: int) -> float:
        return float(self._ask({"do": "time", "repeat": repeat}))

    def close(self) -> None:
        """End the child (it leaves when its stdin closes) and let go of its pipes."""
        for f in (self._child.stdin, self._child.stdout, self._log):
            with contextlib.suppress(OSError):  # the child died with our request unread
                f.close()
        try:
            self._child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()

    def _ask(self, request: dict) -> object:
        try:
            self._child.stdin.write(json.dumps(request) + "\n")
            self._child.stdin.flush()
            # One line answers each request, so nothing is left in the pipe's buffer to miss.
            ready, _, _ = select.select([self._child.stdout], [], [], self._timeout_s)
            if not ready:
                self._child.kill()
                self.close()
                raise TensortuneError(f"the artifact's own process did not answer "
                                      f"{request['do']!r} in {self._timeout_s:g} s "
                                      "(a kernel that hangs?)")  # fmt: skip
            line = self._child.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.close()
            tail = self._log_path.read_text().strip().splitlines()
            why = tail[-1] if tail else f"exit status {self._child.returncode}"
            raise TensortuneError(f"the artifact's own process ended: {why}")
        answer = json.loads(line)
        if "error" in answer:
            raise TensortuneError(f"the artifact's own process: {answer['error']}")
        return answer["ok"]


def _serve(artifact: str, inputs_file: str) -> None:
    """The child: load the artifact (which sets nothing TVM_NUM_THREADS has not set), then
    answer requests until stdin closes."""
    from tensortune.deploy.artifact import load
    from tensortune.measure.executable import seconds_per_call

    with np.load(inputs_file) as z:
        inputs = [z[f"arr_{i}"] for i in range(len(z.files))]
    # The answers get stdout to themselves: anything else written there (by Python or by a
    # library's C code) goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        model = load(artifact)
        broken = ""
    except Exception as e:  # said in answer to the parent's first request
        broken = f"{type(e).__name__}: {last_line(e)}"
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if broken:
                raise RuntimeError(broken)
            if request["do"] == "ready":
                answer: object = True
            elif request["do"] == "outputs":
                got = model(*inputs)
                np.savez(request["to"], *(got if isinstance(got, tuple) else (got,)))
                answer = request["to"]
            elif request["do"] == "time":
                call = lambda: model(*inputs)  # noqa: E731
                answer = statistics.median(seconds_per_call(call)
                                           for _ in range(int(request["repeat"])))  # fmt: skip
            else:
                raise ValueError(f"unknown request {request['do']!r}")
            out.write(json.dumps({"ok": answer}) + "\n")
        except Exception as e:  # the parent names it and goes on without this system
            why = broken or f"{type(e).__name__}: {last_line(e)}"
            out.write(json.dumps({"error": why}) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(*sys.argv[1:3])
