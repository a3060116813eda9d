"""The probe under load (issue #41): a busy machine or card is not measured, a load that arrives during a
measurement makes it doubtful and nothing is cached, a moment's hold-up is measured again and kept; with the
real llama-server and llama-bench, real busy processes, NVML at its one seam."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.server.binary import ServerBinary
from llamafit.speed import probe_cache as pc
from tests.test_trust_measuring import LLAMAFIT, calls, probing, toolbox

pytestmark = pytest.mark.server


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return ensure_demo_model(tmp_path / "m")


SPIN = "import time; t = time.monotonic()\nwhile time.monotonic() - t < 60: pass  # llamafit-test-load"


def _stop_spinners() -> None:
    for p in psutil.process_iter(["cmdline"]):
        if "llamafit-test-load" in " ".join(p.info["cmdline"] or ()):
            p.kill()


@pytest.fixture
def load() -> object:
    """Busy processes, one for each core: the load ggml's spinning threads suffer most from."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()
    _stop_spinners()


def test_a_busy_machine_is_not_measured_and_nothing_is_cached(
    server_bin: ServerBinary, tmp_path: Path, demo: Path, load: object
) -> None:
    srv = toolbox(tmp_path, server_bin)
    t = time.monotonic()
    r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv], capture_output=True, text=True,
                       timeout=120, env=probing())  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "speed not measured now: other processes keep" in r.stderr and calls(tmp_path) == 0
    assert time.monotonic() - t < 60  # waited its bounded while, then deferred
    assert pc.read_cache(Path(os.environ["LLAMAFIT_CACHE"]) / "speed") == {}


class BusyCard:
    """NVML at its one seam: a card another process keeps running kernels ``pct`` % of the time."""

    def __init__(self, pct: int) -> None:
        self.pct, self.asked = pct, 0

    def busy(self, index: int) -> int | None:
        self.asked += 1
        return self.pct


def test_a_card_another_process_keeps_busy_is_not_measured_and_nothing_is_cached(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    """A second model started while the first serves on the same card: the card is not measured under that
    load (the plan defers it and says why), llama-bench never runs, nothing is cached; an idle card is asked
    and passes."""
    from llamafit.devices.machine import Device, Host, Machine
    from llamafit.gguf.model import load_model
    from llamafit.speed.rate_source import RateSource, ServedAs

    srv = toolbox(tmp_path, server_bin)
    card = Device("CUDA0", "NVIDIA GeForce RTX 4090", 24 << 30, 23 << 30, nvml_index=0)
    machine = Machine((card,), Host(total=24 << 30, available=20 << 30))
    card_use = BusyCard(95)
    source = RateSource(machine, load_model(str(demo)), ServedAs(srv, probing()), gpu_use=card_use)
    measured = source.measured(["CUDA0"])
    assert card_use.asked and any("speed not measured now: CUDA0 is 95 % busy" in n for n in measured.notes)
    assert calls(tmp_path) == 0 and pc.read_cache(Path(os.environ["LLAMAFIT_CACHE"]) / "speed") == {}
    assert measured.rates["CUDA0"].source == "prior"  # what it is known as stays: the card's priors
    from llamafit.speed import busy

    assert busy.gpu_too_busy({"CUDA0": 0}, BusyCard(0)) is None
    assert busy.gpu_too_busy({"CUDA0": 0}, BusyCard(busy.GPU_BUSY + 1)) is not None


def test_a_load_that_arrives_during_a_measurement_makes_it_doubtful(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    spin = f"{sys.executable} -c '{SPIN}' >/dev/null 2>&1 &\n" * (os.cpu_count() or 1)
    real = str(Path(server_bin.path).with_name("llama-bench"))
    srv = toolbox(tmp_path, server_bin, bench=f'{spin}exec "{real}" "$@"\n')
    try:
        r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv, "--json"], capture_output=True,
                           text=True, timeout=180, env=probing())  # fmt: skip
    finally:
        _stop_spinners()
    assert r.returncode == 0, r.stderr
    assert "doubtful" in r.stderr and "not used, not cached" in r.stderr
    assert not [k for k in pc.read_cache(Path(os.environ["LLAMAFIT_CACHE"]) / "speed") if not k.startswith("failed|")]


# every result of llama-bench's first run held up: the upper half of its repetitions three times slower
HOLD = """import json, sys
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        print(line, end="")
        continue
    s = sorted(j.get("samples_ns") or [])
    j["samples_ns"] = s[: len(s) // 2] + [3 * x for x in s[len(s) // 2 :]]
    print(json.dumps(j))
"""


def _held_first(tmp_path: Path, server_bin: ServerBinary, second: str = "") -> str:
    """The real llama-server beside a llama-bench whose first run is held up (``HOLD``) and whose second run is
    ``second`` (a shell body, ``REAL`` the real llama-bench with its arguments; empty: the real one); every later
    run is the real one."""
    real = str(Path(server_bin.path).with_name("llama-bench"))
    hold = tmp_path / "hold.py"
    hold.write_text(HOLD)
    first, then = tmp_path / "held", tmp_path / "then"
    body = f'if [ ! -e "{first}" ]; then touch "{first}"; "{real}" "$@" | "{sys.executable}" "{hold}"; exit 0; fi\n'
    if second:
        run = second.replace("REAL", f'"{real}" "$@"')
        body += f'if [ ! -e "{then}" ]; then touch "{then}"; {run}; fi\n'
    return toolbox(tmp_path, server_bin, bench=f'{body}exec "{real}" "$@"\n')


def test_a_moments_hold_up_is_measured_again_and_the_steady_run_kept(
    server_bin: ServerBinary, tmp_path: Path, demo: Path
) -> None:
    """The first llama-bench run's repetitions disagree (something held the machine for a moment): that run
    is made once more, the steady repetitions are kept, and the measurement is cached as a quiet one."""
    srv = _held_first(tmp_path, server_bin)
    r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv, "--json"], capture_output=True, text=True,
                       timeout=180, env=probing())  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "doubtful" not in r.stderr and "measured this machine's speed" in r.stderr
    runs = (tmp_path / "calls").read_text().splitlines()
    assert len(runs) >= 2 and runs[0] == runs[1]  # the held-up run, made again with the same arguments
    assert [k for k in pc.read_cache(Path(os.environ["LLAMAFIT_CACHE"]) / "speed") if not k.startswith("failed|")]
    assert json.loads(r.stdout)["speed"]["devices"][0]["rates"] == "measured"


@pytest.mark.parametrize(
    "second",
    [
        "exit 1",  # the second try fails
        "REAL | head -n 1; exit 0",  # reports only the first of its tests, steady
    ],
    ids=["fails", "reports-fewer"],
)
def test_a_held_up_run_whose_second_try_fails_is_judged_on_the_first(
    server_bin: ServerBinary, tmp_path: Path, demo: Path, second: str
) -> None:
    """The run made again fails (llama-bench exits 1) or reports fewer tests: the first run's repetitions are
    judged, doubtful, and nothing is cached; the probe is not marked failed for a day."""
    srv = _held_first(tmp_path, server_bin, second)
    r = subprocess.run([*LLAMAFIT, "plan", str(demo), "--server", srv, "--json"], capture_output=True, text=True,
                       timeout=180, env=probing())  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "doubtful" in r.stderr and "not measured again for now" not in r.stderr
    runs = (tmp_path / "calls").read_text().splitlines()
    assert len(runs) > 2 and runs[0] == runs[1]  # the held-up run was tried again; the probe went on after it
    assert not [k for k in pc.read_cache(Path(os.environ["LLAMAFIT_CACHE"]) / "speed") if not k.startswith("failed|")]
