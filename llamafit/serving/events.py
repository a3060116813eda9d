"""What serving says while it happens (notes, the server's lines, ready with the compared buffers as rows,
errors) and how it ended (``Served``): the values ``llamafit.cli`` renders and ``--events`` writes; nothing here
prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamafit.serving.compare import Row


@dataclass(frozen=True)
class Note:
    """Something llamafit says while it serves: ``info`` (progress), ``notice`` (worth a look: a correction
    recorded, a retry), ``warning`` (the supervisor's warnings)."""

    text: str
    level: str = "info"


@dataclass(frozen=True)
class ServerLine:
    text: str
    key: bool  # one of the lines shown without --verbose (loading, buffers, ready, errors)
    error: bool  # an error line: shown even under --quiet


@dataclass(frozen=True)
class Problem:
    """An error to say (the exit code and any ``--json`` document come with ``Served``)."""

    message: str
    hint: str | None = None


@dataclass(frozen=True)
class Ready:
    """The server is ready at ``url``; ``rows``: each buffer it logged against the plan."""

    url: str
    rows: tuple[Row, ...]
    drift: tuple[str, ...]  # free memory that moved between the plan and the load
    fit: tuple[str, ...]  # llama.cpp's own --fit lines
    device_free_mib: dict[str, float]
    plan_doc: dict[str, Any]  # the plan that was launched (llamafit.plan/1)


@dataclass(frozen=True)
class InstanceReady:
    """One of the router's models is ready on its own port; ``rows`` as in ``Ready``."""

    name: str
    port: int
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class AllReady:
    url: str
    names: tuple[str, ...]  # the resident models, all loaded


Event = Note | ServerLine | Problem | Ready | InstanceReady | AllReady
OnEvent = Callable[[Event], None]


@dataclass(frozen=True)
class Served:
    """How serving ended: the exit code, and under ``--json`` the failure document's message, hint and the
    plan it carries (None when it ended well or the document was already complete)."""

    code: int
    failure: tuple[str, str | None, dict[str, Any] | None] | None = None
