"""``tensortune serve``: a thin layer over ``tensortune.measure.rpc.serve``."""

from __future__ import annotations

from typing import Annotated

import typer

from tensortune.cli.display import console


def serve(
    tracker: Annotated[
        str,
        typer.Option(
            "--tracker",
            metavar="HOST:PORT",
            help="The TVM RPC tracker to register with (python -m tvm.exec.rpc_tracker).",
        ),
    ],
    key: Annotated[
        str,
        typer.Option(
            "--key",
            metavar="KEY",
            help="The key to register under: the same for every device of one kind; tuners "
            "name it in --runner rpc://HOST:PORT/KEY.",
        ),
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDR",
            help="Address to listen on and to give the tracker for clients to connect to: "
            "this device's address on the farm's network (default: loopback, this machine "
            "only; not 0.0.0.0, which clients cannot connect to).  Whoever reaches it can run "
            "code here: TVM's RPC has no authentication.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port",
            metavar="N",
            help="Port to listen on: the first free one from N to N+99.",
        ),
    ] = 9090,
) -> None:
    """Serve measurements for a device farm: register this machine with a TVM RPC tracker.

    Tuners build candidates on their own machine and time them here, in one session per
    candidate.  Each session can ask what hardware this is, so records name this device, not
    the tuner's machine.  Runs until interrupted (Ctrl-C).

    Example: tensortune serve --tracker 10.0.0.2:9190 --key epyc-2c --host 10.0.0.5
    """
    from tensortune.measure.rpc import describe, serve

    def ready(bound: int, hardware) -> None:
        console.print(f"serving {describe(hardware)} on {host}:{bound} under key {key!r} of "
                      f"the tracker at {tracker}; Ctrl-C stops")  # fmt: skip

    try:
        serve(tracker, key, host=host, port=port, on_ready=ready)
    except KeyboardInterrupt:  # how a server is meant to stop: not a failure
        console.print("stopped")
