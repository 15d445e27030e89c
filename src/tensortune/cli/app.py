"""The ``tensortune`` command line: one module per command group, each a thin layer over the
Python API; this one assembles them and turns every failure into one line and an exit status.

Exit status: 0 done, 2 bad input (one ``error: ...`` line naming the option), 1 an unexpected
failure (one line; ``--debug`` shows the traceback), 130 interrupted.  What TVM's and LLVM's
native code prints on stderr goes to a log file, not the terminal (``--debug`` shows it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli import bench, dataset, records, serve, train, transfer, tune, workloads
from tensortune.cli import compile as compile_cmd
from tensortune.cli.display import errors
from tensortune.cli.options import forget_renamed_options, option_name
from tensortune.errors import TensortuneError, interrupt, interruptible, last_line

app = typer.Typer(
    name="tensortune",
    help="Fast auto-tuning of tensor programs on Apache TVM MetaSchedule.\n\n"
    "Example: tensortune tune -w matmul:512,512,512 --trials 64",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help: brackets in option texts stay text
    context_settings={"max_content_width": 100},
)
app.command("tune")(tune.tune)
app.command("transfer")(transfer.transfer)
app.command("workloads")(workloads.workloads)
app.add_typer(records.app, name="records")
app.add_typer(dataset.app, name="dataset")
app.command("train")(train.train)
app.command("evaluate")(train.evaluate)
app.command("finetune")(train.finetune)
app.command("compile")(compile_cmd.compile_)
app.add_typer(bench.app, name="bench")
app.command("serve")(serve.serve)


def _version(value: bool) -> None:
    if value:
        from tensortune import __version__

        print(f"tensortune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_version,
            help="Print tensortune's version and exit.",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="On errors, show the traceback; show TVM's native messages (allowed "
            "anywhere on the command line).",
        ),
    ] = False,
) -> None:
    """Fast auto-tuning of tensor programs on Apache TVM MetaSchedule."""


def native_log() -> Path:
    """Where the native code's stderr goes during a command."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tensortune" / "native.log"


@contextlib.contextmanager
def _native_stderr_to_log() -> Iterator[None]:
    """Point file descriptor 2 (what C++ code writes to) away from the terminal while Python's
    own stderr (our error lines, warnings) keeps it; whatever the native code wrote is
    appended to ``native_log()`` afterwards.

    It is written meanwhile to a file of this process's own beside the log: a command that
    dies hard (a segmentation fault, "LLVM ERROR" and abort, SIGKILL) leaves it there, with
    the lines that say why, and the next command appends it to the log."""
    sys.stderr.flush()
    captured = _capture_file()
    terminal = os.dup(2)
    python_stderr = sys.stderr
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1)
    os.dup2(captured.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)
        os.close(terminal)
        sys.stderr.close()
        sys.stderr = python_stderr
        _keep(captured)


def _capture_file():
    """This process's file for native messages (``native-PID-SCOPE.part`` beside the log, its
    first line the command); an anonymous temporary file where the log's directory does not
    exist yet (a command that measures nothing makes none) or cannot be written."""
    path = native_log().with_name(f"native-{os.getpid()}-{_scope()}.part")
    try:
        if path.exists():  # a dead command's of this pid: its messages go first, not lost
            _append_log(_left_by_the_dead(path.parent, also=path))
        captured = open(path, "w+b")  # noqa: SIM115  (closed by _keep)
        captured.write(f"--- tensortune {' '.join(sys.argv[1:])}\n".encode())
        captured.flush()
        return captured
    except OSError:
        return tempfile.TemporaryFile()


def _keep(captured) -> None:
    """Append what the native code wrote (if anything) to the log, and what commands that
    died left; a log that cannot be written loses it."""
    with captured:
        captured.seek(0)
        text = captured.read()
    named = getattr(captured, "name", None)
    if isinstance(named, str) and Path(named).name.startswith("native-"):  # ours, headed
        with contextlib.suppress(OSError):
            Path(named).unlink()
        header, _, body = text.partition(b"\n")
        text = header + b"\n" + body if body else b""
    else:
        text = f"--- tensortune {' '.join(sys.argv[1:])}\n".encode() + text if text else b""
    with contextlib.suppress(OSError):
        _append_log(_left_by_the_dead(native_log().parent) + text)


def _append_log(data: bytes) -> None:
    if not data:
        return
    path = native_log()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.stat().st_size > 10 * 2**20:
        path.unlink()  # old messages are worth less than the disk
    with open(path, "ab") as log:
        log.write(data)


def _left_by_the_dead(directory: Path, also: Path | None = None) -> bytes:
    """The messages of commands that died before they could append them (their files taken
    away), each marked as such: of this pid namespace, those whose process is gone; of an
    earlier boot, all; and ``also``'s."""
    import psutil

    out = b""
    scope = _scope()
    for part in sorted({*directory.glob("native-*.part"), *([also] if also else [])}):
        _, pid, theirs = [*part.stem.split("-"), "", ""][:3]
        if part != also and (
            not pid.isdigit()
            or (theirs == scope and psutil.pid_exists(int(pid)))
            or (theirs != scope and (not scope or theirs[:8] == scope[:8]))  # another container
        ):  # fmt: skip
            continue
        with contextlib.suppress(OSError):
            header, _, body = part.read_bytes().partition(b"\n")
            part.unlink()
            if body:
                out += header + b" (it ended without a word: its last messages)\n" + body
    return out


def _scope() -> str:
    """Where this process's pid means something (``hardware.pid_scope``): a container
    sharing the cache sees other pids, and leaves their files alone."""
    from tensortune.hardware.fingerprint import pid_scope

    return (pid_scope() or "").replace(":", "")


def run(argv: list[str] | None = None) -> int:
    """Run one command line (default: this process's arguments); returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end] or os.environ.get("TENSORTUNE_DEBUG") == "1"
    args = [a for i, a in enumerate(args) if a != "--debug" or i >= end]
    forget_renamed_options()
    try:
        with (contextlib.nullcontext() if debug else _native_stderr_to_log(), interruptible(),
              _terminate_as_interrupt()):  # fmt: skip
            code = app(args, prog_name="tensortune", standalone_mode=False)
    except TensortuneError as e:
        return _fail(2, _message(e), debug)
    except typer.TyperException as e:  # a usage error: unknown option, missing value...
        if type(e).__name__ == "NoArgsIsHelpError":
            print(e.format_message())
            return 0
        text = " ".join(e.format_message().split())
        return _fail(getattr(e, "exit_code", 2), f"{text} (see tensortune --help)", debug)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # e.g. `tensortune records stats | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        hint = "" if debug else " (run with --debug for the traceback)"
        return _fail(1, f"{type(e).__name__}: {last_line(e)}{hint}", debug)
    if code == 130:
        errors.print("interrupted: measured records are saved; run the same command to resume")
    return code if isinstance(code, int) else 0


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (``timeout``, ``docker stop``, a closed terminal) stop a command as
    Ctrl-C does: what is measured is recorded, workers and temporary files are cleaned up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    # A signal the caller ignores stays ignored: a run started with nohup outlives its
    # terminal.
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(s) != signal.SIG_IGN}  # fmt: skip
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _message(e: TensortuneError) -> str:
    return e.message if e.param is None else f"{option_name(e.param)}: {e.message}"


def _fail(code: int, message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc(file=sys.stderr)
    errors.print(f"error: {message}")
    return code


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
