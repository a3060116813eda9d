"""The ``llamafit`` executable: a fast path for shell completion, then the Typer app.

Completion scripts call ``llamafit __complete repos`` while the user presses Tab, so that path
must answer in a few tens of milliseconds: it imports only the Hugging Face cache reader, never
Typer, rich, NVML or the network.
"""

from __future__ import annotations

import sys


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
    from llamafit.cli.app import main as app_main

    app_main()
