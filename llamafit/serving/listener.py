"""An HTTP listener in llamafit's own process that no client can exhaust (the metrics endpoint, the front of a
set of models kept by memory).

Such a listener shares llamafit's process with the server's supervision: ``socketserver``'s threading server
takes every connection on a thread of its own and waits on a slow client forever, and a thousand half-sent
requests used up llamafit's file descriptors, which failed the liveness probe and stopped a healthy server. Here at
most ``max_clients`` connections are served at once (more are closed as they are accepted), each read and write
waits at most the handler's ``timeout``, and where a ``deadline`` is set the whole exchange is cut off by it (a
client that trickles bytes).
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import threading
from typing import Any


class BoundedListener(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """A threading HTTP server serving at most ``max_clients`` connections at once, each closed by ``deadline``
    seconds when one is given (None: an exchange may last, as a streamed answer does)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # connections the kernel holds until accepted (and closed when over the bound)

    def __init__(
        self,
        listen: tuple[str, int],
        handler: type[http.server.BaseHTTPRequestHandler],
        max_clients: int,
        deadline: float | None = None,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_clients)
        self._deadline = deadline
        self.address_family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        super().__init__(listen, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: closed at once, its descriptor freed
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = None
        if self._deadline is not None:  # the whole exchange is bounded: the socket is shut at the deadline
            timer = threading.Timer(self._deadline, _shut, (request,))
            timer.daemon = True
            timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            if timer is not None:
                timer.cancel()
            self._slots.release()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
