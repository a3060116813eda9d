"""A ready server kept alive: restarted when it dies or stops serving, bounded, never left wedged.

The faults are real processes: a stand-in killed by a signal after ready, one that answers its task loop
but fails every generation, and the real llama-server stopped with SIGSTOP (a hang).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.endpoint import Endpoint, api_key
from llamafit.serving.liveness import Liveness, Watchdog, probe
from llamafit.serving.restarts import RestartPolicy, Restarts
from tests.realserver import CRASHES_AT_ONCE, FAILS_GENERATIONS, READY, stand_in, wait_for

LLAMAFIT = [sys.executable, "-m", "llamafit"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return ensure_demo_model(tmp_path / "m")


# -- the policy -------------------------------------------------------------------------------------------


def test_restarts_back_off_and_stop_within_their_window() -> None:
    now = [0.0]
    r = Restarts(RestartPolicy(max_restarts=3, window=100, backoff_max=3), clock=lambda: now[0])
    delays = []
    for _ in range(3):
        d = r.next_delay()
        assert d is not None
        delays.append(d)
        r.record()
    assert delays == [1, 2, 3]  # doubling, capped
    assert r.next_delay() is None  # the window's restarts are spent
    now[0] = 100.5  # the old ones leave the window
    assert r.next_delay() == 1


def test_what_each_mode_restarts() -> None:
    on_failure, always, never = RestartPolicy(), RestartPolicy("always"), RestartPolicy("no")
    assert on_failure.wants(137, False) and on_failure.wants(0, True) and not on_failure.wants(0, False)
    assert always.wants(0, False)
    assert not never.wants(137, True)


def test_the_probe_uses_the_servers_own_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("\n  k1  \nk2\n")
    assert api_key(["llama-server", "--api-key", "a,b"], {}) == "a"
    assert api_key(["llama-server", "--api-key-file", str(keys)], {}) == "k1"
    assert api_key(["llama-server"], {"LLAMA_API_KEY": "env"}) == "env"
    assert api_key(["llama-server", "--api-key-file", str(tmp_path / "none")], {}) is None


def test_the_watchdog_says_wedged_after_failures_in_a_row() -> None:
    answers = iter(["no", None, "no", "no", "never asked"])
    said: list[str] = []
    dog = Watchdog(
        Endpoint("http://x"), Liveness(0.01, failures=2), said.append, check=lambda *_: next(answers)
    ).start()
    assert wait_for(lambda: bool(said), 5)
    dog.stop()
    assert said == ["no (2 probes in a row)"] and dog.probes == 4  # one success in between resets the count


def test_a_port_with_nothing_behind_it_is_not_alive() -> None:
    why = probe(Endpoint(f"http://127.0.0.1:{free_port()}"), 2)
    assert why is not None and "/slots failed" in why


# -- stand-ins after ready --------------------------------------------------------------------------------


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLAMAFIT, "run", *args], capture_output=True, text=True, timeout=timeout)


def test_a_server_killed_after_ready_is_started_again_then_given_up(tmp_path: Path, model: Path) -> None:
    starts = tmp_path / "starts"
    body = f"open({str(starts)!r}, 'a').write('x')\ntime.sleep(0.3)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    srv = stand_in(tmp_path, READY + body)
    r = run([str(model), "--server", srv, "--max-restarts", "2", "--liveness", "0"])
    assert r.returncode == 137, r.stderr
    assert starts.read_text() == "xxx"  # the first start and two restarts
    assert "stopped after it was ready: killed by SIGKILL (exit 137); starting it again in 1 s" in r.stderr
    assert "starting it again in 2 s" in r.stderr
    assert "not started again: it was restarted 2 times within 600 s" in r.stderr


def test_restart_no_says_the_crash_and_ends(tmp_path: Path, model: Path) -> None:
    srv = stand_in(tmp_path, READY + CRASHES_AT_ONCE)
    r = run([str(model), "--server", srv, "--restart", "no", "--liveness", "0"])
    assert r.returncode == 137
    assert "starting it again" not in r.stderr and "stopped after it was ready: killed by SIGKILL" in r.stderr


def test_always_restarts_a_clean_exit(tmp_path: Path, model: Path) -> None:
    starts = tmp_path / "starts"
    srv = stand_in(tmp_path, READY + f"open({str(starts)!r}, 'a').write('x')\ntime.sleep(0.3)\nsys.exit(0)\n")
    r = run([str(model), "--server", srv, "--restart", "always", "--max-restarts", "1", "--liveness", "0"])
    assert starts.read_text() == "xx" and r.returncode == 0
    assert "stopped after it was ready: exit 0; starting it again in 1 s" in r.stderr, r.stderr


def test_a_server_that_answers_but_fails_generations_is_stopped(tmp_path: Path, model: Path) -> None:
    srv = stand_in(tmp_path, FAILS_GENERATIONS)
    t0 = time.monotonic()
    r = run([str(model), "--server", srv, "--max-restarts", "0", "--liveness", "0.5"])
    assert time.monotonic() - t0 < 60
    assert "stopped serving: a one-token generation answered HTTP 500 (2 probes in a row)" in r.stderr, r.stderr
    assert "not started again" in r.stderr
    assert r.returncode != 0


# -- the real server, hung ----------------------------------------------------------------------------------


def _found(into: list[psutil.Process], p: subprocess.Popen[str], port: int, exclude: set[int]) -> bool:
    """Whether the server on ``port`` (not one of ``exclude``) is found; kept in ``into`` as first seen."""
    if not into and (s := _server_of(p, port, exclude)) is not None:
        into.append(s)
    return bool(into)


def _ready_events(path: Path) -> int:
    """How many times llamafit's event stream has said the server is ready."""
    whole = (path.read_text() if path.exists() else "").split("\n")[:-1]  # a line still being written waits
    return sum(1 for line in whole if line.strip() and json.loads(line).get("event") == "ready")


def _server_of(p: subprocess.Popen[str], port: int, exclude: set[int]) -> psutil.Process | None:
    """The server llamafit launched on ``port`` (not one of its probes of the binary)."""
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
        return next(
            (
                c
                for c in kids
                if c.name() == "llama-server" and f"--port {port}" in " ".join(c.cmdline()) and c.pid not in exclude
            ),
            None,
        )
    except psutil.NoSuchProcess:
        return None


@pytest.mark.server
def test_a_hung_server_is_killed_and_started_again(server_bin: ServerBinary, model: Path, tmp_path: Path) -> None:
    port = free_port()
    events = tmp_path / "events.jsonl"
    argv = [*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--liveness", "2", "--max-restarts", "1"]
    p = subprocess.Popen([*argv, "--events", str(events), "--", "--port", str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        first: list[psutil.Process] = []
        assert wait_for(lambda: _found(first, p, port, set()), 60)
        # hung only once llamafit has seen it ready: a server stopped before that is a load that never ends
        assert wait_for(lambda: _ready_events(events) >= 1, 60), "llamafit never saw the server ready"
        os.kill(first[0].pid, signal.SIGSTOP)
        hung = time.monotonic()
        second: list[psutil.Process] = []
        exclude = {first[0].pid}
        if not wait_for(lambda: _found(second, p, port, exclude), 60):
            p.kill()
            pytest.fail("no second server was started:\n" + p.communicate(timeout=30)[1][-3000:])
        assert not first[0].is_running() or first[0].status() == psutil.STATUS_ZOMBIE, "the hung server was left"
        assert time.monotonic() - hung < 30  # detected (2 probes, 2 s apart, of 2 s), killed (5 s), started again
        assert wait_for(lambda: _ready_events(events) >= 2, 60), "the restarted server was never ready"
        assert _answers(port), "the restarted server does not serve"
        os.kill(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert "stopped serving: it did not generate one token within 2 s (2 probes in a row)" in err or (
            "did not answer /slots within 2 s (2 probes in a row)" in err
        ), err
        assert "starting it again in 1 s" in err
        assert not second[0].is_running() or second[0].status() == psutil.STATUS_ZOMBIE
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.server
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not here")
def test_a_server_out_of_memory_at_run_time_is_said_and_started_again(
    server_bin: ServerBinary, model: Path, tmp_path: Path
) -> None:
    """A run-time out-of-memory, staged: the ready server's address space capped (``prlimit --as``) a little
    above what it holds, then a request. Its allocation fails and it hangs; the liveness probe stops it with
    the allocation's own error as the cause, and it is started again (without the cap)."""
    port, events = free_port(), tmp_path / "events.jsonl"
    argv = [*LLAMAFIT, "run", str(model), "--server", server_bin.path, "--liveness", "1", "--max-restarts", "1",
            "--events", str(events), "--", "--port", str(port)]  # fmt: skip
    with (tmp_path / "stderr").open("w") as err:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True)
    try:
        first: list[psutil.Process] = []
        assert wait_for(lambda: _found(first, p, port, set()), 60)
        assert wait_for(lambda: _ready_events(events) >= 1, 60), "llamafit never saw the server ready"
        cap = first[0].memory_info().vms + (64 << 20)
        subprocess.run(["prlimit", "--pid", str(first[0].pid), f"--as={cap}"], check=True)
        with contextlib.suppress(OSError, http.client.HTTPException):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", "/completion", json.dumps({"prompt": "word " * 400, "n_predict": 4}))
            c.getresponse().read()
        assert wait_for(lambda: _ready_events(events) >= 2, 60), (tmp_path / "stderr").read_text()[-3000:]
        said = (tmp_path / "stderr").read_text()
        assert "std::bad_alloc (it ran out of memory); starting it again in 1 s" in said, said[-3000:]
    finally:
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def _answers(port: int) -> bool:
    return probe(Endpoint(f"http://127.0.0.1:{port}"), 5) is None


def test_an_interrupt_during_the_backoff_ends_the_run(tmp_path: Path, model: Path) -> None:
    srv = stand_in(tmp_path, READY + CRASHES_AT_ONCE)
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", srv, "--liveness", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stderr is not None
    seen = []
    for line in p.stderr:
        seen.append(line)
        if "starting it again in 1 s" in line:
            p.send_signal(signal.SIGINT)
            break
    rest = p.communicate(timeout=30)[1]
    assert p.returncode == 130, "".join(seen) + rest
    assert "interrupted before the restart" in rest


def test_a_stderr_nobody_reads_never_stops_the_server(tmp_path: Path, model: Path) -> None:
    """llamafit's stderr is a pipe nobody reads (a paused pager): the server's log, relayed line by line
    under --verbose, must still be drained, or the server's own log writes block (and with them its task
    loop). The stand-in writes 20 MiB of log after ready, then says so in a file."""
    done = tmp_path / "done"
    body = (
        "line = '0.00.000.001 I srv  update_slots: ' + 'x' * 200 + chr(10)\n"
        "for _ in range(100_000):\n    sys.stderr.write(line)\n"
        f"sys.stderr.flush()\nopen({str(done)!r}, 'w').close()\ntime.sleep(600)\n"
    )
    srv = stand_in(tmp_path, READY + body)
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", srv, "--liveness", "0", "--verbose"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        assert wait_for(done.exists, 60), "the server's log writes were blocked by llamafit's unread stderr"
    finally:
        os.killpg(p.pid, signal.SIGINT)
        assert p.stderr is not None
        said = p.stderr.read().decode(errors="replace")  # read now: everything it could still write
        p.wait(timeout=60)
    assert re.search(r"\d+ of llama-server's lines were not shown: stderr was not read as fast", said)


def test_a_probes_own_request_is_not_a_speed_measurement() -> None:
    from llamafit.serving.serve import probe_sized
    from llamafit.serving.timings import Served

    assert probe_sized(Served(6, 0.5, 1, 0.0))
    assert not probe_sized(Served(6, 0.5, 64, 400.0)) and not probe_sized(Served(300, 90.0, 1, 0.0))


def test_a_wedged_servers_reason_names_its_last_error() -> None:
    from llamafit.serving.serve import LastError

    last = LastError()
    assert last.reason("no answer") == "no answer"
    last.feed("0.08.667.200 I srv  update_slots: all slots are idle")
    last.feed("0.08.667.238 E srv  update_slots: decode() failed: std::bad_alloc")
    last.feed("0.08.667.354 W srv          stop: cancel task, id_task = 1")  # a warning is not an error
    assert last.reason("no answer") == (
        "no answer; its last error: srv  update_slots: decode() failed: std::bad_alloc (it ran out of memory)"
    )
    last.feed("0.09.000.000 E srv  send_error: task id = 2, error: the request exceeds the context")
    assert last.reason("x").endswith("exceeds the context")  # not a memory error: no memory words added


# -- host memory over the server's life ----------------------------------------------------------------------


def test_a_sample_reads_what_proc_says() -> None:
    from llamafit.serving.watch import read_sample

    s = read_sample(os.getpid())
    assert s is not None
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines())
    anon = int(fields["RssAnon"].split()[0]) * 1024
    assert abs(s.anon - s.swap - anon) <= 0.01 * anon + (4 << 20)  # read a moment apart
    assert read_sample(2**22 + 12345) is None  # no such process


def test_the_growth_rate_is_the_least_squares_slope() -> None:
    from llamafit.serving.watch import RATE_MIN_SPAN, Sample, growth_rate

    line = [Sample(t, 1000 + 7 * t, 0, 0) for t in range(0, int(RATE_MIN_SPAN) + 60, 10)]
    rate = growth_rate(line)
    assert rate is not None and abs(rate - 7) < 1e-9
    assert growth_rate(line[:3]) is None  # too short a span to say a rate


def test_the_watch_says_growth_past_and_toward_the_plans_limit() -> None:
    from llamafit.serving.watch import SLACK, Allowance, MemoryWatch, Sample
    from llamafit.units import MiB

    said: list[str] = []
    w = MemoryWatch(0, Allowance(planned=100 * MiB, growth=200 * MiB, room=1 << 40), 0, said.append)
    ready = 500 * MiB
    for t in range(0, 250, 10):  # 1 MiB/s: the limit (ready + 200 MiB + tolerance) is minutes away
        w.take(Sample(float(t), ready + t * MiB, 0, 0))
    assert len(said) == 1 and "grows 60.0 MiB a minute" in said[0] and "passes the" in said[0], said
    w.take(Sample(400.0, ready + 200 * MiB + SLACK + MiB, 0, 0))
    assert len(said) == 2 and "past the" in said[1] and "500 MiB at ready + 200 MiB" in said[1], said
    summary = w.summary()
    assert summary is not None and summary["peak_mib"] > summary["allowed_mib"] and summary["samples"] == 26


GROWS = """
import time
held = []
for _ in range(30):
    held.append(bytearray(10 << 20)); time.sleep(0.05)
time.sleep(1.5)
"""


def test_a_server_that_grows_past_the_plan_is_said_and_recorded(tmp_path: Path, model: Path) -> None:
    from tests.realserver import STAND_IN_FLAGS

    srv = stand_in(tmp_path, READY + GROWS, flags=STAND_IN_FLAGS + " --cache-ram")
    env = dict(os.environ, LLAMAFIT_DATA=str(tmp_path / "data"))
    argv = [*LLAMAFIT, "run", str(model), "--server", srv, "--watch", "0.1", "--liveness", "0", "--restart", "no"]
    r = subprocess.run([*argv, "--", "--cache-ram", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "past the" in r.stderr and "the plan allows it" in r.stderr, r.stderr
    h = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, text=True, env=env, timeout=60)

    (launch,) = json.loads(h.stdout)["launches"]
    mem = launch["host_memory"]
    assert mem["peak_mib"] >= 300 and mem["peak_mib"] > mem["allowed_mib"] > mem["at_ready_mib"]


# -- metrics --------------------------------------------------------------------------------------------------


def test_the_metrics_address() -> None:
    from llamafit.errors import UsageError
    from llamafit.server.endpoint import Address, parse_address

    assert parse_address("9464") == Address("127.0.0.1", 9464)  # loopback unless a host is given
    assert parse_address("0.0.0.0:9000") == Address("0.0.0.0", 9000)
    assert parse_address("[::1]:9000") == Address("::1", 9000)
    for bad in ("abc", "70000", ":9000", "host:", "9" * 5000, "-1", " 80"):  # no int() past its bound
        with pytest.raises(UsageError):
            parse_address(bad)


def _scrape(port: int) -> str | None:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/metrics")
        r = c.getresponse()
        return r.read().decode() if r.status == 200 else None
    except OSError:
        return None


def test_the_metrics_endpoint_shows_the_served_model(tmp_path: Path, model: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    srv = stand_in(tmp_path, READY + "time.sleep(600)\n")
    p = subprocess.Popen([*LLAMAFIT, "run", str(model), "--server", srv, "--metrics", str(port), "--watch", "0.2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        text: list[str] = []
        up = 'llamafit_server_up{model="llamafit demo (random weights)"} 1.0'
        assert wait_for(lambda: bool(text.append(_scrape(port) or "") or up in text[-1]), 60), text[-1:]
        assert wait_for(lambda: bool(text.append(_scrape(port) or "") or "llamafit_host_memory_bytes{" in text[-1]), 30)
        families = {f.name: f for f in text_string_to_metric_families(text[-1])}
        kinds = {s.labels["kind"] for s in families["llamafit_memory_predicted_bytes"].samples}
        assert {"kv", "compute"} <= kinds
        host = families["llamafit_host_memory_bytes"].samples[0].value
        allowed = families["llamafit_host_memory_allowed_bytes"].samples[0].value
        assert 0 < host < allowed
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)


def test_a_metrics_port_in_use_launches_nothing(tmp_path: Path, model: Path) -> None:
    import socket

    starts = tmp_path / "starts"
    srv = stand_in(tmp_path, READY + f"open({str(starts)!r}, 'a').write('x')\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        r = run([str(model), "--server", srv, "--metrics", str(held.getsockname()[1])])
    assert r.returncode == 2 and "the metrics endpoint could not listen on 127.0.0.1:" in r.stderr, r.stderr
    assert not starts.exists()


def test_a_server_that_slows_over_its_life_is_said_once() -> None:
    from llamafit.serving.decay import BASELINE, RECENT, Decay

    d = Decay()
    said = [d.feed(20.0, 25.0, 1000) for _ in range(BASELINE)]  # its own baseline: 80 % of the plan
    said += [d.feed(12.0, 15.0, 30000) for _ in range(RECENT)]  # slower at depth as the plan says: no decay
    assert not any(said)
    said = [d.feed(5.0, 25.0, 1000) for _ in range(RECENT)]  # 20 % of the plan where it did 80 %
    (warning,) = [s for s in said if s]  # once the recent median is the slow one
    assert "slowed to 25%" in warning
    assert d.feed(1.0, 25.0, 1000) is None  # said once


def test_a_cards_memory_is_held_to_what_the_plan_put_there() -> None:
    from llamafit.serving.watch import Allowance, MemoryWatch, Sample, nvml_process_memory
    from llamafit.units import GiB

    assert nvml_process_memory(os.getpid()) == {}  # no NVIDIA card here: nothing read, nothing raised
    said: list[str] = []
    w = MemoryWatch(0, Allowance(0, 0, 0), 0, said.append, cards={0: ("CUDA0", GiB)})
    w.take(Sample(0.0, GiB, 0, 0))
    w.take_cards({0: GiB, 1: 5 * GiB})  # card 1 is not the plan's: not this server's concern
    assert not said
    w.take_cards({0: 2 * GiB})
    assert len(said) == 1 and "2048 MiB on CUDA0, past the 1024 MiB the plan put there" in said[0]
    summary = w.summary()
    assert summary is not None and summary["card_peak_mib"] == {"CUDA0": 2048.0}


RUNS_OUT = (
    'print("ggml_aligned_malloc: insufficient memory (attempted to allocate 20.00 MB)", file=sys.stderr, flush=True)\n'
    "os.abort()\n"
)


def test_a_server_that_runs_out_of_memory_at_run_time_is_planned_again(tmp_path: Path, model: Path) -> None:
    srv = stand_in(tmp_path, READY + "time.sleep(0.3)\n" + RUNS_OUT)
    env = dict(os.environ, LLAMAFIT_DATA=str(tmp_path / "data"), LLAMAFIT_CACHE=str(tmp_path / "cache"))
    argv = [*LLAMAFIT, "run", str(model), "--server", srv, "--liveness", "0", "--max-restarts", "1"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    said = re.search(
        r"host RAM could not take 20 MiB more after 0 MiB: planning for at most (\d+) MiB there; planning", r.stderr
    )
    assert said is not None and 0 < int(said[1]) <= 10, r.stderr  # half the allocation below the plan's
    assert r.returncode == 134 and r.stderr.count("ready at") == 2  # planned within it, started, died again
    h = subprocess.run([*LLAMAFIT, "history", "--json"], capture_output=True, text=True, env=env).stdout
    assert '"failed_load"' in h  # the failure is in the history for the next plans


def test_the_events_file_follows_the_servers_life(tmp_path: Path, model: Path) -> None:
    events = tmp_path / "events.jsonl"
    srv = stand_in(tmp_path, READY + CRASHES_AT_ONCE)
    r = run([str(model), "--server", srv, "--max-restarts", "1", "--liveness", "0", "--events", str(events)])
    assert r.returncode == 137
    docs = [json.loads(line) for line in events.read_text().splitlines()]
    assert all(d["schema"] == "llamafit.event/1" for d in docs)
    kinds = [d["event"] for d in docs]
    assert kinds.count("ready") == 2 and kinds[-1] == "error"
    assert any(d["event"] == "notice" and "starting it again in 1 s" in d["text"] for d in docs)
    ready = next(d for d in docs if d["event"] == "ready")
    assert {row["kind"] for row in ready["memory"]} >= {"kv", "compute"}


def test_files_a_run_reads_or_writes_beside_the_server_are_never_waited_on(tmp_path: Path, model: Path) -> None:
    """A FIFO given as --events, or as the server's --api-key-file, blocks nothing: refused, or not read."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert api_key(["llama-server", "--api-key-file", str(fifo)], {}) is None
    srv = stand_in(tmp_path, READY)
    r = run([str(model), "--server", srv, "--events", str(fifo), "--liveness", "0"], timeout=60)
    assert r.returncode == 2 and "the events file" in r.stderr and "not a regular file" in r.stderr, r.stderr
