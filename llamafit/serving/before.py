"""Before a launch: what every launch does first, of one model or of a router (and ``tune`` before it measures),
and the argv's last touch (``-lv 4``, so the buffer lines are logged)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from llamafit.errors import ServerNotFoundError
from llamafit.hub.resolve import Hub, RepoState, downloads_line
from llamafit.hub.select import HubFile
from llamafit.paths import not_an_input
from llamafit.planning.discover import launch_env
from llamafit.server.args import ServerArgs
from llamafit.server.binary import GET_SERVER_HINT, ServerBinary
from llamafit.server.capabilities import Capabilities


def before_launch(
    server: ServerBinary | None,
    pending: Sequence[tuple[RepoState, HubFile]],
    hub: Hub | None,
    log_file: Path | None,
    inputs: Sequence[str | Path],
    say: Callable[[str], None],
) -> dict[str, str]:
    """What every launch does first, of one model or of a router, and ``tune`` before it measures: a server
    to run, a log file that is none of the inputs, the Hub files the plan uses downloaded (``say`` hears
    what, before it starts), and the server's environment without the inherited llama.cpp settings that
    would change what was planned."""
    if server is None:
        raise ServerNotFoundError("no llama-server found", hint=GET_SERVER_HINT)
    if log_file is not None:
        not_an_input(log_file, inputs, "the log file")
    if pending:
        assert hub is not None  # Hub files come from a plan's Hub resolver
        say(downloads_line(pending, "downloading"))
        hub.download(pending)
    env = launch_env(server)
    if env.removed:
        say("not passed to the server (they would change what was planned): " + ", ".join(env.removed))
    return env.env


def with_buffer_lines(argv: Sequence[str], user: ServerArgs, caps: Capabilities) -> list[str]:
    """``argv`` with ``-lv 4`` unless the user set a verbosity: the buffer lines are llama INFO messages,
    shown from verbosity 4 (a router passes it on to every instance)."""
    if user.sets_family("verbosity") or not caps.accepts("-lv"):
        return list(argv)
    return [*argv, "-lv", "4"]
