"""The serving life against hostile and faulty cases: secrets kept out of what others read, a metrics port that
cannot stop the server, readiness for every way the server listens, options that are not numbers, signals
during a restart's wait. Stand-in servers for the faults, the real llama-server where its own behaviour is
the point."""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.args import REDACTED, redacted
from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.endpoint import Endpoint
from llamafit.serving.liveness import Liveness, OwnFailure, Watchdog
from tests.realserver import CRASHES_AT_ONCE, READY, health, stand_in, wait_for

LLAMAFIT = [sys.executable, "-m", "llamafit"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return ensure_demo_model(tmp_path / "m")


def run(args: list[str], timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLAMAFIT, "run", *args], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


# -- secrets ----------------------------------------------------------------------------------------------


def test_a_secret_options_value_is_redacted_by_any_alias() -> None:
    argv = ["llama-server", "-m", "m.gguf", "--api-key", "k1", "-hft", "hf_x", "--hf-token", "hf_y", "--alias", "k1"]
    assert redacted(argv) == [*argv[:4], REDACTED, "-hft", REDACTED, "--hf-token", REDACTED, "--alias", "k1"]


def test_the_events_file_and_the_history_hold_no_key(tmp_path: Path, model: Path) -> None:
    events = tmp_path / "events.jsonl"
    srv = stand_in(tmp_path, READY + CRASHES_AT_ONCE)
    r = run([str(model), "--server", srv, "--restart", "no", "--liveness", "0", "--events", str(events), "--",
             "--api-key", "s3cret-key"])  # fmt: skip
    assert r.returncode == 137, r.stderr
    assert "s3cret-key" not in events.read_text() and "s3cret-key" not in r.stderr
    assert any(REDACTED in json.loads(line).get("text", "") for line in events.read_text().splitlines())
    assert events.stat().st_mode & 0o777 == 0o600  # created readable by its owner alone
    data = Path(os.environ["LLAMAFIT_DATA"])
    assert all("s3cret-key" not in p.read_text(errors="replace") for p in data.rglob("*") if p.is_file())


# -- the metrics endpoint -----------------------------------------------------------------------------------


def _limit_files(n: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return preexec


def _scrape(port: int) -> int:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        return c.getresponse().status
    except OSError:
        return 0


def test_slow_metrics_clients_cannot_stop_the_server(tmp_path: Path, model: Path, server_bin: ServerBinary) -> None:
    """More half-sent requests to --metrics than llamafit has file descriptors (a desktop's 1024, here 256): the
    endpoint serves a few at a time and times the rest out; the liveness probe keeps succeeding, nothing is
    restarted, and the endpoint answers again once they are gone."""
    port, metrics = free_port(), free_port()
    argv = [*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--metrics", str(metrics), "--liveness", "1",
            "--", "--port", str(port)]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_limit_files(256))
    clients: list[socket.socket] = []
    try:
        assert wait_for(lambda: health(port) == 200, 60)
        assert _scrape(metrics) == 200
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", metrics), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x")  # half a request, never finished
            clients.append(s)
        time.sleep(6)  # six probes at 1 s: two failed in a row would stop it
        assert p.poll() is None and health(port) == 200
        for s in clients:
            s.close()
        clients.clear()
        assert wait_for(lambda: _scrape(metrics) == 200, 15)
    finally:
        for s in clients:
            s.close()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert "stopped serving" not in err and "starting it again" not in err, err
    assert "Too many open files" not in err and "internal error" not in err, err


def test_a_probe_llamafit_could_not_make_is_not_the_servers_failure() -> None:
    answers: list[str | Exception | None] = [OwnFailure("Too many open files")] * 3 + ["no", OwnFailure("x"), "no"]
    answers += ["no", "no"]
    said: list[str] = []
    own: list[str] = []

    def check(_e: Endpoint, _t: float) -> str | None:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    dog = Watchdog(Endpoint("http://x"), Liveness(0.01, failures=2), said.append, check=check, on_own=own.append)
    dog.start()
    assert wait_for(lambda: bool(said), 5)
    dog.stop()
    # the own failures neither count nor break the run of the server's: "no", own, "no" is two in a row
    assert said == ["no (2 probes in a row)"] and len(own) == 2 and "Too many open files" in own[0]


# -- readiness and liveness, however the server listens --------------------------------------------------


def _wrapper(tmp_path: Path, real: str) -> str:
    """A script that sets the environment and runs llama-server as its child (not exec): the listener is a
    grandchild of llamafit, and the script passes no signal on."""
    exe = tmp_path / "with-env.sh"
    exe.write_text(f'#!/bin/sh\nexport LLAMAFIT_TEST_WRAPPED=1\n"{real}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize("how", ["api-prefix", "https", "unix-socket", "wrapper"])
def test_ready_and_probed_however_the_server_listens(
    tmp_path: Path, model: Path, server_bin: ServerBinary, how: str
) -> None:
    port = free_port()
    server, extra, url = server_bin.path, ["--port", str(port)], f"http://127.0.0.1:{port}"
    if how == "api-prefix":
        extra += ["--api-prefix", "/v9"]
        url += "/v9"
    elif how == "https":
        key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
        made = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                "-days", "1", "-subj", "/CN=localhost"]  # fmt: skip
        subprocess.run(made, check=True, capture_output=True)
        extra += ["--ssl-key-file", str(key), "--ssl-cert-file", str(cert)]
        url = f"https://127.0.0.1:{port}"
    elif how == "unix-socket":
        sock = tmp_path / "llama.sock"
        extra, url = ["--host", str(sock)], f"unix://{sock}"
    else:
        server = _wrapper(tmp_path, server_bin.path)
    argv = [*LLAMAFIT, "run", str(model), "--server", server, "--liveness", "0.5", "--ready-timeout", "60", "--",
            *extra]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server_bin.env())
    try:
        assert p.stdout is not None
        said = p.stdout.readline().strip()  # the URL, once ready (within --ready-timeout, or llamafit exits)
        assert said == url, p.stderr.read() if p.stderr else ""
        time.sleep(3)  # six probes: two failed in a row would stop it
        assert p.poll() is None
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert time.monotonic() - t0 < 15  # the server itself got the interrupt (a wrapper passes none on)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "stopped serving" not in err and "does not answer there" not in err and "starting it again" not in err, err
    if how == "wrapper":
        assert not [q for q in psutil.process_iter(["cmdline"]) if str(model) in " ".join(q.info["cmdline"] or [])]


# -- options that are not numbers, signals during a restart's wait ---------------------------------------


@pytest.mark.parametrize("option", ["--watch", "--liveness", "--ready-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "1e309", "-inf"])
def test_a_duration_that_is_not_a_number_is_a_usage_error(model: Path, option: str, value: str) -> None:
    r = run([str(model), "--dry-run", f"{option}={value}"], timeout=60)
    assert r.returncode == 2 and f"Invalid value for '{option}'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_signal_during_the_backoff_exits_as_the_shell_reports_it(
    tmp_path: Path, model: Path, signum: int, code: int
) -> None:
    srv = stand_in(tmp_path, READY + CRASHES_AT_ONCE)
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", srv, "--liveness", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stderr is not None
    seen = []
    for line in p.stderr:
        seen.append(line)
        if "starting it again in 1 s" in line:
            p.send_signal(signum)
            break
    rest = p.communicate(timeout=30)[1]
    assert p.returncode == code, "".join(seen) + rest
    assert "interrupted before the restart" in rest


def test_the_events_and_the_raw_log_in_one_file_are_refused(tmp_path: Path, model: Path) -> None:
    one = tmp_path / "both.log"
    r = run([str(model), "--events", str(one), "--log-file", str(tmp_path / "." / "both.log")], timeout=60)
    assert r.returncode == 2 and "--events and --log-file name one file" in r.stderr, r.stderr
    assert not one.exists()
