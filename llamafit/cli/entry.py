"""The ``llamafit`` executable: a fast path for shell completion, then the Typer app.

Completion scripts call ``llamafit __complete repos`` while the user presses Tab, so that path
must answer in a few tens of milliseconds: it imports only the Hugging Face cache reader, never
Typer, rich, NVML or the network.
"""

from __future__ import annotations

import gc
import sys

# The cyclic collector's first generation runs every 700 allocations; a plan allocates hundreds of thousands of
# small objects (graphs of tensors, footprints) that reference counting frees, so it ran over them for little:
# 232 collections, 55 ms of a dry run over two RPC devices (8 %). Still run, 300 times less often; mypy tunes its
# process the same way for the same reason (mypy/build.py, ``gc.set_threshold``). The library leaves its caller's.
GC_THRESHOLDS = (200_000, 30, 30)


def complete(what: str) -> int:
    if what == "repos":
        from llamafit.hub.cache import cached_repos

        for repo in cached_repos():
            sys.stdout.write(repo + "\n")
    return 0


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["__complete"]:
        sys.exit(complete(argv[1] if len(argv) > 1 else ""))
    gc.set_threshold(*GC_THRESHOLDS)  # before the imports: building the dataclasses allocates too
    from llamafit.cli.app import main as app_main

    app_main()
