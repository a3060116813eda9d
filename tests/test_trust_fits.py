"""Never a wrong "fits": flags that change memory are priced as the server reads them, flags and values it
would refuse are refused at plan time, device lists and presets are input, and the run's own state is its
own. Each case is a row of issue 28; the ones with a real server hold the plan to its log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.listed import read_device_list
from llamafit.devices.machine import Device, GpuProbeError, Host, PhysicalGpu, discover, merge_listed
from llamafit.devices.rpc import same_servers
from llamafit.errors import ExitCode, UsageError
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model, with_kv
from llamafit.gguf.writer import write_gguf
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.server.values import kv_overrides
from llamafit.several.preset import read_ini
from llamafit.several.together import entries_from_preset
from llamafit.speculative import spec_options
from llamafit.units import GiB, MiB
from tests import factory
from tests.test_device_list import stand_in

HOST = Host(total=64 * GiB, available=60 * GiB)


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.gemma3(n_layer=6, sliding_window=512).write(tmp_path_factory.mktemp("g") / "gemma.gguf")


def _kv(doc: dict[str, object]) -> int:
    return sum(d["use"]["kv"] for d in doc["devices"])  # type: ignore[index,misc]


def test_override_kv_of_a_key_the_memory_model_reads_is_priced(gemma: Path) -> None:
    args = ("--gpu", "24GiB", "--json", "--", "-c", "16384", "-np", "1")
    base = json.loads(invoke("plan", str(gemma), *args).stdout)
    wide = json.loads(
        invoke("plan", str(gemma), *args, "--override-kv", "gemma3.attention.sliding_window=int:16384").stdout
    )
    over, notes = with_kv(load_model(gemma), {"gemma3.attention.sliding_window": 16384})
    assert not notes and over.hparams.n_swa == 16384
    assert _kv(wide) > 2 * _kv(base)  # every sliding-window layer now caches the whole context
    # an override of an array key is not applied by llama-server, and the plan says so
    _, notes = with_kv(load_model(gemma), {"tokenizer.ggml.tokens": "x"})
    assert notes and "array" in notes[0]


def test_override_kv_values_are_read_as_llama_server_reads_them() -> None:
    got = kv_overrides(parse_server_args(["--override-kv", "a.b=int:7,c=bool:true", "--override-kv", "d=str:x"]))
    assert got == {"a.b": 7, "c": True, "d": "x"}
    for bad in ("a=int:", "a=bool:yes", "a=num:1", "noequals", "a=int:٤"):
        with pytest.raises(UsageError):
            kv_overrides(parse_server_args(["--override-kv", bad]))


def _lora(path: Path, base: Path, layers: int, rank: int) -> Path:
    """A LoRA adapter GGUF for ``base``'s attention projections (the tensors convert_lora_to_gguf writes)."""
    model = load_model(base)
    specs = []
    from llamafit.gguf.writer import TensorSpec

    for t in model.tensors:
        if t.layer is not None and t.layer < layers and t.name.endswith(("attn_q.weight", "attn_v.weight")):
            n_in, n_out = t.info.shape[0], t.info.shape[1]
            specs += [
                TensorSpec(t.name + ".lora_a", (n_in, rank), "f16"),
                TensorSpec(t.name + ".lora_b", (rank, n_out), "f16"),
            ]
    kv = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": float(rank)}
    write_gguf(path, model.arch, kv, specs)
    return path


def test_a_lora_adapter_is_priced_where_its_weights_are(tmp_path: Path) -> None:
    base = factory.llama31_8b().write(tmp_path / "l8b.gguf")
    adapter = _lora(tmp_path / "lora.gguf", base, 32, 256)
    plain = json.loads(invoke("plan", str(base), "--gpu", "24GiB", "--json", "--", "-c", "8192").stdout)
    with_lora = json.loads(
        invoke("plan", str(base), "--gpu", "24GiB", "--json", "--", "-c", "8192", "--lora", str(adapter)).stdout
    )
    added = with_lora["devices"][0]["use"]["adapters"]
    assert added == pytest.approx(32 * 256 * (4096 + 4096 + 4096 + 1024) * 2, rel=0.01)  # f16 A and B of q, v
    assert with_lora["devices"][0]["need"] == plain["devices"][0]["need"] + added
    r = invoke("plan", str(base), "--gpu", "24GiB", "--", "--lora", str(tmp_path / "missing.gguf"))
    assert r.exit_code == ExitCode.MODEL_NOT_FOUND and "--lora" in r.stderr


@pytest.mark.server
def test_a_lora_adapters_buffer_is_what_the_server_allocates(server_bin: ServerBinary, tmp_path: Path) -> None:
    base = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    adapter = _lora(tmp_path / "lora.gguf", base, 28, 64)
    r = invoke(
        "plan",
        str(base),
        "--cpu-only",
        "--json",
        "--server",
        server_bin.path,
        "--",
        "-c",
        "4096",
        "-np",
        "1",
        "--lora",
        str(adapter),
    )
    doc = json.loads(r.stdout)
    predicted = doc["host"]["use"]["adapters"]
    lines = [ln for ln in log_lines(server_bin, doc["argv"][1:]) if "LoRA buffer size" in ln]
    assert lines, "the server logged no LoRA buffer"
    logged = sum(float(ln.split("=")[-1].split()[0]) for ln in lines) * MiB
    assert predicted == pytest.approx(logged, abs=0.01 * MiB)


def log_lines(server: ServerBinary, args: list[str]) -> list[str]:
    from llamafit.server.binary import free_port
    from llamafit.server.supervisor import Supervisor

    argv = [
        server.path,
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--no-warmup",
        "-lv",
        "4",
        "--log-colors",
        "off",
    ]
    running = Supervisor(argv, server.env())
    running.start()
    try:
        running.wait_ready(timeout=120)
    finally:
        out = running.stop()
    return out.lines


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-c", "٤٠٩٦"], "ASCII digits"),
        (["--ctx-checkpoints", "３"], "ASCII digits"),
        (["-c=4096"], "-c 4096"),
        (["-np=2"], "-np 2"),
        (["--", "-c", "4096"], "a second --"),
        (["--json"], "llamafit's option"),
        (["--server", "/bin/x"], "llamafit's option"),
        (["--no-such-flag"], "does not accept --no-such-flag"),
        (["-c", "4096", "stray.gguf"], "no flag's value"),
    ],
)
def test_what_llama_server_would_refuse_is_refused_at_plan_time(tmp_path: Path, args: list[str], said: str) -> None:
    model = factory.dense().write(tmp_path / "m.gguf")
    r = invoke("plan", str(model), "--cpu-only", "--", *args)
    assert r.exit_code == ExitCode.USAGE, r.stdout
    assert said in r.stderr, r.stderr


def test_quant_choices_and_one_file_do_not_mix(tmp_path: Path) -> None:
    a, b = (factory.dense().write(tmp_path / n) for n in ("a.gguf", "b.gguf"))
    assert invoke("plan", str(a), str(b), "--quants").exit_code == ExitCode.USAGE
    assert invoke("plan", "acme/repo:best", "--hf-file", "x.gguf").exit_code == ExitCode.USAGE
    assert invoke("plan", "acme/repo", "--quants", "--hf-file", "x.gguf").exit_code == ExitCode.USAGE


LISTED = """\
Available devices:
  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23400 MiB free)
  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23400 MiB free)
  CUDA1: NVIDIA GeForce RTX 3060 (12288 MiB, 999999 MiB free)
  Vulkan0: Odd Card (24 GiB, 20 GiB free)
  Vulkan1: Huge (999999999999999999999 MiB, 1 MiB free)
"""


def test_a_device_list_is_input() -> None:
    devs, notes, unreadable = read_device_list(LISTED)
    assert [d.name for d in devs] == ["CUDA0", "CUDA1"]  # one card listed twice is one card
    assert devs[1].free == devs[1].total  # free above total is the total
    assert any("twice" in n for n in notes) and any("999999 MiB free" in n for n in notes)
    assert [u.split(":")[0] for u in unreadable] == ["Vulkan0", "Vulkan1"]


@pytest.mark.server
def test_a_device_line_that_cannot_be_read_makes_the_plan_blind(server_bin: ServerBinary, tmp_path: Path) -> None:
    srv = stand_in(tmp_path, server_bin, "Available devices:\n  CUDA0: NVIDIA X (-8 MiB, 24 GiB free)\n")
    m = discover(server=srv, server_env=server_bin.env(), probe=NoNvml(), host=HOST)
    assert m.blind and "cannot read" in m.blind[0]
    model = factory.dense().write(tmp_path / "m.gguf")
    r = invoke("plan", str(model), "--server", srv, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["blind"] and "-fit" not in doc["argv"]  # llama.cpp's own fit places it: never confident and blind


class NoNvml:
    def gpus(self) -> list[PhysicalGpu]:
        raise GpuProbeError("no driver")


def test_nvidia_cards_get_their_own_numbers_whatever_the_enumeration_order() -> None:
    """CUDA lists the fastest card first; NVML by PCI bus: each listed card takes the NVML card that is it."""
    from llamafit.devices.listed import ListedDevice

    slow = Device("NVML0", "NVIDIA GeForce RTX 3060", 12288 * MiB, 2000 * MiB, nvml_index=0, bandwidth=360e9)
    fast = Device("NVML1", "NVIDIA GeForce RTX 4090", 24564 * MiB, 20000 * MiB, nvml_index=1, bandwidth=1008e9)
    listed = [
        ListedDevice("CUDA0", "NVIDIA GeForce RTX 4090", 24080 * MiB, 23400 * MiB, "CUDA"),
        ListedDevice("CUDA1", "NVIDIA GeForce RTX 3060", 12044 * MiB, 11000 * MiB, "CUDA"),
    ]
    devs, _, blind = merge_listed(listed, [slow, fast])
    assert [(d.id, d.name, d.free, d.bandwidth) for d in devs] == [
        ("CUDA0", "NVIDIA GeForce RTX 4090", 20000 * MiB, 1008e9),
        ("CUDA1", "NVIDIA GeForce RTX 3060", 2000 * MiB, 360e9),
    ]
    assert not blind


def test_one_rpc_server_named_twice_is_one_server() -> None:
    once, notes = same_servers(["127.0.0.1:50052", "localhost:50052", "127.0.0.1:50053"])
    assert once == ["127.0.0.1:50052", "127.0.0.1:50053"] and "the same server" in notes[0]


def test_a_preset_is_read_as_the_router_reads_it(tmp_path: Path) -> None:
    model = factory.dense().write(tmp_path / "m.gguf")
    text = f"[a]\nmodel = {model}\nctx-size = 16384\nc = 4096\n[b]\nmodel = {model}\n[b]\nmodel = {model}\nc = 2048\n"
    sections = read_ini(text)
    assert [s.name for s in sections] == ["a", "b"] and sections[1].repeated == [7]
    entries = {e.name: e for e in entries_from_preset(sections, "p.ini")}
    # keys apply in sorted order (a std::map): c, then ctx-size, which wins
    assert parse_server_args(list(entries["a"].args)).last("--ctx-size").value == "16384"  # type: ignore[union-attr]
    assert parse_server_args(list(entries["b"].args)).last("--ctx-size").value == "2048"  # type: ignore[union-attr]
    glob = read_ini(f"[*]\nctx-size = 8192\n[a]\nmodel = {model}\nc = 1024\n")
    (a,) = entries_from_preset(glob, "p.ini")
    assert parse_server_args(list(a.args)).last("--ctx-size").value == "1024"  # type: ignore[union-attr]


def test_cache_ram_unlimited_still_gets_checkpoints_that_fit(tmp_path: Path) -> None:
    from llamafit.devices.machine import Machine

    model = load_model(factory.gemma3_4b().write(tmp_path / "g4b.gguf"))
    small = Machine((), Host(total=32 * GiB, available=16 * GiB))
    args = ["-c", "32768", "-np", "4", "--cache-ram", "-1"]
    user = parse_server_args(args)
    p = make_plan(model, small, build_request(user, cpu_only=True), spec_options(user, mode="off"))
    rt = p.host.runtime
    assert rt.checkpoints <= rt.room and rt.per_slot < 32
    assert any("--cache-ram -1" in w and "give --cache-ram" in w for w in p.warnings)
    assert any(pl.tokens[0] == "--ctx-checkpoints" for pl in p.planned)


@pytest.mark.server
def test_one_rpc_server_given_twice_is_planned_once(server_bin: ServerBinary, tmp_path: Path) -> None:
    from tests.realserver import rpc_servers

    model = factory.dense().write(tmp_path / "m.gguf")
    with rpc_servers(server_bin, 1) as (ep,):
        port = ep.rsplit(":", 1)[1]
        r = invoke("plan", str(model), "--server", server_bin.path, "--json", "--rpc", ep, "--rpc", f"localhost:{port}")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["id"] for d in doc["devices"] if d["kind"] == "rpc"] == ["RPC0"]
    assert doc["argv"][doc["argv"].index("--rpc") + 1] == ep
    assert any("the same server" in n for n in doc["notes"])


# -- what the user set is honoured (issue 37) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.qwen3_8b().write(tmp_path_factory.mktemp("q") / "qwen3-8b.gguf")


def test_a_pinned_load_that_fits_the_card_but_not_the_margin_runs_with_a_warning(qwen3_8b: Path) -> None:
    """-ngl 99 -c 4096 on a card it fits with less than the margin left: llama-server loads it, so the plan
    does too and says what is left; on a card it does not fit, it is refused."""
    pinned = ("--json", "--", "-ngl", "99", "-c", "4096")
    roomy = json.loads(invoke("plan", str(qwen3_8b), "--gpu", "24GiB", *pinned).stdout)
    need = roomy["devices"][0]["use"]
    total = sum(v for k, v in need.items() if isinstance(v, int))
    tight = f"{(total + 256 * MiB) // MiB}MiB"  # a quarter of the margin left
    r = invoke("plan", str(qwen3_8b), "--gpu", tight, *pinned)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["fits"] and doc["context"]["n_ctx"] == 4096 and doc["placement"]["n_gpu_layers"] in (37, 99, -1)
    (warning,) = [w for w in doc["warnings"] if "not the margins" in w]
    assert "CUDA0 keeps 256 MiB free (the margin is 1.0 GiB)" in warning
    r = invoke("plan", str(qwen3_8b), "--gpu", f"{(total - 256 * MiB) // MiB}MiB", *pinned)
    assert r.exit_code == ExitCode.DOES_NOT_FIT
    # what llamafit chooses itself keeps the margin
    free = json.loads(invoke("plan", str(qwen3_8b), "--gpu", tight, "--json").stdout)
    assert not any("not the margins" in w for w in free["warnings"])
    assert free["devices"][0]["usable"] == free["devices"][0]["total"] - 1024 * MiB
