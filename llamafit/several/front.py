"""The front door of a set of models kept by memory (``llamafit.several.budget``): it answers on the user's address
and passes every request to the router behind it, the answer passed back as it comes (a stream chunk by chunk).

A request that names a model (``"model"`` in a POST's JSON body, ``?model=`` in a GET, as the router routes them,
server-models.cpp:2020-2080) that is not loaded first gets room: with the router's autoload off it would be refused
("model is not loaded"), so llamafit unloads what the budget says (``/models/unload``), loads the model
(``/models/load``) and waits until the router says it is loaded, then passes the request on. One room is made at a
time (two cold models asked at once are loaded one after the other, and stay together where they fit); a request
for a loaded model never waits for that; a load asked by name (``/models/load``) makes its room the same way. A load
that fails answers the waiting request with an error that says why; a client that goes away while it waits does not
stop the load. Nothing here prints: ``on_event`` hears every load and unload.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from llamafit.errors import UsageError
from llamafit.numbers import to_int
from llamafit.server.endpoint import Endpoint
from llamafit.serving.events import Note, OnEvent
from llamafit.serving.listener import BoundedListener
from llamafit.serving.metrics import Metrics
from llamafit.several.budget import Budget

API_WAIT = 10.0  # seconds the router's /models, /models/load and /models/unload have to answer
UNLOAD_WAIT = 60.0  # seconds an unloaded instance has to be gone
ANSWER_WAIT = 3600.0  # seconds the router may take between two pieces of an answer (a long prompt's prefill)
MAX_BODY = 256 << 20  # bytes of a request body passed on (a prompt with images)
# no client may exhaust llamafit's descriptors (``llamafit.serving.listener``): a connection to the front holds one
# to the router as well, so 256 keep both well under a desktop's limit of 1024; far more than the router's HTTP
# threads serve at once
MAX_CLIENTS = 256
CLIENT_WAIT = 3600.0  # seconds a client read or write may wait: llama-server's own (common/common.h:628-629)
POLL = 0.1
HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"})
RUNNING = ("loaded", "loading", "sleeping")


@dataclass
class Room:
    """What one wait for room did: whom it unloaded, whether it loaded the model, how long it waited."""

    unloaded: tuple[str, ...] = ()
    loaded: bool = False
    waited: float = 0.0
    error: str | None = None


class Front:
    """Answers on ``listen`` for the router at ``router``; ``budget`` says which models fit together."""

    def __init__(
        self,
        listen: tuple[str, int],
        router: Endpoint,
        budget: Budget,
        on_event: OnEvent,
        *,
        metrics: Callable[[str], Metrics | None] = lambda _name: None,
        load_wait: float = 1800.0,
        why_failed: Callable[[str], str | None] = lambda _name: None,
        on_unload: Callable[[str], None] = lambda _name: None,
    ) -> None:
        """``why_failed``: what a model's last failed load said; ``on_unload``: told before a model is unloaded."""
        self.router, self.budget, self.on_event = router, budget, on_event
        self.metrics, self.load_wait, self.why_failed, self.on_unload = metrics, load_wait, why_failed, on_unload
        self._room = threading.Lock()  # one room made at a time
        self._state = threading.Lock()
        self._used: dict[str, float] = {}  # loaded models (as far as llamafit made them so), by their last use
        self._aliases: dict[str, str] = {}
        self._asked: set[str] = set()  # loads asked by name whose room is being made in the background
        self._server = _Server(listen, self)
        self._thread = threading.Thread(target=self._server.serve_forever, name="llamafit front", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> Front:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never began on a router that failed
            self._server.shutdown()
        self._server.server_close()

    # -- what is loaded ------------------------------------------------------------------------------------

    def loaded(self, name: str) -> None:
        """``name`` is loaded (the router loaded it at start, or llamafit did): it uses its budget."""
        with self._state:
            self._used[name] = time.monotonic()

    def gone(self, name: str, reason: str) -> None:
        """``name`` is no longer loaded (it exited or was unloaded); ``reason``: evicted, crashed, requested."""
        with self._state:
            was = self._used.pop(name, None)
        if was is not None and (m := self.metrics(name)) is not None:
            m.unloaded(reason)

    def _statuses(self) -> dict[str, str]:
        """Every model's status as the router says it (loaded, loading, unloaded, ...); aliases learnt on the way."""
        status, data = self.router.request("GET", "/models", API_WAIT)
        if status != 200:
            raise OSError(f"the router's /models answered HTTP {status}")
        doc = json.loads(data)
        out: dict[str, str] = {}
        for m in doc.get("data", []) if isinstance(doc, dict) else []:
            if not isinstance(m, dict) or not isinstance(m.get("id"), str):
                continue
            st = m.get("status")
            failed = isinstance(st, dict) and st.get("failed") is True
            out[m["id"]] = "failed" if failed else str(st.get("value", "")) if isinstance(st, dict) else ""
            for a in m.get("aliases") or []:
                if isinstance(a, str):
                    self._aliases[a] = m["id"]
        return out

    def name_of(self, asked: str) -> str | None:
        """The router's name for ``asked`` (a name or an alias), None when no model is called so."""
        if asked in self.budget.uses:
            return asked
        if asked not in self._aliases:
            with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
                self._statuses()
        return self._aliases.get(asked)

    # -- making room ---------------------------------------------------------------------------------------

    def ensure(self, name: str) -> Room:
        """``name`` loaded, room made for it by the budget first; what it took."""
        with self._state:
            if name in self._used:
                self._used[name] = time.monotonic()
                return Room()
        t0 = time.monotonic()
        with self._room:
            try:
                room = self._make_room(name)
            except (OSError, ValueError, http.client.HTTPException) as e:
                room = Room(error=f"the router did not answer as it should ({type(e).__name__}: {e})")
        room.waited = time.monotonic() - t0
        if (m := self.metrics(name)) is not None:
            m.waited(room.waited)
        return room

    def _make_room(self, name: str) -> Room:
        statuses = self._statuses()
        with self._state:
            if name in self._used:  # another request loaded it while this one waited for the room
                self._used[name] = time.monotonic()
                return Room()
            order = sorted(self._used, key=self._used.__getitem__)
        if statuses.get(name) not in ("loaded", "sleeping"):
            running = [n for n in order if statuses.get(n) in RUNNING]
            running += [n for n, st in statuses.items() if st in RUNNING and n not in running and n != name]
            unload = self.budget.room_for(name, running)
            if unload is None:
                return Room(error=f"{name} does not fit the memory budget even alone")
            for other in unload:
                self._unload(other)
            if statuses.get(name) != "loading":
                self._post("/models/load", name)
            why = self._wait_loaded(name)
            if why is not None:
                return Room(tuple(unload), error=why)
            self.on_event(Note(f"{name} loaded" + (f" (unloaded {', '.join(unload)} for it)" if unload else "")))
            if (m := self.metrics(name)) is not None:
                m.load_done()
            self.loaded(name)
            return Room(tuple(unload), True)
        self.loaded(name)
        return Room()

    def _unload(self, name: str) -> None:
        self.on_unload(name)
        self._post("/models/unload", name)
        deadline = time.monotonic() + UNLOAD_WAIT
        while time.monotonic() < deadline and self._statuses().get(name) in RUNNING:
            time.sleep(POLL)
        self.on_event(Note(f"{name} unloaded to make room (llamafit's memory budget)", "notice"))
        self.gone(name, "evicted")

    def _wait_loaded(self, name: str) -> str | None:
        deadline = time.monotonic() + self.load_wait
        seen_loading = False
        while time.monotonic() < deadline:
            st = self._statuses().get(name)
            if st in ("loaded", "sleeping"):
                return None
            if st == "failed" or (st == "unloaded" and seen_loading):
                said = self.why_failed(name)
                return f"{name} failed to load" + (f": {said}" if said else "")
            seen_loading = seen_loading or st == "loading"
            time.sleep(POLL)
        return f"{name} was not loaded within {self.load_wait:.0f} s"

    def _post(self, path: str, name: str) -> None:
        status, data = self.router.request("POST", path, API_WAIT, json.dumps({"model": name}))
        if status != 200 and b"already running" not in data and b"not running" not in data:
            raise OSError(f"{path} for {name} answered HTTP {status}: {data[:200].decode(errors='replace')}")

    # -- passing requests on -------------------------------------------------------------------------------

    def model_of(self, method: str, path: str, body: bytes) -> str | None:
        """The model a request names, as the router reads it."""
        if method == "GET":
            values = parse_qs(urlsplit(path).query).get("model")
            return values[0] if values else None
        if not body or method != "POST":
            return None
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        model = doc.get("model") if isinstance(doc, dict) else None
        return model if isinstance(model, str) and model else None

    def serve(self, h: _Handler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            h.send_error(413)
            return
        body = h.rfile.read(length) if length > 0 else b""
        asked = self.model_of(h.command, h.path, body)
        name = self.name_of(asked) if asked is not None else None
        if name is not None and path_of(h.path).endswith("/models/unload"):
            self.on_unload(name)
        elif name is not None and path_of(h.path).endswith("/models/load"):
            if self._load_asked(name):
                _answer(h, 200, {"success": True})
                return
        elif name is not None:
            room = self.ensure(name)
            if room.error is not None:
                _answer(h, 503, {"error": {"code": 503, "type": "unavailable_error", "message": room.error}})
                return
        self._forward(h, body)
        if name is not None and path_of(h.path).endswith("/models/unload"):
            self.gone(name, "requested")

    def _load_asked(self, name: str) -> bool:
        """A load asked of the router's API by name: room is made by the budget as for a request, in the background,
        answered at once as the router answers it (server-models.cpp:2073-2078); False where the router should
        answer itself (the model is running already: its own "already running" error)."""
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            if self._statuses().get(name) in RUNNING:
                return False
        with self._state:
            if name in self._asked:  # one background load a model: asking again while it is made adds none
                return True
            self._asked.add(name)
        loader = threading.Thread(target=self._load_in_background, args=(name,), name=f"load {name}", daemon=True)
        loader.start()
        return True

    def _load_in_background(self, name: str) -> None:
        try:
            room = self.ensure(name)
        finally:
            with self._state:
                self._asked.discard(name)
        if room.error is not None:
            self.on_event(Note(f"the load of {name} asked through the API failed: {room.error}", "warning"))

    def _forward(self, h: _Handler, body: bytes) -> None:
        headers = {k: v for k, v in h.headers.items() if k.lower() not in HOP and k.lower() != "host"}
        conn = self.router.connection(ANSWER_WAIT)
        try:
            conn.request(h.command, h.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            h.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP and k.lower() != "content-length":
                    h.send_header(k, v)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            while chunk := resp.read1(1 << 16):  # as it comes: a stream's tokens are not held back
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException) as e:
            with contextlib.suppress(OSError):
                _answer(h, 502, {"error": {"code": 502, "type": "server_error", "message": f"the router: {e}"}})
        finally:
            conn.close()


def path_of(path: str) -> str:
    return urlsplit(path).path


def _answer(h: _Handler, status: int, doc: Mapping[str, Any]) -> None:
    data = json.dumps(doc).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked answers: a stream passes as it comes
    server: _Server
    timeout = CLIENT_WAIT  # applied to the connection by StreamRequestHandler.setup

    def _any(self) -> None:
        try:
            self.server.front.serve(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away; a load it started goes on

    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_PATCH = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass  # nothing here prints


class _Server(BoundedListener):
    """At most ``MAX_CLIENTS`` connections at once (each holds one to the router too), no deadline: an answer
    streams as long as the generation lasts."""

    def __init__(self, listen: tuple[str, int], front: Front) -> None:
        self.front = front
        super().__init__(listen, _Handler, MAX_CLIENTS)


DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080  # llama-server's (common/common.h)


def behind_front(argv: list[str], port: int) -> tuple[tuple[str, int], list[str]]:
    """The address the user asked the router to answer on (the front takes it), and the router's argv moved to
    loopback ``port`` behind it."""
    from llamafit.server.args import parse_server_args

    args = parse_server_args(argv[1:])
    host = (h.value if (h := args.last("--host")) is not None else None) or DEFAULT_HOST
    asked = (p.value if (p := args.last("--port")) is not None else None) or str(DEFAULT_PORT)
    if (number := to_int(asked)) is None or not 0 <= number < 65536:
        raise UsageError(f"--port {asked!r} is not a port", hint="e.g. --port 8080")
    rest = args.without(frozenset({"--host", "--port"})).tokens()
    return (host, number), [argv[0], *rest, "--host", "127.0.0.1", "--port", str(port)]
