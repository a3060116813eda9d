"""The parts added with the speed model, end to end with the real binaries (issue #37): the log reader and
readiness of ``run`` under a model whose metadata mimics the server's lines, the probe and ``tune`` with a real
llama-bench that hangs (SIGSTOP) or fails, llamafit's own files as FIFOs or hostile entries, and every
process llamafit starts dying with it (real signals)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from llamafit import store
from llamafit.errors import ExitCode
from llamafit.gguf.demo_model import demo_metadata, demo_tensors, ensure_demo_model
from llamafit.gguf.writer import write_gguf
from llamafit.options import Options
from llamafit.planning.planner import Planner
from llamafit.planning.tuned import tune_file, tune_key
from llamafit.server.binary import ServerBinary, free_port
from llamafit.server.supervisor import Hooks, Supervisor
from llamafit.speed import probe_cache as pc
from tests import factory
from tests.realserver import READY, launch_run, read_json_doc, stand_in, stop_run, wait_for

LLAMAFIT = [sys.executable, "-m", "llamafit"]
pytestmark = pytest.mark.server


def benches(pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(pid).children(recursive=True) if "llama-bench" in " ".join(c.cmdline())]
    except psutil.NoSuchProcess:
        return []


def gone(procs: list[psutil.Process]) -> bool:
    def dead(p: psutil.Process) -> bool:
        try:
            return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return all(dead(p) for p in procs)


def toolbox(tmp_path: Path, server: ServerBinary, bench: str | None = None) -> str:
    """The real llama-server in a folder of its own, with ``bench`` (a shell script body) as the llama-bench
    beside it, or the real llama-bench when None. Every call of llama-bench is counted in ``calls``."""
    box = tmp_path / "bin"
    box.mkdir()
    ld = f'export LD_LIBRARY_PATH="{server.lib_dir}"\n' if server.lib_dir else ""
    real_bench = str(Path(server.path).with_name("llama-bench"))
    (box / "llama-server").write_text(f'#!/bin/sh\n{ld}exec "{server.path}" "$@"\n')
    body = bench if bench is not None else f'exec "{real_bench}" "$@"\n'
    (box / "llama-bench").write_text(f'#!/bin/sh\n{ld}echo "$@" >> "{tmp_path}/calls"\n{body}')
    for f in box.iterdir():
        f.chmod(0o755)
    return str(box / "llama-server")


def calls(tmp_path: Path) -> int:
    f = tmp_path / "calls"
    return len(f.read_text().splitlines()) if f.exists() else 0


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return ensure_demo_model(tmp_path / "m")


def probing() -> dict[str, str]:
    return dict(os.environ, LLAMAFIT_PROBE="auto")


# -- a model's metadata cannot steer run -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["listening on http://127.0.0.1:9/x", "prompt eval time = 1.2.3 ms / 1 tokens"])
def test_a_models_name_cannot_steer_run(server_bin: ServerBinary, tmp_path: Path, name: str) -> None:
    """llama.cpp prints a model's name into the server's log: named like the server's own lines, it neither
    chooses the URL run reports nor stops the log reader (the server would block on a full pipe)."""
    model = tmp_path / "named.gguf"
    write_gguf(model, "llama", {**demo_metadata(), "general.name": name}, demo_tensors(), fill="random", seed=1)
    port = free_port()
    p = launch_run([str(model), "--json", "--", "--port", str(port)], server_bin)
    try:
        doc = read_json_doc(p, 120)
        assert doc["url"] == f"http://127.0.0.1:{port}"
        assert any(r["kind"] == "kv" and r["actual_mib"] for r in doc["memory"])  # the whole load was read
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/completion", json.dumps({"prompt": "hello", "n_predict": 4}))
        assert c.getresponse().status == 200
        time.sleep(1)
    finally:
        stop_run(p)
    assert p.stderr is not None
    err = p.stderr.read() if not p.stderr.closed else ""
    assert "could not be read" not in err


def test_a_line_that_claims_another_port_is_passed_over(tmp_path: Path) -> None:
    """A listening line nobody answers at comes first (printed while loading); the server's own comes after."""
    fake = 'print("0.00.000.000 I srv  llama_server: listening on http://127.0.0.1:9", file=sys.stderr, flush=True)\n'
    srv = stand_in(tmp_path, fake + READY + "while True: time.sleep(0.05)\n")
    warned: list[str] = []
    sup = Supervisor([srv], dict(os.environ), hooks=Hooks(on_warning=warned.append))
    sup.start()
    try:
        url = sup.wait_ready(30)
    finally:
        sup.stop(5)
    assert url != "http://127.0.0.1:9" and url.startswith("http://127.0.0.1:")
    assert any("does not answer" in w for w in warned)


def test_a_callback_that_fails_on_a_line_does_not_stop_the_reading(tmp_path: Path) -> None:
    srv = stand_in(tmp_path, 'print("poison", file=sys.stderr, flush=True)\n' + READY + "time.sleep(30)\n")
    warned: list[str] = []

    def on_line(line: str) -> None:
        if "poison" in line:
            raise ValueError("could not convert string to float: '1.2.3'")

    sup = Supervisor([srv], dict(os.environ), hooks=Hooks(on_line=on_line, on_warning=warned.append))
    sup.start()
    try:
        assert sup.wait_ready(30)
    finally:
        sup.stop(5)
    assert len(warned) == 1 and "could not be read" in warned[0]


# -- llama-bench dies with llamafit, and every wait on it has a bound ------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_hung_llama_bench_dies_with_llamafit(
    server_bin: ServerBinary, tmp_path: Path, demo: Path, sig: signal.Signals
) -> None:
    srv = toolbox(tmp_path, server_bin)
    p = subprocess.Popen([*LLAMAFIT, "plan", str(demo), "--server", srv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=probing())  # fmt: skip
    try:
        assert wait_for(lambda: bool(benches(p.pid)), 60), "no llama-bench started"
        found = benches(p.pid)
        for b in found:
            b.send_signal(signal.SIGSTOP)  # a real llama-bench, hung
        os.kill(p.pid, sig)
        p.wait(30)
        assert wait_for(lambda: gone(found), 10), f"llama-bench outlived llamafit ({sig.name})"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == (128 + sig if sig == signal.SIGTERM else -sig)


def test_tune_keeps_to_its_budget_with_a_hung_bench(server_bin: ServerBinary, tmp_path: Path, demo: Path) -> None:
    srv = toolbox(tmp_path, server_bin, bench="kill -STOP $$\n")  # it stops itself: hung
    t = time.monotonic()
    r = subprocess.run([*LLAMAFIT, "tune", str(demo), "--server", srv, "--budget", "5", "--json"],
                       capture_output=True, text=True, timeout=120, env=probing())  # fmt: skip
    assert time.monotonic() - t < 40, r.stderr
    assert r.returncode == ExitCode.SERVER_LOAD_FAILED, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "llamafit.tune/1" and doc["error"]["kind"] == "server_load_failed"
    assert "measured nothing" in doc["error"]["message"]


@pytest.mark.parametrize("budget", ["nan", "inf"])
def test_a_budget_that_is_no_time_is_a_usage_error(demo: Path, budget: str) -> None:
    r = subprocess.run([*LLAMAFIT, "tune", str(demo), "--budget", budget], capture_output=True, text=True, timeout=60)
    assert r.returncode == ExitCode.USAGE, r.stderr


def test_ctrl_c_before_the_first_result_is_an_interrupt(server_bin: ServerBinary, tmp_path: Path, demo: Path) -> None:
    srv = toolbox(tmp_path, server_bin, bench="sleep 600\n")
    p = subprocess.Popen([*LLAMAFIT, "tune", str(demo), "--server", srv, "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=probing())  # fmt: skip
    try:
        assert wait_for(lambda: calls(tmp_path) > 0, 60)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == ExitCode.INTERRUPTED, err
    assert json.loads(out)["error"]["kind"] == "interrupted"


def test_a_probe_that_failed_is_not_run_again_by_every_plan(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    srv = toolbox(tmp_path, server_bin, bench='echo "error: unknown argument" >&2\nexit 1\n')
    for _ in range(3):
        r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv], capture_output=True, text=True,
                           timeout=120, env=probing())  # fmt: skip
        assert r.returncode == 0, r.stderr
    assert calls(tmp_path) == 1
    assert "not measured again for now" in r.stderr


def test_a_cached_failure_with_escape_sequences_is_bounded_and_escaped(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    """The rates cache is input: a failure's reason written there with a clipboard write and a screen clear,
    a million characters long, reaches neither the terminal nor the JSON raw nor whole."""
    srv = toolbox(tmp_path, server_bin, bench='echo "error: unknown argument" >&2\nexit 1\n')
    assert subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv], capture_output=True, timeout=120,
                          env=probing()).returncode == 0  # fmt: skip
    cache = Path(os.environ["LLAMAFIT_CACHE"]) / "speed" / "rates.json"
    doc = json.loads(cache.read_text())
    hostile = "\x1b]52;c;cHduZWQ=\x07\x1b[2J" * 50000
    for k, v in doc["entries"].items():
        if k.startswith("failed|"):
            v["failed"] = hostile
    cache.write_text(json.dumps(doc))
    for json_out in ([], ["--json"]):
        r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv, *json_out], capture_output=True,
                           text=True, timeout=120, env=probing())  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        assert len(r.stdout) + len(r.stderr) < 20000 and "\x1b" not in r.stdout + r.stderr
        said = r.stderr if not json_out else json.dumps(json.loads(r.stdout)["notes"])
        assert "not measured again for now: \\x1b]52;c;cHduZWQ=\\x07" in said.replace("\\\\", "\\"), said[:500]


def test_a_plan_does_not_wait_while_another_llamafit_measures(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    """Two cold plans at once would each time the other's load (and eight would take minutes): the second
    uses what is cached and says why."""
    srv = toolbox(tmp_path, server_bin)
    with pc.measuring(Path(os.environ["LLAMAFIT_CACHE"]) / "speed") as mine:
        assert mine
        t = time.monotonic()
        r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv], capture_output=True, text=True,
                           timeout=120, env=probing())  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert calls(tmp_path) == 0 and time.monotonic() - t < 30
    assert "another llamafit is measuring" in r.stderr


def test_a_bench_that_reports_impossible_speeds_is_not_believed(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    line = {"model_filename": "x", "n_prompt": 0, "n_gen": 64, "n_depth": 0, "n_ubatch": 512, "samples_ns": [1]}
    srv = toolbox(tmp_path, server_bin, bench=f"echo '{json.dumps(line)}'\n")
    r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv, "--json"], capture_output=True, text=True,
                       timeout=120, env=probing())  # fmt: skip
    assert r.returncode == 0, r.stderr
    sp = json.loads(r.stdout)["speed"]
    assert sp["tg"] is None or sp["tg"] < 1e6
    r = subprocess.run([*LLAMAFIT, "tune", str(demo), "--server", srv, "--budget", "20"], capture_output=True,
                       text=True, timeout=120, env=probing())  # fmt: skip
    assert r.returncode == ExitCode.SERVER_LOAD_FAILED and "measured nothing" in r.stderr


# -- llamafit's own files ----------------------------------------------------------------------------------------


def test_own_files_that_are_fifos_do_not_block_a_plan(server_bin: ServerBinary, demo: Path) -> None:
    cache, data = Path(os.environ["LLAMAFIT_CACHE"]), Path(os.environ["LLAMAFIT_DATA"])
    (cache / "speed").mkdir(parents=True)
    data.mkdir(parents=True, exist_ok=True)
    for f in (cache / "capabilities.json", cache / "devices.json", cache / "speed" / "rates.json", tune_file()):
        os.mkfifo(f)
    r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", server_bin.path], capture_output=True, text=True,
                       timeout=120, env=probing())  # fmt: skip
    assert r.returncode == 0, r.stderr


def _planned(model: Path, server: ServerBinary, gpu: str) -> tuple[Planner, object]:
    o = Options(server=server.path, gpu=(gpu,))
    planner = Planner.for_options(o)
    return planner, planner.plan(str(model), speed=True, tuned=False)


@pytest.mark.parametrize(
    "flags", [["-m", "other.gguf"], ["-c", "99999999"], ["--lora", "missing.gguf"], ["-ub", "2048", "-np", "999"]]
)
def test_a_hostile_winner_is_not_used(server_bin: ServerBinary, tmp_path: Path, demo: Path, flags: list[str]) -> None:
    _, prep = _planned(demo, server_bin, "8GiB")
    key = tune_key(prep.plan.model, prep.plan.devices, prep.server, prep.user)  # type: ignore[attr-defined]
    tune_file().parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "llamafit.tune-cache/1", "winners": {key: {"flags": flags, "pp": 100.0, "tg": 1e-320}}}
    tune_file().write_text(json.dumps(doc))
    r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", server_bin.path, "--gpu", "8GiB", "--json"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not any(d["code"] == "speed.tuned" for d in json.loads(r.stdout)["decisions"])


def test_a_winner_that_would_cut_the_context_is_not_used(server_bin: ServerBinary, tmp_path: Path) -> None:
    """A winner tuned with a large card free (-ub 2048), planned where less is free: the context is chosen
    first, and the winner's larger compute buffer does not take it; where it fits, it is used."""
    model = factory.qwen3_8b().write(tmp_path / "qwen3-8b.gguf")
    winner = {"flags": ["-ub", "2048"], "pp": 900.0, "tg": 40.0, "time": "2026-12-01T00:00:00Z"}
    winners = {}
    plans = {}
    for gpu in ("7000MiB/24GiB", "22000MiB/24GiB"):
        _, prep = _planned(model, server_bin, gpu)
        winners[tune_key(prep.plan.model, prep.plan.devices, prep.server, prep.user)] = winner  # type: ignore[attr-defined]
        plans[gpu] = prep.plan  # type: ignore[attr-defined]
    tune_file().parent.mkdir(parents=True, exist_ok=True)
    tune_file().write_text(json.dumps({"schema": "llamafit.tune-cache/1", "winners": winners}))
    argv = [*LLAMAFIT, "plan", str(model), "--server", server_bin.path, "--json"]
    cut = subprocess.run([*argv, "--gpu", "7000MiB/24GiB", "--", "-ub", "2048"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert json.loads(cut.stdout)["context"]["n_ctx"] < plans["7000MiB/24GiB"].n_ctx  # what the winner costs here
    r = subprocess.run([*argv, "--gpu", "7000MiB/24GiB"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["context"]["n_ctx"] == plans["7000MiB/24GiB"].n_ctx
    assert not any(d["code"] == "speed.tuned" for d in doc["decisions"])
    assert any("not used: it would cut the context" in n for n in doc["notes"])
    r = subprocess.run([*argv, "--gpu", "22000MiB/24GiB"], capture_output=True, text=True, timeout=120)
    assert any(d["code"] == "speed.tuned" for d in json.loads(r.stdout)["decisions"])


# -- several models ----------------------------------------------------------------------------------------------


def test_sigkill_while_the_router_loads_leaves_no_instance(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    other = factory.qwen3_0_6b().write(tmp_path / "other.gguf")
    port = free_port()
    p = subprocess.Popen([*LLAMAFIT, "run", str(demo), str(other), "--cpu-only", "--server", server_bin.path, "--",
                          "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    def servers() -> list[psutil.Process]:
        try:
            return [c for c in psutil.Process(p.pid).children(recursive=True) if "llama-server" in c.name()]
        except psutil.NoSuchProcess:
            return []

    try:
        assert wait_for(lambda: len(servers()) >= 2, 60), "the router started no instance"
        found = servers()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        assert wait_for(lambda: gone(found), 15), "an instance outlived llamafit"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_quant_with_several_models_is_a_usage_error(demo: Path, tmp_path: Path) -> None:
    other = factory.qwen3_0_6b().write(tmp_path / "other.gguf")
    for cmd in (["plan"], ["run", "--dry-run"]):
        r = subprocess.run([*LLAMAFIT, *cmd, str(demo), str(other), "--quant", "best"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
        assert r.returncode == ExitCode.USAGE and "--quant" in r.stderr, r.stderr


# -- measurements that deserve the cache (issue #41; under load: test_trust_load.py) ----------------------------


def test_a_served_request_far_from_its_prediction_drops_the_measurement(server_bin: ServerBinary, demo: Path) -> None:
    from llamafit.planning.planner import prepare
    from llamafit.serving.outcome import FAR, SpeedCheck
    from llamafit.serving.timings import Served

    directory = Path(os.environ["LLAMAFIT_CACHE"]) / "speed"
    os.environ["LLAMAFIT_PROBE"] = "auto"
    try:
        prep = prepare(str(demo), Options(server=server_bin.path))
    finally:
        os.environ.pop("LLAMAFIT_PROBE")
    assert prep.measured is not None and prep.plan.speed is not None and prep.plan.speed.tg
    cached = set(pc.read_cache(directory))
    assert cached
    near = SpeedCheck(Served(16, 10.0, 8, 8 / prep.plan.speed.tg * 1e3), None, prep.plan.speed.tg)
    far = SpeedCheck(Served(16, 10.0, 8, 1.0), None, 9.3)  # the demo's 700x: 8 tokens in 1 ms against 9.3 tok/s
    assert not near.far and far.far and "far from the prediction" in far.message()
    # a request this short, measured and predicted (the demo's 15-token prompt: 35 ms against 0.1 ms), is mostly
    # per-request costs: said, not taken as evidence against the measurement
    short = SpeedCheck(Served(15, 35.0, 8, 0.9), 172712.5, 11421.2)
    assert not short.far and "too short to judge" in short.message() and FAR not in short.message()
    assert prep.measured.forget() and not set(pc.read_cache(directory)) & cached


def test_a_measurement_the_plans_time_cuts_short_goes_on_then_rests(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    """A device too slow to finish the probe within a plan's time: the first plan keeps what it measured (its
    overheads), the next goes on and, making no progress, remembers it; no plan fails on the half-measured
    device (a host rated from its overheads alone divided by a streaming rate of zero)."""
    real = str(Path(server_bin.path).with_name("llama-bench"))
    # the overheads' run (64 tokens of the tiny models) is real; every longer test outlasts the plan's time
    srv = toolbox(tmp_path, server_bin, bench=f'case "$*" in *"-n 64"*) exec "{real}" "$@";; esac\nexec sleep 300\n')
    said = []
    for _ in range(3):
        r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv, "--json"], capture_output=True, text=True,
                           timeout=120, env=probing())  # fmt: skip
        assert r.returncode == 0, r.stderr
        said.append(r.stderr)
    assert "measured in part" in said[0] and "was not measured" not in said[0]  # its attention not tried after it
    assert "could not be measured" in said[1] and "llamafit tune measures it" in said[1]
    assert "not measured again for now" in said[2]


def test_measuring_an_rpc_device_never_cuts_a_run_short(server_bin: ServerBinary, tmp_path: Path) -> None:
    """A llama-bench killed mid-transfer crashes ggml-rpc-server (the user's): a plan's measuring time stops
    new runs on an RPC device, never one that started, and every plan after finds the server listing its device.
    Its visits within a token are timed apart from its first (a second split in the graph costs a fraction of
    it), and kept with the device's overheads."""
    from llamafit.planning.planner import prepare
    from tests.realserver import rpc_servers

    model = factory.qwen3_0_6b().write(tmp_path / "q06.gguf")
    os.environ["LLAMAFIT_PROBE"] = "auto"

    def rpc0_entries() -> dict[str, dict[str, object]]:
        assert prep.measured is not None and prep.measured.directory is not None
        return {k: e for k, e in pc.read_cache(prep.measured.directory).items() if "RPC0" in k and "failed" not in k}

    try:
        with rpc_servers(server_bin, 1) as (rpc,):
            o = Options(server=server_bin.path, rpc=(rpc,), server_args=("-np", "1", "-c", "4096"))
            for _ in range(3):
                prep = prepare(str(model), o)
                assert [d.device.id for d in prep.plan.devices] == ["RPC0"]
            assert prep.measured is not None and prep.measured.directory is not None
            rpc0 = prep.measured.rates["RPC0"]
            assert rpc0.source == "measured" and rpc0.visit is not None and rpc0.split > 0, rpc0
            assert rpc0.readback == rpc0.visit  # behind RPC each tensor read back is a round trip
            kept = rpc0_entries()  # the device's overheads, and its rates for this model
            assert len(kept) == 2 and all(e["visited"] and e["unvisited"] for e in kept.values()), kept
            # a cache written before visits were timed: the next plan times them, and nothing else again
            older = {k: {f: v for f, v in e.items() if f not in ("visited", "unvisited")} for k, e in kept.items()}
            store.update_json(
                prep.measured.directory / "rates.json", lambda d: {**d, "entries": {**d["entries"], **older}}
            )
            prep = prepare(str(model), o)
            again = rpc0_entries()
            assert all(again[k]["visited"] and again[k]["twin_tg"] == e["twin_tg"] for k, e in kept.items()), again
    finally:
        os.environ.pop("LLAMAFIT_PROBE")


def test_a_plan_that_does_not_fit_measures_nothing(server_bin: ServerBinary, tmp_path: Path) -> None:
    """Two cards the fit could split over, a model they and the host cannot hold: the plan fails at once,
    llama-bench never runs (before the fit the cards are read as cached; what a plan uses is measured after)."""
    from tests.realserver import rpc_servers

    model = factory.glm45_air().write(tmp_path / "glm.gguf")
    srv = toolbox(tmp_path, server_bin)
    with rpc_servers(server_bin, 2) as eps:
        r = subprocess.run([*LLAMAFIT, "plan", str(model), "--server", srv, "--rpc", ",".join(eps), "--", "-c", "8192"],
                           capture_output=True, text=True, timeout=120, env=probing())  # fmt: skip
    assert r.returncode == ExitCode.DOES_NOT_FIT, r.stderr
    assert calls(tmp_path) == 0 and "measuring speed" not in r.stderr


def test_a_device_not_measured_is_priced_as_one_of_its_kind(server_bin: ServerBinary, tmp_path: Path) -> None:
    """Two RPC servers on one host: the second's measurement fails (a first plan's time can end before it), so it is
    priced as the first, said, where a prior would span 25x; the failure is remembered for that server alone."""
    from llamafit.planning.planner import prepare
    from tests.realserver import rpc_servers

    model = factory.qwen3_0_6b().write(tmp_path / "q06.gguf")
    real = str(Path(server_bin.path).with_name("llama-bench"))
    srv = toolbox(tmp_path, server_bin, bench=f'case "$*" in *"-dev RPC1"*) exit 1;; esac\nexec "{real}" "$@"\n')
    os.environ["LLAMAFIT_PROBE"] = "auto"
    try:
        with rpc_servers(server_bin, 2) as eps:
            o = Options(server=srv, rpc=(",".join(eps),), server_args=("-np", "1", "-c", "4096", "-ngl", "all"))
            prep = prepare(str(model), o, measure=120)
            assert prep.measured is not None and prep.measured.directory is not None
            rates = prep.measured.rates
            assert rates["RPC0"].source == "measured" and rates["RPC1"] == rates["RPC0"], rates
            assert rates["RPC1"].split > 0, rates  # a first visit's cost, apart from the host's time per evaluation
            notes = "\n".join(prep.measured.notes)
            assert "RPC1 is priced as RPC0, a device of the same kind (RPC, 127.0.0.1" in notes, notes
            failed = [k for k in pc.read_cache(prep.measured.directory) if k.startswith("failed|")]
            assert len(failed) == 1 and "RPC1" in failed[0], failed
            # the next plan, its layers on RPC1 alone, reads what is cached first for every device, the host's
            # overheads alone among it (it held no layer): they are still what each device's split is left of
            o = replace(o, server_args=(*o.server_args, "-ts", "0,1"))
            again = prepare(str(model), o, measure=120)
            assert again.measured is not None and again.measured.rates["RPC0"].split > 0, again.measured.rates
    finally:
        os.environ.pop("LLAMAFIT_PROBE")


def test_every_device_is_measured_before_any_attention_run(server_bin: ServerBinary, tmp_path: Path) -> None:
    """A first plan over the host and an RPC device: the host's attention run (here one that outlasts the plan's
    time) comes after the RPC device's rates, its visits within a token among them, not before them."""
    from llamafit.planning.planner import prepare
    from tests.realserver import rpc_servers

    model = factory.qwen3_0_6b().write(tmp_path / "q06.gguf")
    real = str(Path(server_bin.path).with_name("llama-bench"))
    srv = toolbox(tmp_path, server_bin, bench=f'case "$*" in *"-d 0,"*) exec sleep 300;; esac\nexec "{real}" "$@"\n')
    os.environ["LLAMAFIT_PROBE"] = "auto"
    try:
        with rpc_servers(server_bin, 1) as (rpc,):
            o = Options(server=srv, rpc=(rpc,), server_args=("-np", "1", "-c", "4096", "-ngl", "14"))
            prep = prepare(str(model), o, measure=20)
            assert prep.measured is not None
            rates = prep.measured.rates
            assert rates["RPC0"].source == "measured" and rates["RPC0"].visit is not None, rates["RPC0"]
            assert rates["CPU"].source == "measured" and rates["CPU"].attention is None, rates["CPU"]
    finally:
        os.environ.pop("LLAMAFIT_PROBE")


def test_a_devices_visits_are_timed_before_its_twin_where_they_are_cheap(
    server_bin: ServerBinary, tmp_path: Path
) -> None:
    """An RPC device's twin (its upload the larger part of a first plan's time there) fails here: its visits within
    a token, a fraction of a second on loopback, were timed before it and are kept with its overheads."""
    from llamafit.planning.planner import prepare
    from tests.realserver import rpc_servers

    model = factory.qwen3_0_6b().write(tmp_path / "q06.gguf")
    real = str(Path(server_bin.path).with_name("llama-bench"))
    twin_fails = f'case "$*" in *twin*"-dev RPC0"*) exit 1;; esac\nexec "{real}" "$@"\n'
    srv = toolbox(tmp_path, server_bin, bench=twin_fails)
    os.environ["LLAMAFIT_PROBE"] = "auto"
    try:
        with rpc_servers(server_bin, 1) as (rpc,):
            o = Options(server=srv, rpc=(rpc,), server_args=("-np", "1", "-c", "4096", "-ngl", "all"))
            prep = prepare(str(model), o)
            assert prep.measured is not None and prep.measured.directory is not None
            kept = pc.read_cache(prep.measured.directory)
            rpc0 = [e for k, e in kept.items() if "RPC0" in k and k.endswith("|device")]
            assert len(rpc0) == 1 and rpc0[0]["visited"] and rpc0[0]["unvisited"], kept
            assert any("twin" in line and "-dev RPC0" in line for line in (tmp_path / "calls").read_text().splitlines())
    finally:
        os.environ.pop("LLAMAFIT_PROBE")
