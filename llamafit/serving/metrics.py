"""A Prometheus endpoint for a served model (``run --metrics [HOST:]PORT``): what the plan predicted and what
the server holds, per device and buffer kind; its speed against the prediction; requests, restarts and
whether it serves. Written by ``prometheus_client`` (the ecosystem's library, its text format) from a
registry of its own, loopback unless a host is given. Nothing here prints.

The endpoint shares llamafit's process with the server's supervision, so no client may exhaust it
(``llamafit.serving.listener``): at most ``MAX_CLIENTS`` connections are served at once, each given
``CLIENT_TIMEOUT`` seconds a read and ``CLIENT_DEADLINE`` for its whole exchange.
"""

from __future__ import annotations

import copy
import http.server
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llamafit.errors import UsageError
from llamafit.server.endpoint import Address
from llamafit.serving.listener import BoundedListener

MAX_CLIENTS = 16  # connections served at once; a scraper needs one
CLIENT_TIMEOUT = 5.0  # seconds a read from a client may wait
CLIENT_DEADLINE = 10.0  # seconds one exchange may take in all (a client that trickles bytes is cut off)


class Metrics:
    """The gauges and counters of one ``run``; ``serve()`` starts the endpoint (the port is taken then, or
    a UsageError says why not)."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, m = self.registry, ("model",)
        self.model = model
        self.predicted = Gauge(
            "llamafit_memory_predicted_bytes",
            "What the plan predicted, per device and buffer kind",
            [*m, "device", "kind"],
            registry=r,
        )
        self.actual = Gauge(
            "llamafit_memory_actual_bytes",
            "What llama-server logged at load, per device and buffer kind",
            [*m, "device", "kind"],
            registry=r,
        )
        self.host = Gauge("llamafit_host_memory_bytes", "The server's host memory: RssAnon + VmSwap", m, registry=r)
        self.host_peak = Gauge("llamafit_host_memory_peak_bytes", "Its high-water mark", m, registry=r)
        self.host_allowed = Gauge(
            "llamafit_host_memory_allowed_bytes", "What the plan allows it after the load", m, registry=r
        )
        self.tg = Gauge("llamafit_generation_tokens_per_second", "Measured, the last request", m, registry=r)
        self.tg_predicted = Gauge(
            "llamafit_generation_tokens_per_second_predicted", "Predicted at the last request's depth", m, registry=r
        )
        self.pp = Gauge("llamafit_prompt_tokens_per_second", "Measured, the last request", m, registry=r)
        self.requests = Counter("llamafit_requests", "Requests the server timed", m, registry=r)
        self.restarts = Counter("llamafit_restarts", "Times the server was started again", m, registry=r)
        self.up = Gauge("llamafit_server_up", "1 while the server is ready and serving", m, registry=r)
        # several models kept by memory (llamafit.several.front): loads, unloads by reason, waits for room
        self.loads = Counter(
            "llamafit_model_loads", "Times llamafit loaded the model through the router", m, registry=r
        )
        self.unloads = Counter(
            "llamafit_model_unloads",
            "Times the model was unloaded, by reason: evicted (for another's room), crashed, requested, idle",
            [*m, "reason"],
            registry=r,
        )
        self.wait = Histogram(
            "llamafit_request_wait_seconds",
            "Time a request for the model waited for room and its load",
            m,
            registry=r,
            buckets=(0.005, 0.05, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )

    def of(self, model: str) -> Metrics:
        """The same endpoint's series for another model (each of the router's instances)."""
        view = copy.copy(self)
        view.model = model
        return view

    def serve(self, at: Address) -> None:
        try:
            server = _Endpoint(at, self.registry)
        except OSError as e:
            raise UsageError(
                f"the metrics endpoint could not listen on {at}: {e.strerror or e}",
                hint="give another --metrics port (or HOST:PORT), or stop what holds it",
            ) from None
        threading.Thread(target=server.serve_forever, name="metrics endpoint", daemon=True).start()

    def memory(self, predicted: Iterable[tuple[str, str, int]], actual: Iterable[tuple[str, str, int]]) -> None:
        """(device, kind, bytes) rows: the plan's and the server's."""
        for gauge, rows in ((self.predicted, predicted), (self.actual, actual)):
            sums: dict[tuple[str, str], int] = {}
            for dev, kind, n in rows:
                sums[(dev, kind)] = sums.get((dev, kind), 0) + n
            for (dev, kind), n in sums.items():
                gauge.labels(self.model, dev, kind).set(n)

    def served(self, tg: float | None, tg_predicted: float | None, pp: float | None) -> None:
        self.requests.labels(self.model).inc()
        for gauge, v in ((self.tg, tg), (self.tg_predicted, tg_predicted), (self.pp, pp)):
            if v is not None:
                gauge.labels(self.model).set(v)

    def host_memory(self, now: int, peak: int, allowed: int) -> None:
        self.host.labels(self.model).set(now)
        self.host_peak.labels(self.model).set(peak)
        self.host_allowed.labels(self.model).set(allowed)

    def serving(self, up: bool) -> None:
        self.up.labels(self.model).set(1 if up else 0)

    def restarted(self) -> None:
        self.restarts.labels(self.model).inc()

    def load_done(self) -> None:
        self.loads.labels(self.model).inc()

    def unloaded(self, reason: str) -> None:
        self.unloads.labels(self.model, reason).inc()

    def waited(self, seconds: float) -> None:
        self.wait.labels(self.model).observe(seconds)


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /metrics (or /): the registry in Prometheus' text format; nothing else."""

    server: _Endpoint
    timeout = CLIENT_TIMEOUT  # applied to the connection by StreamRequestHandler.setup

    def do_GET(self) -> None:
        if urlsplit(self.path).path not in ("/", "/metrics"):
            self.send_error(404)
            return
        body = generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # nothing here prints


class _Endpoint(BoundedListener):
    """The metrics' HTTP server: at most ``MAX_CLIENTS`` connections at once, each closed by its deadline."""

    def __init__(self, at: Address, registry: CollectorRegistry) -> None:
        self.registry = registry
        super().__init__((at.host, at.port), _Handler, MAX_CLIENTS, CLIENT_DEADLINE)
