"""Reading llama-server's router log: which instance said what.

The router forwards each instance's log lines prefixed with the instance's port, ``[%5d] <line>``
(tools/server/server-models.cpp:194), and names the port when it spawns the instance: ``spawning server
instance with name=NAME on port PORT`` (server-models.cpp:1189); an instance that stops is ``instance
name=NAME exited with status N``, by name only: it is the oldest instance of that name still running, as
the router runs one instance of a model at a time and may spawn its next one (the model unloaded,
server-models.cpp:247-249) before it logs the last one's exit. An instance is ready at its own ``listening
on`` line. Silent: the caller decides what to show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llamafit.numbers import INT, SIGNED
from llamafit.server.logparse import LoadLog, parse
from llamafit.server.supervisor import listening_url, url_port

_CHILD = re.compile(r"^\[\s*(?P<port>\d{1,5})\] ?(?P<line>.*)$")
_SPAWN = re.compile(rf"spawning server instance with name=(?P<name>.+?) on port (?P<port>{INT})\s*$")
_EXIT = re.compile(rf"instance name=(?P<name>.+?) exited with status (?P<code>{SIGNED})")
MAX_INSTANCE_LINES = 20000  # lines kept per instance: its load (the memory lines) and a tail after ready


@dataclass
class Instance:
    name: str
    port: int
    lines: list[str] = field(default_factory=list)
    ready: bool = False
    exit_code: int | None = None  # set when the router says it exited

    def log(self) -> LoadLog:
        return parse(self.lines)


@dataclass
class RouterLog:
    """Feed it every line of the router's output; it keeps each instance's lines apart."""

    instances: dict[str, Instance] = field(default_factory=dict)  # by model name
    _by_port: dict[int, Instance] = field(default_factory=dict)
    _running: dict[str, list[Instance]] = field(default_factory=dict)  # by name, oldest first, not yet exited

    def feed(self, line: str) -> tuple[Instance | None, str, str]:
        """The instance a line belongs to (None for the router's own), the line without its prefix, and
        what happened: "" | "spawned" | "ready" | "exited"."""
        if m := _CHILD.match(line):
            inst = self._by_port.get(int(m.group("port")))
            if inst is not None:
                text = m.group("line")
                if len(inst.lines) < MAX_INSTANCE_LINES:
                    inst.lines.append(text)
                url = listening_url(text) if not inst.ready else None
                if url is not None and url_port(url) == inst.port:  # its own line, on its own port
                    inst.ready = True
                    return inst, text, "ready"
                return inst, text, ""
        if m := _SPAWN.search(line):
            name, port = m.group("name"), int(m.group("port"))
            inst = Instance(name, port)  # a reload starts the instance afresh
            self.instances[name] = inst
            self._by_port[port] = inst
            self._running.setdefault(name, []).append(inst)
            return inst, line, "spawned"
        if (m := _EXIT.search(line)) and (running := self._running.get(m.group("name"))):
            inst = running.pop(0)
            inst.exit_code = int(m.group("code"))
            return inst, line, "exited"
        return None, line, ""
