"""Whether a ready server still serves: a real generation of one token, not ``/health``.

A wedged llama-server can answer ``/health`` (the HTTP thread answers it without the task loop) while every
completion fails or hangs; a stopped or deadlocked one answers nothing. So each probe asks the task loop:
``/slots`` first (answered by that loop between two batches, server-context.cpp:5085-5100): when every slot
is busy the server is working and the probe ends there; otherwise a one-token ``/completion`` that must come
back 200 with a token within the probe's bound. A server that fails ``failures`` probes in a row is wedged.
Every probe is bounded in time; the probing thread stops with the server. Nothing here prints.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from llamafit.store import read_bytes

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


def api_key(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the server asks for (``--api-key`` takes a comma-separated list; ``--api-key-file`` one key a
    line; LLAMA_API_KEY), so that a protected server can be probed; None when it takes none."""
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


def request(
    url: str, method: str, path: str, timeout: float, key: str | None = None, body: str | None = None
) -> tuple[int, bytes]:
    """One HTTP request to the server at ``url``, bounded by ``timeout`` (its answer's first MiB); raises
    TimeoutError, OSError or http.client.HTTPException."""
    u = urlsplit(url)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(1 << 20)
    finally:
        conn.close()


def probe(url: str, timeout: float, key: str | None = None) -> str | None:
    """None when the server at ``url`` serves; else why not, in words."""

    def ask(method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
        return request(url, method, path, timeout, key, body)

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
    row it calls ``on_wedged`` once, with the last reason, and stops probing."""

    def __init__(
        self,
        url: str,
        liveness: Liveness,
        on_wedged: Callable[[str], None],
        key: str | None = None,
        check: Callable[[str, float, str | None], str | None] = probe,
    ) -> None:
        self.url, self.liveness, self.on_wedged, self.key, self._check = url, liveness, on_wedged, key, check
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
        while not self._stop.wait(self.liveness.interval):
            try:
                why = self._check(self.url, self.liveness.interval, self.key)
            except Exception as e:  # a probe's own bug must not end the watch silently
                why = f"the probe failed ({type(e).__name__}: {e})"
            self.probes += 1
            if self._stop.is_set():
                return  # the server is being stopped: a failed probe now says nothing
            failed = failed + 1 if why else 0
            if why and failed >= self.liveness.failures:
                self.on_wedged(f"{why} ({failed} probes in a row)")
                return
