"""The speed model's structure (no timing here: bench/speed_model.py holds it to real numbers): more offload
never predicts faster generation, a larger ubatch never predicts slower prefill with experts in host memory,
the probe's rates reproduce the probe, and every input it reads back (cache, history, tune winners, --gpu)
is validated."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.cards import lookup
from llamafit.devices.described import described_gpu, described_gpus
from llamafit.devices.machine import Device, GpuProbeError, Host, Machine, PhysicalGpu, discover
from llamafit.devices.rates import Rates, nvml_rates, parse_rate
from llamafit.errors import UsageError
from llamafit.fit import Inputs, make_plan
from llamafit.fit.request import build_request
from llamafit.fit.speed import priced
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory.graph import replay
from llamafit.memory.placement import CPU
from llamafit.server.args import parse_server_args
from llamafit.serving.timings import TimingReader
from llamafit.speed import attention_run as ar
from llamafit.speed import prediction
from llamafit.speed import probe as pr
from llamafit.speed import probe_cache as pc
from llamafit.speed import probe_models as pm
from llamafit.speed.bench import bench_flags, parse_jsonl
from llamafit.speed.calibrate import correction
from llamafit.speed.priors import PRIORS
from llamafit.speed.work import Load, evaluate, is_expert
from llamafit.units import GiB
from tests import factory

HOST = Host(total=128 * GiB, available=120 * GiB)
# a host and a card as a probe would measure them: the card streams 10x faster
HOST_RATES = Rates(read=20e9, matmul=200e9, attention=5e9, attention_batch=100e9, node=1e-6, token=2e-5)
GPU_RATES = Rates(read=200e9, matmul=20e12, attention=150e9, attention_batch=5e12, node=2e-6, split=2e-5, link=25e9)


def plan(model: ModelInfo, args: list[str], gpus: tuple[Device, ...] = (factory.gpu(0, 24),)):  # type: ignore[no-untyped-def]
    rates = {CPU: HOST_RATES, **{g.id: GPU_RATES for g in gpus}}
    return priced(
        make_plan(model, Machine(gpus, HOST), build_request(parse_server_args(args)), inputs=Inputs(rates=rates)), rates
    )


def test_more_layers_on_the_host_never_predict_faster_generation(l8b: ModelInfo) -> None:
    tg = [plan(l8b, ["-c", "8192", "-ngl", str(n)]).speed.tg for n in (33, 30, 24, 16, 8, 0)]
    assert all(t is not None for t in tg)
    assert tg == sorted(tg, reverse=True) and tg[0] > 3 * tg[-1], tg


def test_more_experts_on_the_host_never_predict_faster_generation(moe: ModelInfo) -> None:
    tg = [plan(moe, ["-c", "8192", "--n-cpu-moe", str(n)]).speed.tg for n in (0, 4, 8, 16)]
    assert tg == sorted(tg, reverse=True) and tg[0] > tg[-1], tg


def test_each_visit_to_a_card_costs_one_synchronisation(moe: ModelInfo) -> None:
    """Experts on the host: the token goes to the card and back for every such layer. The probe times a whole
    visit (inputs set, graph launched, output waited for) as the card's split, so the way back is only bytes."""
    p = plan(moe, ["-c", "8192", "--n-cpu-moe", "4"])
    rates = {CPU: HOST_RATES, "CUDA0": replace(GPU_RATES, split=1e-3, link=None)}
    free = {CPU: HOST_RATES, "CUDA0": replace(GPU_RATES, split=0.0, link=None)}
    slow, fast = priced(p, rates).speed, priced(p, free).speed
    assert slow.tg and fast.tg and slow.splits > 4
    # the host's input, then back from each of 4 layers' experts, then the output on the card: odd boundaries
    visits = (slow.splits + 1) // 2
    assert 1 / slow.tg - 1 / fast.tg == pytest.approx(visits * 1e-3, rel=1e-6)


def test_a_cards_first_visit_costs_its_split_and_each_further_one_its_visit(moe: ModelInfo) -> None:
    """The probe times a token's first visit to a device (its inputs, graph and output crossing: on loopback RPC
    2.4-2.8 ms) apart from a further one within the same evaluation (0.1-0.4 ms): each is charged as timed."""
    p = plan(moe, ["-c", "8192", "--n-cpu-moe", "4"])
    card = replace(GPU_RATES, split=1e-3, visit=1e-4, link=None)
    free = {CPU: HOST_RATES, "CUDA0": replace(card, split=0.0, visit=0.0)}
    slow, fast = priced(p, {CPU: HOST_RATES, "CUDA0": card}).speed, priced(p, free).speed
    assert slow.tg and fast.tg and slow.splits > 4
    visits = (slow.splits + 1) // 2
    assert 1 / slow.tg - 1 / fast.tg == pytest.approx(1e-3 + (visits - 1) * 1e-4, rel=1e-6)
    # behind RPC each tensor read back is a round trip: the 4 layers' host experts read the router's rows, chosen
    # experts and weights, two more than a layer split's one
    remote = priced(p, {CPU: HOST_RATES, "CUDA0": replace(card, readback=1e-4)}).speed
    assert remote.tg and 1 / remote.tg - 1 / slow.tg == pytest.approx(4 * 2 * 1e-4, rel=1e-6)


def test_a_ubatch_is_sent_only_the_host_experts_it_routes_to(moe: ModelInfo) -> None:
    """Op offload copies, of an expert tensor in host memory, the experts the ubatch's tokens use and no others
    (ggml-backend.cpp:1849-1935): 32 tokens of 8 experts each reach 1 - (120/128)^32 of 128."""
    fp = plan(moe, ["-c", "8192", "--n-cpu-moe", "16", "-ub", "32"]).footprint
    host = sum(p.tensor.info.nbytes for p in fp.placement.tensors if p.device == CPU and is_expert(p.tensor))
    assert host > 0  # the rest of the host's weights is the input embedding, read by rows, never sent

    def sent(tokens: int) -> float:
        ev = evaluate(Load(moe, fp.placement, fp.context, True, ("CUDA0",)), tokens=tokens, depth=0)
        return ev.devices["CUDA0"].copied_in

    assert sent(32) == pytest.approx(host * (1 - (120 / 128) ** 32), rel=1e-9)
    assert sent(2048) == pytest.approx(host, rel=1e-9) and sent(16) == 0.0  # under 32 tokens the host runs them


def test_a_larger_ubatch_never_predicts_slower_prefill_with_experts_on_the_host(moe: ModelInfo) -> None:
    # op offload copies the host's experts a ubatch uses (nearly all of them) to the card once per ubatch: fewer,
    # larger ubatches win
    pp = [plan(moe, ["-c", "8192", "--n-cpu-moe", "16", "-ub", str(u), "-b", "2048"]) for u in (256, 512, 1024, 2048)]
    rates = [p.speed.pp for p in pp]
    assert all(r is not None for r in rates)
    assert rates == sorted(rates) and rates[-1] > 1.5 * rates[0], rates


def test_unlike_cards_get_the_split_predicted_fastest_and_like_cards_keep_theirs(l8b: ModelInfo) -> None:
    slow, fast = described_gpu("12GiB@rtx-3060", 0), described_gpu("12GiB@rtx-4090", 1)
    rates = {CPU: HOST_RATES, "CUDA0": Rates(read=slow.bandwidth), "CUDA1": Rates(read=fast.bandwidth)}
    p = make_plan(
        l8b, Machine((slow, fast), HOST), build_request(parse_server_args(["-c", "65536"])), inputs=Inputs(rates=rates)
    )
    d = p.decision("placement.speed")
    assert d is not None and p.fits
    counts = p.settings.tensor_split
    assert counts[1] > counts[0] and "against" in d.message
    assert all(dev.use.total <= dev.usable for dev in p.devices)
    same = {CPU: HOST_RATES, "CUDA0": Rates(read=1e12), "CUDA1": Rates(read=1e12)}
    p2 = make_plan(
        l8b, Machine((slow, fast), HOST), build_request(parse_server_args(["-c", "65536"])), inputs=Inputs(rates=same)
    )
    assert p2.decision("placement.speed") is None
    pinned = make_plan(
        l8b,
        Machine((slow, fast), HOST),
        build_request(parse_server_args(["-c", "65536", "-ts", "1,1"])),
        inputs=Inputs(rates=rates),
    )
    assert pinned.decision("placement.speed") is None


def test_a_deeper_cache_never_predicts_faster_generation(l8b: ModelInfo) -> None:
    sp = plan(l8b, ["-c", "65536"]).speed
    assert sp.at_context is not None and sp.at_context[2] < sp.tg


def test_the_plan_json_states_its_speed(l8b: ModelInfo) -> None:
    from llamafit.fit.plan import to_json

    doc = to_json(plan(l8b, ["-c", "8192"]), [])
    sp = doc["speed"]
    assert {"pp", "tg", "depth", "source"} <= set(sp) and sp["source"] == "estimated" and sp["depth"] == 0
    assert sp["tg"] > 0 and sp["pp"] > 0 and sp["devices"][0]["id"] == "CUDA0"


def test_a_card_without_a_bandwidth_gets_an_assumed_range_and_how_to_narrow_it(l8b: ModelInfo) -> None:
    """No plan without a speed: a card described by its size alone is taken for the table's cards of about its
    memory, their bandwidths' range folded into the range the plan gives, and the plan says what narrows it."""
    r = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "24GiB", "--json"])
    sp = json.loads(r.stdout)["speed"]
    assert sp["source"] == "estimated" and sp["tg"] is not None
    lo, hi = sp["tg_range"]
    assert lo < sp["tg"] < hi and hi / lo > 3  # wide: nobody said which card
    assert any("bandwidth not known" in u and "--gpu SIZE@RATE" in u for u in sp["unknown"])
    assert any("host: bandwidth not known" in u and "--host-bandwidth" in u for u in sp["unknown"])
    r = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "rtx-4090", "--json"])
    sp = json.loads(r.stdout)["speed"]
    # a named card's published peaks with CUDA's priors: generation below every weight but the embedding rows
    # at the share of 1008 GB/s a mat-vec streams at (the fixed costs come on top), a prefill from its FP16
    # throughput, each with the range the priors held
    streamed = l8b.tensor_bytes - next(t.info.nbytes for t in l8b.tensors if t.name == "token_embd.weight")
    cuda = PRIORS["CUDA"]
    assert sp["source"] == "estimated" and sp["tg"] < cuda.stream_quant * 1008e9 / streamed
    assert sp["tg"] > 0.5 * cuda.stream_quant * 1008e9 / streamed
    assert sp["pp"] > 0 and sp["devices"][0]["rates"] == "prior"
    for k in ("tg", "pp"):
        lo, hi = sp[f"{k}_range"]
        assert lo < sp[k] < hi
    assert any("CUDA priors" in u for u in sp["unknown"])


def test_a_card_given_by_its_bandwidth_alone_gets_an_assumed_prefill(l8b: ModelInfo) -> None:
    """No plan without a speed, prefill included: a card described by its rate alone computes like the table's
    cards of about its bandwidth, their FP16 range folded into the prefill's range, and the plan says so."""
    r = CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "24GiB@1008GB/s", "--json"])
    sp = json.loads(r.stdout)["speed"]
    assert sp["pp"] is not None and sp["tg"] is not None
    lo, hi = sp["pp_range"]
    assert lo < sp["pp"] < hi and hi / lo > 3  # nobody said which card computes behind that bandwidth
    said = [u for u in sp["unknown"] if u.startswith("not measured: CUDA0")]
    assert said and "FP16 not known" in said[0] and "a card's name narrows it" in said[0]
    # the named card of that bandwidth: its own FP16, no assumption said, a narrower prefill range
    named = json.loads(CliRunner().invoke(app, ["plan", str(l8b.path), "--gpu", "24GiB@rtx-4090", "--json"]).stdout)
    nlo, nhi = named["speed"]["pp_range"]
    assert not any("FP16 not known" in u for u in named["speed"]["unknown"]) and nhi / nlo < hi / lo


def test_gpu_descriptions_carry_bandwidths_and_card_names() -> None:
    d = described_gpu("20GiB@rtx-4090", 0)
    assert (d.free, d.total, d.bandwidth, d.bandwidth_source) == (20 * GiB, 24 * GiB, 1008e9, "table")
    d = described_gpu("24GiB/24GiB@1.5TB/s", 1)
    assert d.id == "CUDA1" and d.bandwidth == 1.5e12 and d.bandwidth_source == "given"
    assert described_gpu("h100-sxm", 0).total == 80 * GiB
    for bad in ("24GiB@rtx9999", "m4-max", "30GiB@rtx-4090", "24GiB@0GB/s", "24GiB@fastGB/s"):
        with pytest.raises(UsageError):
            described_gpu(bad, 0)
    assert lookup("NVIDIA GeForce RTX 3080 Ti") is None  # not an RTX 3080
    assert lookup("AMD Radeon RX 7900 XTX (RADV NAVI31)").name == "RX 7900 XTX"  # type: ignore[union-attr]
    # AMD's workstation and Instinct cards by the names users type and ROCm lists them with
    for name, memory in (("r9700", 32), ("AMD Radeon AI PRO R9700", 32), ("AMD Instinct MI50", 32),
                         ("mi50-16gb", 16), ("w7900", 48), ("AMD Instinct MI210", 64)):  # fmt: skip
        g = lookup(name)
        assert g is not None and g.backend == "ROCm" and g.memory == memory * GiB, name
    with pytest.raises(UsageError):
        parse_rate("1008", "--host-bandwidth")


class Nvml:
    def __init__(self, gpus: list[PhysicalGpu]) -> None:
        self._gpus = gpus

    def gpus(self) -> list[PhysicalGpu]:
        if not self._gpus:
            raise GpuProbeError("no driver")
        return self._gpus


def test_nvml_gives_a_card_its_peak_bandwidth_and_pcie_link() -> None:
    g = PhysicalGpu(0, "NVIDIA GeForce RTX 4090", "GPU-1", 24 * GiB, 23 * GiB, 384, 10501, 4, 16)
    m = discover(probe=Nvml([g]), environ={}, host=HOST)
    d = m.gpus[0]
    assert abs(d.bandwidth - 1008.1e9) < 1e9 and d.bandwidth_source == "nvml"
    assert abs(d.link - 16 * 1969.2e6) < 1e6
    blank = discover(probe=Nvml([replace(g, mem_bus_width=0)]), environ={}, host=HOST).gpus[0]
    assert blank.bandwidth == 0  # a query the driver does not answer is not a number
    assert nvml_rates(0, 10501) is None


def _timings_of(rates: Rates, host: Rates | None, layer_nodes: float, twin: pm.Twin, attn: pm.Twin) -> pr.Timings:
    """What the probe would time on a device with these rates, by the speed model's own accounting."""
    over = (host.token if host else rates.token) + rates.split

    def run(tw: pm.Twin, seconds: float) -> float:
        return over + (tw.n_layer * (layer_nodes + tw.extra_nodes) + pr.FIXED_NODES) * rates.node + seconds

    t1 = run(pm.TINY, 0)
    t9 = run(pm.TINY9, 0)
    twin_tg = run(twin, pm.streamed_bytes(twin) / rates.read)
    own = 2.0 * twin.n_head * (twin.head_k + twin.head_v) * 512 * 513 / 2 * twin.n_layer
    twin_pp = run(twin, pm.matmul_flops(twin, 512) / (rates.matmul or 1) + own / (rates.attention_batch or 1))
    kv = (attn.head_k + attn.head_v) * attn.n_head_kv * 2.0 * attn.n_layer * 1024
    tg0 = run(attn, 0.001)
    pp0 = run(attn, 0.05)
    ppd = pp0 + 2.0 * attn.n_head * (attn.head_k + attn.head_v) * 512 * 1024 * attn.n_layer / (
        rates.attention_batch or 1
    )
    off = twin_pp + pm.ffn_copied(twin, 512) / rates.link if host and rates.link else None
    # tiny-9 with VISITS round trips to the host: each a visit to the device and the host's attention output
    wo = pm.TINY9.n_head * pm.TINY9.head_v * pm.TINY9.n_embd * 2
    trip = (rates.visit or 0.0) + (host.node + wo / host.read_rate("f16") if host else 0.0)
    visited = t9 + pr.VISITS * trip if host and rates.visit is not None else None
    return pr.Timings(
        t1, t9, {}, twin_tg, twin_pp, 512, tg0, tg0 + kv / (rates.attention or 1), pp0, ppd, 1024, off, t9, visited
    )


def test_the_probe_derives_the_rates_that_reproduce_it(l8b: ModelInfo) -> None:
    twin, attn = pm.twin_of(l8b), pm.attention_twin(l8b)
    assert twin is not None and attn is not None
    assert twin.n_embd == 4096 and twin.n_head_kv == 8 and twin.type_of("ffn_down") in ("q4_K", "q6_K")
    host = pr.derive(_timings_of(HOST_RATES, None, 19, twin, attn), host=None, node_layer=19, twin=twin, attn=attn)
    for field in ("node", "token", "matmul", "attention", "attention_batch"):
        assert getattr(host, field) == pytest.approx(getattr(HOST_RATES, field), rel=0.02), field
    # the same generation in FLOPs: 32 query heads over 8 KV heads, each a dot product and a multiply-add over a
    # cached cell's 128-wide f16 K and V rows (4 FLOPs a K or V element and query head, 2 bytes: 4 a byte)
    assert host.vector == pytest.approx(4 * (HOST_RATES.attention or 0), rel=0.02)
    assert host.read_rate(twin.type_of("ffn_up")) == pytest.approx(HOST_RATES.read, rel=0.02)
    dev = pr.derive(_timings_of(GPU_RATES, HOST_RATES, 19, twin, attn), host=host, node_layer=19, twin=twin, attn=attn)
    assert dev.split == pytest.approx(GPU_RATES.split, rel=0.05) and dev.node == pytest.approx(GPU_RATES.node, rel=0.02)
    assert dev.link == pytest.approx(GPU_RATES.link, rel=1e-6)
    assert dev.visit is None  # not timed: each visit is priced as a split
    card = replace(GPU_RATES, visit=3e-6)
    dev = pr.derive(_timings_of(card, HOST_RATES, 19, twin, attn), host=host, node_layer=19, twin=twin, attn=attn)
    assert dev.visit == pytest.approx(3e-6, rel=0.05) and dev.split == pytest.approx(GPU_RATES.split, rel=0.05)
    assert dev.readback == 0.0  # a local device's copies follow the synchronisation
    rpc = pr.derive(
        _timings_of(card, HOST_RATES, 19, twin, attn), host=host, node_layer=19, twin=twin, attn=attn, remote=True
    )
    assert rpc.readback == dev.visit  # a round trip a tensor, as the visit timed with one
    # a plan on offload devices alone measures only the host's overheads: no streaming rate to price its part by
    bare = replace(host, read=0.0, read_by_type=())
    timed = _timings_of(card, HOST_RATES, 19, twin, attn)
    alone = pr.derive(timed, host=bare, node_layer=19, twin=twin, attn=attn)
    assert alone.visit is not None and alone.visit >= dev.visit


def test_a_one_layer_run_slower_than_the_nine_layer_one_does_not_set_the_split() -> None:
    """tiny-9 holds everything tiny-1 does and eight layers more: a tiny-1 slower than it was held up (loopback
    RPC's round trips scatter 2x), and the split is what tiny-9 leaves, not what tiny-1 does."""
    host = Rates(read=20e9, node=1e-6, token=2e-5)
    steady = pr.derive(pr.Timings(1.0e-3, 1.2e-3, {}), host=host, node_layer=19, twin=None, attn=None)
    held = pr.derive(pr.Timings(1.8e-3, 1.1e-3, {}), host=host, node_layer=19, twin=None, attn=None)
    assert steady.node == pytest.approx(0.2e-3 / (8 * 19)) and held.node == 0.0
    assert steady.split == pytest.approx(1.0e-3 - (19 + pr.FIXED_NODES) * steady.node - 2e-5)
    assert held.split == pytest.approx(1.1e-3 - 2e-5)


def test_a_model_that_normalises_each_head_is_measured_on_a_twin_that_does(tmp_path: Path, l8b: ModelInfo) -> None:
    """Qwen3's per-head q/k norms are rows a device pays for (a lavapipe device about a millisecond each): its
    twin carries them, as a qwen3 layer, and the node count the probe subtracts is that graph's."""
    model = load_model(str(factory.moe(n_expert=16, n_expert_used=4).write(tmp_path / "m.gguf")))
    twin = pm.twin_of(model)
    assert twin is not None and twin.qk_norm and twin.arch == "qwen3moe"
    plain = replace(twin, name="plain", qk_norm=False)
    assert plain.key != twin.key and plain.arch == "llama"
    written = load_model(str(pm.ensure(twin, tmp_path)))
    assert written.arch == "qwen3moe" and "blk.0.attn_q_norm.weight" in {t.name for t in written.tensors}
    llama = load_model(str(pm.ensure(plain, tmp_path)))
    assert replay.nodes_per_layer(written) - replay.nodes_per_layer(llama) == twin.extra_nodes
    assert (other := pm.twin_of(l8b)) is not None and not other.qk_norm and other.arch == "llama"


def test_a_damaged_probe_cache_is_not_read(tmp_path: Path) -> None:
    good = pr.Timings(1e-4, 2e-4, {"q8_0": 0.02}, 0.01, 0.5, 512, 0.001, 0.01, 0.1, 0.2, 1024, None, 2e-4, 3e-4)
    pc.write_cache(tmp_path, {"k": good})
    assert pc.timings_from(pc.read_cache(tmp_path)["k"]) == good
    for bad in (
        {"tiny1": -1, "tiny9": 1},
        {"tiny1": 1e-4, "tiny9": "x"},
        {"tiny1": 1e-4, "tiny9": 2e-4, "stream": {"q8_0": 0}},
        {"tiny1": 1e-4, "tiny9": 2e-4, "twin_tg": True},
        {"tiny1": 1e-4, "tiny9": 2e-4, "prompt": 1.5},
        {"tiny1": 1e-4, "tiny9": 2e-4, "visited": -3e-4},
    ):
        assert pc.timings_from(bad) is None, bad
    (tmp_path / "rates.json").write_text("[not the cache")
    assert pc.read_cache(tmp_path) == {}


def test_a_damaged_probe_model_or_demo_model_is_written_again(tmp_path: Path) -> None:
    """The probe's twins and the demo model are files llamafit wrote earlier: one cut short or overwritten is
    written again (before, a damaged twin failed every measurement: "llama-bench exited 1: failed to load")."""
    from llamafit.gguf.demo_model import ensure_demo_model

    twin = pm.stream("q8_0")
    for make in (lambda: pm.ensure(twin, tmp_path), lambda: ensure_demo_model(tmp_path)):
        path = make()
        good = path.read_bytes()
        mtime = path.stat().st_mtime_ns
        assert make() == path and path.stat().st_mtime_ns == mtime  # intact: kept, not written again
        for damage in (good[: len(good) // 2], b"", b"{not a gguf", good[:-1]):
            path.write_bytes(damage)
            assert make() == path and path.read_bytes() == good, len(damage)
            assert load_model(str(path)).tensors


def test_a_probe_that_ran_out_of_time_rests_an_hour_one_that_failed_a_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = {"late": ("did not finish within 9 s", True, 10.0), "broke": ("exit 1", False, 10.0)}
    # one that ran out of what the devices measured before it left: the next plan gives it their time
    failed["after"] = ("the time given to measuring ran out", True, 2.0)
    pc.write_cache(tmp_path, {}, failed)
    cache = pc.read_cache(tmp_path)
    assert pc.failed_before(cache, "late", 10.0) and pc.failed_before(cache, "broke", 10.0)
    assert pc.failed_before(cache, "after", 10.0) is None and pc.failed_before(cache, "after", 4.0)
    assert pc.failed_before(cache, "late", 60.0) is None  # more time (tune) tries it now
    now = pc.time.time()
    monkeypatch.setattr(pc.time, "time", lambda: now + pc.OUT_OF_TIME_FOR + 1)
    assert pc.failed_before(cache, "late", 10.0) is None and pc.failed_before(cache, "broke", 10.0) == "exit 1"


def test_the_attention_run_is_sized_to_the_time_a_plan_has_left(tmp_path: Path) -> None:
    """A host at one thread (this machine's rates for Qwen3-0.6B's twin: 45 ms a token, a 160-token prompt in
    1.8 s): a 1024-deep cache would take longer than the plan has left, so the attention run is measured at a
    shallower depth, and at none when even the shallowest would not fit (a later plan measures it with its own
    time); a fast host gets the deepest."""
    q06 = load_model(str(factory.qwen3_0_6b().write(tmp_path / "q06.gguf")))
    twin, attn = pm.twin_of(q06), pm.attention_twin(q06)
    assert twin is not None and attn is not None
    prompt = 160

    def depth(left: float, tg: float, pp: float, most: int = ar.DEPTH_PLAN) -> int:
        return ar.attention_depth(ar.Sizing(attn, twin, tg, pp, prompt, most), left)

    assert depth(10.0, 0.004, 0.05) == 1024
    assert 0 < depth(10.0, 0.045, 1.8) < 1024
    assert depth(2.0, 0.045, 1.8) == 0
    # with the time (tune's), as deep as the plan's cache goes: 2048 of a 3000-cell context, 4096 at most
    assert depth(600.0, 0.004, 0.05, most=3000) == 2048
    assert depth(600.0, 0.004, 0.05, most=65536) == ar.DEPTHS[0] == 4096
    assert depth(600.0, 0.08, 3.2, most=65536) == 256  # a slow device: shallow whatever its time
    # without a deadline, still one of the depths: never a run at the context itself
    unlimited = ar.Sizing(attn, twin, 0.004, 0.05, prompt, 40960)
    assert ar.attention_depth(unlimited, None) == ar.DEPTHS[0]
    assert ar.attention_depth(ar.Sizing(attn, twin, 0.004, 0.05, prompt, 3000), None) == 2048


def test_an_unmeasured_host_reads_the_cache_once_for_each_query_head(l8b: ModelInfo) -> None:
    """ggml-cpu's decode attention visits a KV head's cells for every query head of its group: unmeasured, the
    host's attention is priced on those reads (Llama-3.1-8B: 32 query heads over 8 KV heads, 4x the cache); a
    card's on the cache once, and a measured rate (of the model's own heads) on the cache."""
    fp = plan(l8b, ["-c", "8192", "-ngl", "0"]).footprint
    ev = evaluate(Load(l8b, fp.placement, fp.context, True, ()), tokens=1, depth=4096)
    w = ev.devices[CPU]
    assert w.kv_head_reads == pytest.approx(4 * w.kv_bytes)
    unmeasured = Rates(read=20e9)
    cpu = prediction._attention_time(w, unmeasured, 1, False, cpu=True)
    card = prediction._attention_time(w, unmeasured, 1, False, cpu=False)
    assert cpu == pytest.approx(4 * card) and card == pytest.approx(w.kv_bytes / 20e9)
    measured = prediction._attention_time(w, HOST_RATES, 1, False, cpu=True)
    assert measured == pytest.approx(w.kv_bytes / (HOST_RATES.attention or 1))


def test_a_layer_that_reads_an_earlier_layers_cache_attends_over_it(tmp_path: Path) -> None:
    """Gemma 4's last layers have no cache of their own and attend over an earlier layer's
    (llama-model.cpp:2796-2805): at depth their attention costs what it would over a cache of their own."""
    evals = []
    for shared in (0, 5):
        shape = factory.gemma4(per_layer=0, shared_kv=shared)
        model = load_model(str(shape.write(tmp_path / f"gemma4-{shared}.gguf")))
        fp = plan(model, ["-c", "8192", "-ngl", "0"]).footprint
        evals.append(evaluate(Load(model, fp.placement, fp.context, True, ()), tokens=1, depth=4096).devices[CPU])
    own, reused = evals
    assert reused.attn_layers == own.attn_layers == 10
    assert reused.kv_bytes == pytest.approx(own.kv_bytes) and reused.attn_flops == pytest.approx(own.attn_flops)


def test_a_recurrent_layer_updates_its_state_once_for_each_token(tmp_path: Path) -> None:
    """A gated delta net's scan spends 7 FLOPs a state element and token (ggml-cpu/ops.cpp:11230-11260), Mamba-2's
    5 (ggml-cpu/ops.cpp:10122-10131), on the device that holds the layer; priced at the rate the device's attention
    ran over its cache (the same kind of loop), else its matmul rate: a prompt's updates are sequential."""
    for shape, per, n_rec in (
        (factory.qwen35(name="gdn", n_layer=8, interval=4), 7, 6),
        (factory.mamba2(name="m2", n_layer=4), 5, 4),
    ):
        model = load_model(str(shape.write(tmp_path / f"{shape.arch}.gguf")))
        fp = plan(model, ["-c", "4096", "-ngl", "0"]).footprint
        load = Load(model, fp.placement, fp.context, True, ())
        one, many = (evaluate(load, tokens=n, depth=0).devices[CPU] for n in (1, 512))
        state = model.hparams.n_embd_s()
        assert one.recurrent_flops == per * state * n_rec and many.recurrent_flops == 512 * one.recurrent_flops
        ev = evaluate(load, tokens=512, depth=0)
        slow, fast = replace(HOST_RATES, vector=1e9), replace(HOST_RATES, vector=None)
        took = prediction.evaluation_time(ev, {CPU: slow}).total - prediction.evaluation_time(ev, {CPU: fast}).total
        assert took == pytest.approx(many.recurrent_flops * (1 / 1e9 - 1 / (HOST_RATES.matmul or 1)))
    dense = load_model(str(factory.dense(name="dense").write(tmp_path / "dense.gguf")))
    fp = plan(dense, ["-c", "4096", "-ngl", "0"]).footprint
    ev = evaluate(Load(dense, fp.placement, fp.context, True, ()), tokens=512, depth=0)
    assert ev.devices[CPU].recurrent_flops == 0


def test_a_plan_with_more_time_times_attention_at_a_deeper_cache(tmp_path: Path) -> None:
    """A cache timed at 256 cells (all a plan had time for at one thread) is timed again, deeper, by a plan with
    the time for it (tune's); one already at the deepest, or a plan without the time, keeps what is cached. A
    plan with too little time for the whole run times the generation alone, and a later one the prompts."""
    q06 = load_model(str(factory.qwen3_0_6b().write(tmp_path / "q06.gguf")))
    twin, attn = pm.twin_of(q06), pm.attention_twin(q06)
    assert twin is not None and attn is not None
    shallow = pr.Timings(1e-4, 2e-4, {}, 0.045, 1.8, 160, 0.01, 0.02, 0.1, 0.2, 256)
    assert not ar.attention_wanted(shallow, attn, twin, 10.0)
    assert ar.attention_wanted(shallow, attn, twin, 60.0)
    assert not ar.attention_wanted(replace(shallow, depth=ar.DEPTH_PLAN), attn, twin, 600.0)
    assert ar.attention_wanted(replace(shallow, twin_tg=0.004, twin_pp=0.05, depth=1024), attn, twin, 600.0, 4096)
    assert ar.attention_wanted(replace(shallow, attn_tgd=None, depth=0), attn, twin, 10.0)
    # a first plan with 3 s left: no time for the prompts at depth, time for the generation
    sizing = ar.Sizing(attn, twin, 0.045, 1.8, 160)
    run = ar.attention_run(sizing, 3.0, ar.Had())
    assert run is not None and run[0] > 0 and not run[1]
    untimed_prompts = replace(shallow, attn_pp0=None, attn_ppd=None)
    assert ar.attention_wanted(untimed_prompts, attn, twin, 10.0)  # the whole run at 256 fits a plan
    assert not ar.attention_wanted(untimed_prompts, attn, twin, 3.0)  # and nothing more a plan without time
    assert ar.attention_run(sizing, 3.0, ar.Had(256, False)) is None


def test_a_context_full_speed_says_when_its_attention_was_not_measured(l8b: ModelInfo) -> None:
    """A host measured without its attention run (the plan had no time left for it) is priced on its prior at
    depth, and the plan says so and what measures it; once timed, it does not."""
    timed = replace(HOST_RATES, source="measured", label="measured")
    untimed = replace(timed, attention=None, attention_batch=None)

    def unknown(host: Rates) -> list[str]:
        rates = {CPU: host}
        request = build_request(parse_server_args(["-c", "8192", "-ngl", "0"]))
        p = priced(make_plan(l8b, Machine((), HOST), request, inputs=Inputs(rates=rates)), rates)
        assert p.speed is not None and p.speed.at_context is not None
        return [u for u in p.speed.unknown if "attention over a filled cache" in u]

    said = unknown(untimed)
    assert len(said) == 1 and "host's attention" in said[0] and "llamafit tune" in said[0]
    assert unknown(timed) == []


def test_llama_bench_gets_the_planned_placement() -> None:
    argv = [
        "-m",
        "m.gguf",
        "-c",
        "4096",
        "-ngl",
        "all",
        "-ts",
        "13,8",
        "-ot",
        r"blk\.1\.ffn_down_exps=CPU",
        "--n-cpu-moe",
        "3",
        "-fit",
        "off",
        "-nr",
        "-ub",
        "1024",
        "-dev",
        "RPC0,RPC1",
        "-nkvo",
        "-t",
        "4",
    ]
    f = bench_flags(argv)
    pairs = dict(zip(f[::2], f[1::2], strict=True))
    assert pairs == {
        "-ub": "1024",
        "-t": "4",
        "-ncmoe": "3",
        "-ngl": "999",
        "-ts": "13/8",
        "-dev": "RPC0/RPC1",
        "-ot": r"blk\.1\.ffn_down_exps=CPU",
        "-nkvo": "1",
        "--repack": "0",
    }


def test_llama_bench_output_is_read_line_by_line() -> None:
    ok = {
        "model_filename": "m.gguf",
        "n_prompt": 512,
        "n_gen": 0,
        "n_depth": 0,
        "n_ubatch": 512,
        "avg_ns": 2e9,
        "avg_ts": 256.0,
    }
    text = "\n".join([json.dumps(ok), "progress...", json.dumps({**ok, "avg_ns": -1}), '{"truncated": '])
    got = parse_jsonl(text)
    assert len(got) == 1 and got[0].seconds == 2.0 and got[0].per_token == 2.0 / 512
    assert got[0].overrides == "none"  # a run without -ot prints no overrides
    pattern = r"blk\.[1-8]\.attn_output=CPU"
    pair = [{**ok, "tensor_buft_overrides": "none"}, {**ok, "tensor_buft_overrides": pattern}]
    assert [r.overrides for r in parse_jsonl("\n".join(map(json.dumps, pair)))] == ["none", pattern]


SERVER_LINES = """\
slot launch_slot_: id  0 | task 0 | processing task
slot update_slots: id  0 | task 0 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 40
slot print_timing: id  0 | task 0 | prompt eval time =     121.30 ms /    18 tokens (    6.74 ms per token,   148.39 tokens per second)
slot print_timing: id  0 | task 0 |        eval time =    1391.11 ms /    32 tokens (   43.47 ms per token,    23.00 tokens per second)
slot print_timing: id  0 | task 0 |       total time =    1512.41 ms /    50 tokens
slot print_timing: id  0 | task 0 | draft acceptance rate = 0.62500 (   20 accepted /    32 generated)
"""  # noqa: E501


def test_the_servers_timings_are_read_as_they_come() -> None:
    r = TimingReader()
    got = [s for line in SERVER_LINES.splitlines() if (s := r.feed("0.01.123.456 I " + line))]
    assert len(got) == 1
    s = r.served[0]
    assert (s.prompt_tokens, s.gen_tokens, s.prompt_total, s.acceptance) == (18, 32, 40, 0.625)
    assert s.pp == pytest.approx(148.39, rel=1e-3) and s.tg == pytest.approx(23.0, rel=1e-3) and s.depth == 56


def _record(key: str, served: list[object], when: str = "2026-12-01") -> dict[str, object]:
    return {"time": when, "model": {"name": "m"}, "speed": {"key": key, "served": served}}


def test_a_launchs_speed_corrects_the_next_plan_unless_it_is_not_sane() -> None:
    s = {
        "gen_tokens": 64,
        "tg_measured": 20.0,
        "tg_predicted": 25.0,
        "prompt_tokens": 512,
        "pp_measured": 100.0,
        "pp_predicted": 100.0,
    }
    c = correction([_record("k", [s])], "k")
    assert c.tg == pytest.approx(1.25) and c.pp == pytest.approx(1.0) and "m" in c.source
    assert correction([_record("other", [s])], "k").empty
    poisoned = [
        {**s, "tg_measured": 1.0},
        {**s, "tg_measured": "fast"},
        {**s, "gen_tokens": 2},
        {**s, "tg_measured": -5},
    ]
    for bad in poisoned:
        c = correction([_record("k", [{**bad, "prompt_tokens": 0}])], "k")
        assert c.tg == 1.0, bad
    assert correction([_record("k", "not a list")], "k").empty  # type: ignore[arg-type]
    r = Rates(read=10e9, matmul=1e11, node=1e-6).calibrated(1.25, 1.0)
    assert r.read == pytest.approx(8e9) and r.node == pytest.approx(1.25e-6) and r.matmul == pytest.approx(1e11)


def test_drafter_decisions_say_what_they_mean_for_speed(tmp_path: Path) -> None:
    """With a speed model, a drafter decision states the target's predicted generation and that drafting's
    gain is not known before it is measured (no speed-up is claimed)."""
    target = factory.dense(name="target", n_layer=8, n_embd=1024, n_ff=2816, n_vocab=32000).write(tmp_path / "t.gguf")
    draft = factory.dense(name="draft", n_layer=2, n_embd=256, n_vocab=32000).write(tmp_path / "d.gguf")
    r = CliRunner().invoke(app, ["plan", str(target), "--draft", str(draft), "--gpu", "24GiB@1008GB/s",
                                 "--host-bandwidth", "80GB/s", "--json", "--", "-c", "4096"])  # fmt: skip
    doc = json.loads(r.stdout)
    d = next(d for d in doc["decisions"] if d["code"] == "speculative.drafter")
    assert f"predicted at {doc['speed']['tg']:.1f} tok/s" in d["message"] and "not known" in d["message"]


def test_nodes_per_layer_do_not_depend_on_what_was_built_before(l8b: ModelInfo, moe: ModelInfo) -> None:
    """The speed model's nodes per layer are counted on one stated graph (one token, the plan's flash attention):
    the same on a fresh model and on one whose plan built other graphs first (``-fa off`` first, then on); without
    flash attention a layer's attention is more nodes."""
    machine = Machine(tuple(described_gpus(["rtx-4090", "rtx-4090"])), Host(total=256 * GiB, available=240 * GiB))
    for m in (l8b, moe):
        fresh = {fa: replay.nodes_per_layer(load_model(m.path), fa) for fa in (True, False)}
        assert fresh[True] is not None and fresh[False] is not None and fresh[False] > fresh[True]
        used = load_model(m.path)
        for fa in ("off", "on"):
            make_plan(used, machine, build_request(parse_server_args(["-c", "4096", "-fa", fa])))
        assert {fa: replay.nodes_per_layer(used, fa) for fa in (True, False)} == fresh
