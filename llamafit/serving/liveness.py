"""Whether a ready server still serves: a real generation of one token, not ``/health``.

A wedged llama-server can answer ``/health`` (the HTTP thread answers it without the task loop) while every
completion fails or hangs; a stopped or deadlocked one answers nothing. So each probe asks the task loop:
``/slots`` first (answered by that loop between two batches, server-context.cpp:5085-5100): when every slot
is busy the server is working and the probe ends there; otherwise a one-token ``/completion`` that must come
back 200 with a token within the probe's bound. A server that fails ``failures`` probes in a row is wedged.
Every probe is bounded in time; the probing thread stops with the server. Nothing here prints.
"""

from __future__ import annotations

import errno
import http.client
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from llamafit.server.endpoint import Endpoint

PROBE_PROMPT = "ok"  # a token or two: the probe costs one tiny prefill and one decoded token


@dataclass(frozen=True)
class Liveness:
    """How a ready server is probed: every ``interval`` seconds (0: never), each probe bounded by the same
    time, ``failures`` failed probes in a row make it wedged (detected within about 2 x failures x interval)."""

    interval: float = 10.0
    failures: int = 2

    @property
    def on(self) -> bool:
        return self.interval > 0


class OwnFailure(Exception):
    """A probe that could not be made for a reason of llamafit's own (no file descriptor, no memory for a
    socket): it says nothing about the server."""


# what a failed connect or send says about llamafit itself, never about the server it asks
OWN_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def probe(endpoint: Endpoint, timeout: float) -> str | None:
    """None when the server at ``endpoint`` serves; else why not, in words. OwnFailure when llamafit itself
    could not ask (out of file descriptors: a flood of clients elsewhere in the process)."""

    def ask(method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
        try:
            return endpoint.request(method, path, timeout, body)
        except OSError as e:
            if e.errno in OWN_ERRNOS:
                raise OwnFailure(e.strerror or str(e)) from None
            raise

    try:
        status, data = ask("GET", "/slots")
    except TimeoutError:
        return f"its task loop did not answer /slots within {timeout:.0f} s"
    except (OSError, http.client.HTTPException) as e:
        return f"/slots failed ({getattr(e, 'strerror', None) or e or type(e).__name__})"
    if status == 200 and _all_busy(data):
        return None  # every slot is generating: it serves, and a probe would only wait behind them
    body = json.dumps({"prompt": PROBE_PROMPT, "n_predict": 1, "cache_prompt": False, "temperature": 0})
    try:
        status, data = ask("POST", "/completion", body)
    except TimeoutError:
        return f"it did not generate one token within {timeout:.0f} s"
    except (OSError, http.client.HTTPException) as e:
        return f"a one-token generation failed ({getattr(e, 'strerror', None) or e or type(e).__name__})"
    if status in (401, 403):
        return None  # a key it did not take: nothing more can be learned, and it did answer
    if status != 200:
        return f"a one-token generation answered HTTP {status}"
    return None


def _all_busy(data: bytes) -> bool:
    try:
        slots = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(slots, list)
        and bool(slots)
        and all(isinstance(s, dict) and s.get("is_processing") is True for s in slots)
    )


class Watchdog:
    """Probes a ready server on a thread of its own until ``stop()``; after ``failures`` failed probes in a
    row it calls ``on_wedged`` once, with the last reason, and stops probing. A probe llamafit could not make
    (``OwnFailure``) is not counted against the server: ``on_own`` hears it, once until a probe is made again."""

    def __init__(
        self,
        endpoint: Endpoint,
        liveness: Liveness,
        on_wedged: Callable[[str], None],
        check: Callable[[Endpoint, float], str | None] = probe,
        on_own: Callable[[str], None] | None = None,
    ) -> None:
        self.endpoint, self.liveness, self.on_wedged, self._check = endpoint, liveness, on_wedged, check
        self.on_own = on_own
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llama-server liveness", daemon=True)
        self.probes = 0

    def start(self) -> Watchdog:
        if self.liveness.on:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.liveness.interval + 5)

    def _loop(self) -> None:
        failed = 0
        own_said = False
        while not self._stop.wait(self.liveness.interval):
            try:
                why = self._check(self.endpoint, self.liveness.interval)
            except OwnFailure as e:  # llamafit's own trouble: the server is not judged by it
                if not own_said and self.on_own is not None:
                    self.on_own(f"a liveness probe could not be made ({e}); it is not counted against the server")
                own_said = True
                continue
            except Exception as e:  # a probe's own bug must not end the watch silently
                why = f"the probe failed ({type(e).__name__}: {e})"
            own_said = False
            self.probes += 1
            if self._stop.is_set():
                return  # the server is being stopped: a failed probe now says nothing
            failed = failed + 1 if why else 0
            if why and failed >= self.liveness.failures:
                self.on_wedged(f"{why} ({failed} probes in a row)")
                return
