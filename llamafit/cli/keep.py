"""``run``'s options for the server's life after ready, as given, and what a launch would refuse in them: read
and checked before anything is planned, a dry run included, without loading what serving needs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llamafit.errors import UsageError
from llamafit.paths import check_output
from llamafit.server.endpoint import parse_address
from llamafit.serving.restarts import RestartPolicy


@dataclass(frozen=True)
class KeepAlive:
    """run's options for the server's life after ready, as given (defaults: none of it, as in tests)."""

    restart: str = "no"
    max_restarts: int = RestartPolicy.max_restarts
    liveness: float = 0.0
    watch: float = 0.0
    metrics: str | None = None  # [HOST:]PORT
    events: str | None = None  # a file of llamafit.event/1 lines


@dataclass(frozen=True)
class RunOptions:
    """``run``'s options for serving, as given, built once by the command: what is shown (``--json``,
    ``--verbose``), the server's raw log (``--log-file``), how long a load may take to be ready (``--ready-timeout``,
    None: as long as it loads), whether a load that fails is planned again (``--no-retry``: not), ``--exec``, and the
    server's life after ready (``keep``)."""

    json_out: bool = False
    verbose: bool = False
    log_file: Path | None = None
    ready_timeout: float | None = None
    retry: bool = True
    exec_: bool = False
    keep: KeepAlive = KeepAlive()


def check_upkeep(keep: KeepAlive, log_file: Path | None) -> None:
    """What a launch would refuse in ``keep`` and ``--log-file``, refused before anything is planned (a dry
    run and a service's check included): a metrics address that is not one, a file to write in a folder that is
    not there, the events and the raw log in one file (the server's lines would break the JSON lines)."""
    if keep.metrics is not None:
        parse_address(keep.metrics)
    files = [(Path(keep.events), "the events file")] if keep.events else []
    files += [(log_file, "the log file")] if log_file is not None else []
    for path, what in files:
        folder = path.parent
        if not folder.is_dir():
            raise UsageError(f"cannot write {what} {path}: its folder {folder} does not exist", hint="create it first")
    if keep.events:
        check_output(Path(keep.events), (), "the events file")  # a device or a FIFO is not a file of lines
    if len(files) == 2 and _same_file(files[0][0], files[1][0]):
        raise UsageError(
            "--events and --log-file name one file: the server's raw lines would break the events' JSON lines",
            hint="give each its own file",
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False
