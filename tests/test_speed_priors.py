"""The speed of hardware that was not measured: every term from the backend's priors over the card's published
peaks (llamafit.speed.priors), the same model as a measured device's, with a range. Structure only: how far
the priors are from public measurements is bench/speed_dev.py's to print."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.described import described_gpu, described_gpus
from llamafit.devices.machine import Host, Machine, discover
from llamafit.devices.rates import Rates
from llamafit.errors import UsageError
from llamafit.fit import Inputs, make_plan
from llamafit.fit.request import build_request
from llamafit.fit.speed import priced
from llamafit.gguf.model import ModelInfo
from llamafit.memory.placement import CPU
from llamafit.server.args import parse_server_args
from llamafit.speed import priors
from llamafit.speed.known import host_rates, known_rates
from llamafit.units import GiB

HOST = Host(total=256 * GiB, available=240 * GiB)


def known(machine: Machine, host_bandwidth: float = 80e9) -> dict[str, Rates]:
    """What a plan for described hardware reads: each device's priors, the host's from its given bandwidth."""
    return {**{g.id: r for g in machine.gpus if (r := known_rates(g)) is not None}, CPU: host_rates(host_bandwidth)}


def plan_on(model: ModelInfo, specs: list[str], args: list[str]):  # type: ignore[no-untyped-def]
    machine = Machine(tuple(described_gpus(specs)), HOST)
    rates = known(machine)
    return priced(make_plan(model, machine, build_request(parse_server_args(args)), inputs=Inputs(rates=rates)), rates)


def test_more_cards_never_predict_faster_decode_of_a_model_one_card_holds(l8b: ModelInfo) -> None:
    tg = [plan_on(l8b, ["rtx-4090"] * n, ["-c", "8192", "-ngl", "99", "-sm", "layer"]).speed.tg for n in (1, 2, 4, 8)]
    assert all(t is not None for t in tg)
    # each card the layers cross adds a graph split: its synchronisation and the activations copied in
    assert tg == sorted(tg, reverse=True) and tg[-1] < tg[0], tg


def test_a_larger_ubatch_never_predicts_slower_prefill_with_experts_on_the_host(moe: ModelInfo) -> None:
    pp = [
        plan_on(moe, ["rtx-4090"], ["-c", "8192", "--n-cpu-moe", "16", "-ub", str(u), "-b", "2048"]).speed.pp
        for u in (256, 512, 1024, 2048)
    ]
    assert all(p is not None for p in pp)
    assert pp == sorted(pp) and pp[-1] > pp[0], pp


def test_a_prior_never_beats_a_measurement_of_the_same_term() -> None:
    prior = priors.prior_rates("CUDA", 1008e9, 330e12, 30e9)
    measured = Rates(read=700e9, read_by_type=(("q4_K", 650e9),), node=5e-6, split=1e-4, matmul=None, link=20e9)
    got = priors.fill(measured, prior)
    # what was measured stays as measured, faster prior or not; what was not measured comes from the prior
    assert (got.read, got.read_by_type, got.node, got.split, got.link) == (700e9, (("q4_K", 650e9),), 5e-6, 1e-4, 20e9)
    assert got.matmul == prior.matmul and got.source == "measured"
    both = priors.fill(Rates(read=1.0, matmul=5e12), prior)
    assert both.matmul == 5e12 and both.matmul_rate("f16") == 5e12


def test_a_device_with_priors_is_slower_than_its_peak_and_says_its_range(l8b: ModelInfo) -> None:
    sp = plan_on(l8b, ["rtx-4090"], ["-c", "8192"]).speed
    bound = 1008e9 / sum(t.info.nbytes for t in l8b.tensors if t.name != "token_embd.weight")
    assert sp.tg is not None and sp.tg < priors.PRIORS["CUDA"].stream_quant * bound
    assert sp.tg_range is not None and sp.tg_range[0] < sp.tg < sp.tg_range[1]
    assert sp.pp is not None and sp.pp_range is not None and sp.pp_range[0] < sp.pp < sp.pp_range[1]
    assert [d.source for d in sp.devices if d.device != CPU] == ["prior"]
    assert any("CUDA priors" in u for u in sp.unknown)
    # the same card under Vulkan: another backend's priors, another range
    vk = plan_on(l8b, ["vulkan:rtx-4090"], ["-c", "8192"]).speed
    assert vk.devices[0].device == "Vulkan0" and vk.tg != sp.tg and vk.tg_range != sp.tg_range


def test_a_range_weighs_each_device_by_its_part_of_the_time(l8b: ModelInfo) -> None:
    """A card's plan is as sure as the card's priors, whatever the host's (its part is its time per evaluation):
    the host's unknown bandwidth widens a range only as far as the host's layers take the time."""
    machine = Machine(tuple(described_gpus(["rtx-4090"])), HOST)
    unknown_host = {**known(machine), CPU: priors.assumed_host(8)}

    def ratio(args: list[str]) -> float:
        plan = make_plan(l8b, machine, build_request(parse_server_args(args)), inputs=Inputs(rates=unknown_host))
        lo, hi = priced(plan, unknown_host).speed.tg_range or (1.0, 0.0)
        return hi / lo

    card, host = priors.PRIORS["CUDA"].tg_spread, unknown_host[CPU].tg_spread
    full, half, none = ratio(["-c", "8192"]), ratio(["-c", "8192", "-ngl", "16"]), ratio(["-c", "8192", "-ngl", "0"])
    assert full == pytest.approx(card[1] / card[0], rel=0.05)  # the widest spread used (the host's) gave 10x here
    assert full < half < none == pytest.approx(host[1] / host[0], rel=0.05)


def test_gpu_specs_carry_the_backend_and_unified_memory() -> None:
    devs = described_gpus(["rtx-4090", "vulkan:rx-7900-xtx", "rtx-3090", "rx-7900-xtx"])
    assert [d.id for d in devs] == ["CUDA0", "Vulkan0", "CUDA1", "ROCm0"]
    assert [d.backend for d in devs] == ["CUDA", "Vulkan", "CUDA", "ROCm"]
    mac = described_gpu("48GiB/64GiB@m3-max")
    assert (mac.id, mac.backend, mac.uma, mac.fp16 > 0) == ("MTL0", "Metal", True, True)
    assert described_gpu("rocm:24GiB@960GB/s").id == "ROCm0" and described_gpu("24GiB@960GB/s").id == "CUDA0"
    for bad in ("opencl:rtx-4090", "vulkan:", "vulkan:rtx9999"):
        with pytest.raises(UsageError):
            described_gpu(bad)


def test_a_metal_device_described_by_its_size_is_unified_memory(l8b: ModelInfo) -> None:
    """Metal runs on Apple Silicon: its memory is the host's whether the card is named or only its size, so both
    descriptions plan the same load against the same RAM (not a GPU's memory beside it)."""
    assert described_gpu("metal:32GiB").uma and not described_gpu("vulkan:32GiB").uma
    docs = []
    for gpu in ("metal:20GiB", "20GiB@m3-max"):
        r = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", gpu, "--host-ram", "24GiB", "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        docs.append((doc["context"], doc["placement"], doc["host"]["unified"], doc["fits"]))
    assert docs[0] == docs[1] and docs[0][2] > 0


def test_a_unified_memory_card_is_its_machines_ram_not_this_ones() -> None:
    m = discover(gpu_specs=["96GiB/128GiB@ryzen-ai-max-395"])
    assert (m.host.total, m.host.available) == (128 * GiB, 96 * GiB)
    assert m.gpus[0].uma and m.gpus[0].id == "Vulkan0" and any("unified-memory" in n for n in m.notes)
    given = discover(gpu_specs=["96GiB/128GiB@ryzen-ai-max-395"], host=Host(total=64 * GiB, available=60 * GiB))
    assert given.host.total == 64 * GiB


def test_plan_json_gives_the_ranges_and_says_which_terms_are_priors(l8b: ModelInfo) -> None:
    r = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "rtx-4090", "--host-bandwidth", "80GB/s", "--json"])
    assert r.exit_code == 0, r.output
    sp = json.loads(r.stdout)["speed"]
    for k in ("tg", "pp"):
        lo, hi = sp[f"{k}_range"]
        assert lo < sp[k] < hi
    assert sp["devices"][0]["rates"] == "prior"
    text = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "rtx-4090"]).output
    assert f"tg {sp['tg']:.0f} (" in text and "prior rates" in text


def test_a_described_hosts_cores_give_its_prompt_processing(l8b: ModelInfo) -> None:
    """A host described by its bandwidth alone has no prefill rate (said, with what to give); its cores add one,
    more cores are faster, and ``-t`` caps the threads llama.cpp computes on."""

    def speed(*extra: str) -> dict:  # type: ignore[type-arg]
        host = ["--cpu-only", "--host-bandwidth", "90GB/s", "--host-ram", "64GiB", "--json"]
        r = CliRunner().invoke(app, ["plan", str(l8b.path), *host, *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["speed"]  # type: ignore[no-any-return]

    bare = speed()
    assert bare["pp"] is None and any("--host-cores" in u for u in bare["unknown"])
    four, eight = speed("--host-cores", "4")["pp"], speed("--host-cores", "8")["pp"]
    assert four is not None and eight is not None and eight > four
    assert speed("--host-cores", "8", "--", "-t", "4")["pp"] == pytest.approx(four)
    # the generation is the memory's: the same whatever the cores
    assert speed("--host-cores", "4")["tg"] == speed("--host-cores", "8")["tg"] == bare["tg"]
    # cores alone: a desktop's bandwidth assumed (a server's past 24 cores), and the plan says what narrows it
    for cores, kind in (("8", "desktop's"), ("64", "server's")):
        alone = CliRunner().invoke(app, ["plan", str(l8b.path), "--cpu-only", "--host-cores", cores, "--json"])
        assert alone.exit_code == 0, alone.output
        sp = json.loads(alone.stdout)["speed"]
        assert sp["tg"] is not None and sp["pp"] is not None
        assert any(f"a {kind} assumed" in u and "--host-bandwidth narrows it" in u for u in sp["unknown"])
