"""A running llama-server's HTTP endpoint, however it listens: ``http://HOST:PORT``, ``https://HOST:PORT``
(``--ssl-key-file``/``--ssl-cert-file``), or a unix socket ``unix://PATH`` (``--host PATH.sock``), each route
under its ``--api-prefix`` (server-http.cpp:690-762 registers every route as prefix + path) and with its API
key. What llamafit asks a server it started (readiness, liveness, the router's loads) goes through here.

An https server's certificate is not verified: llamafit talks to the process it started and confirmed listens
there (``llamafit.server.supervisor``), usually with a self-signed certificate; the transport is encrypted as
the server asks, and nothing secret beyond the server's own key is sent. Every request is bounded in time and
reads at most the first MiB of an answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from llamafit.errors import UsageError
from llamafit.numbers import to_int
from llamafit.store import read_bytes

if TYPE_CHECKING:  # http.client and ssl load when a connection is made: a dry run makes none (plan time)
    import http.client

MAX_ANSWER = 1 << 20


@dataclass(frozen=True)
class Endpoint:
    """Where a server answers: the URL of its ``listening on`` line, its API prefix and key."""

    url: str
    prefix: str = ""
    key: str | None = None

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def port(self) -> int | None:
        """The TCP port (None for a unix socket or a URL without one)."""
        try:
            return urlsplit(self.url).port
        except ValueError:
            return None

    @property
    def socket_path(self) -> str | None:
        return self.url[len("unix://") :] if self.scheme == "unix" else None

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        import http.client
        import ssl

        from llamafit.server.unix_http import UnixHTTPConnection

        u = urlsplit(self.url)
        if u.scheme == "unix":
            return UnixHTTPConnection(self.url[len("unix://") :], timeout)
        host = u.hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::"):  # a wildcard listener answers on loopback
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        if u.scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # the process llamafit started, on its own certificate
            return http.client.HTTPSConnection(host, u.port or 443, timeout=timeout, context=context)
        return http.client.HTTPConnection(host, u.port or 80, timeout=timeout)

    def request(self, method: str, path: str, timeout: float, body: str | None = None) -> tuple[int, bytes]:
        """One request to ``path`` under the prefix, bounded by ``timeout``; its status and the first MiB of its
        answer. Raises TimeoutError, OSError or http.client.HTTPException."""
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        conn = self.connection(timeout)
        try:
            conn.request(method, self.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read(MAX_ANSWER)
        finally:
            conn.close()

    def with_url(self, url: str) -> Endpoint:
        return Endpoint(url, self.prefix, self.key)

    def shown(self) -> str:
        """The URL a client uses, the prefix included."""
        return self.url + self.prefix


def api_prefix(argv: Sequence[str]) -> str:
    """The server's ``--api-prefix``, the last one given, exactly as written: llama.cpp registers every route
    as prefix + "/path" (common/arg.cpp:3397-3402, server-http.cpp:690); "" when none."""
    prefix = ""
    for i, a in enumerate(argv[:-1]):
        if a == "--api-prefix":
            prefix = argv[i + 1]
    return prefix


def api_key(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the server asks for (``--api-key`` takes a comma-separated list; ``--api-key-file`` one key a
    line; LLAMA_API_KEY), so that a protected server can be asked; None when it takes none."""
    keys: str | None = env.get("LLAMA_API_KEY")
    for i, a in enumerate(argv[:-1]):
        if a == "--api-key":
            keys = argv[i + 1]
        elif a == "--api-key-file":  # read without blocking (a FIFO is not read) and bounded
            data = read_bytes(Path(argv[i + 1]), 1 << 20)
            if data is None:
                continue
            lines = data.decode("utf-8", errors="replace").splitlines()
            keys = next((ln.strip() for ln in lines if ln.strip()), None)
    first = keys.split(",")[0].strip() if keys else ""
    return first or None


def endpoint_of(url: str, argv: Sequence[str], env: Mapping[str, str]) -> Endpoint:
    """The endpoint of a server started with ``argv`` and ``env`` that said it listens at ``url``."""
    return Endpoint(url, api_prefix(argv), api_key(argv, env))


# -- where llamafit itself listens (run --metrics) ----------------------------------------------------

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """``PORT`` (loopback) or ``HOST:PORT``; a UsageError says what is wrong."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else LOOPBACK
    n = to_int(port) if port.strip() == port else None  # the one bounded parser: no sign, no blanks
    if n is None or port.startswith("-") or not 0 < n < 65536 or (sep and not host):
        raise UsageError(f"--metrics takes PORT or HOST:PORT, not {text!r}", hint="for example --metrics 9464")
    return Address(host, n)
