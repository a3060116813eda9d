"""-sm tensor's memory (llamafit.memory.tensor_split): the Meta device's cuts, and real llama-servers whose Meta device
wraps two ggml-rpc-server devices on loopback, their buffers against the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.devices.described import described_gpus
from llamafit.devices.machine import Host, Machine
from llamafit.errors import UsageError
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory import tensor_split
from llamafit.memory.footprint import LoadSettings, estimate
from llamafit.options import Options
from llamafit.planning.planner import prepare
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.serving.compare import compare
from llamafit.units import GiB
from tests import factory
from tests.realserver import run_argv


def test_a_cut_rounds_down_to_its_granule_and_gives_the_rest_to_the_last_card() -> None:
    assert tensor_split.cut(4096, 128, [0.0, 0.0], 0) == [2048, 2048]  # no -ts: equal
    assert tensor_split.cut(1000, 128, [0.0, 0.0, 0.0], 0) == [256, 384, 360]  # 333 -> 256, 666 -> 640
    assert tensor_split.cut(4096, 128, [3.0, 1.0], 0) == [3072, 1024]
    # the rotation turns the order of the cards: the first in turn takes the split's first share and the rest
    assert tensor_split.cut(1000, 128, [1.0, 1.0], 0) == [384, 616]
    assert tensor_split.cut(1000, 128, [1.0, 1.0], 1) == [616, 384]
    assert sum(tensor_split.cut(151936, 1, [23.0, 15.0], 1)) == 151936


def test_a_cut_rounds_in_float32_as_llama_cpp_does() -> None:
    """The cut's float32 arithmetic (llama-model.cpp:833-857) without numpy, held to numpy's float32 on splits
    whose shares round differently in double: ``-ts`` fractions, odd ratios, many cards."""
    import random

    import numpy as np

    def by_numpy(ne: int, granule: int, split: list[float], rotation: int) -> list[int]:
        n = len(split)
        scan = np.cumsum(np.array([split[(j + rotation) % n] for j in range(n)], dtype=np.float32), dtype=np.float32)
        out, low = [0] * n, 0
        for j in range(n - 1):
            high = int(np.float32(ne) * scan[j] / scan[-1])
            high -= high % granule
            out[(j + rotation) % n] = high - low
            low = high
        out[(n - 1 + rotation) % n] = ne - low
        return out

    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(2, 8)
        split = [rng.choice([rng.random() * 100, float(rng.randint(1, 48)), rng.random() / 3]) for _ in range(n)]
        ne, granule, rot = (
            rng.choice([151936, 4096, 17408, 1000, 2**20 + 7]),
            rng.choice([1, 32, 128]),
            rng.randrange(n),
        )
        assert tensor_split.cut(ne, granule, split, rot) == by_numpy(ne, granule, split, rot), (ne, granule, split, rot)


def test_each_card_holds_its_slice_and_all_of_what_is_mirrored(l8b: ModelInfo) -> None:
    fp = estimate(l8b, LoadSettings(n_ctx=4096, split_mode="tensor", tensor_split=(3.0, 1.0)), ["CUDA0", "CUDA1"])
    one = estimate(l8b, LoadSettings(n_ctx=4096, split_mode="tensor"), ["CUDA0"])
    a, b, whole = fp.gpus["CUDA0"], fp.gpus["CUDA1"], one.gpus["CUDA0"]
    # the split weights 3:1, the mirrored ones (norms) on both: together a little over the one card's
    assert whole.model < a.model + b.model < whole.model * 1.01 and 2.9 < a.model / b.model < 3.1
    assert a.kv + b.kv == whole.kv and a.kv == 3 * b.kv  # the cache by heads
    assert a.compute == b.compute == whole.compute  # the one-device graph's buffer on every card
    assert a.overhead > whole.overhead  # and the reductions' buffers
    meta = [x for x in fp.buffers if x.buft == tensor_split.META]
    assert {x.kind for x in meta} == {"model", "kv", "compute"}
    assert next(x.nbytes for x in meta if x.kind == "model") == max(a.model, b.model)


def test_a_gated_delta_net_is_cut_by_key_heads(tmp_path: Path) -> None:
    # Qwen3.5's recurrent layers: Q/K/V channels and the states by key heads (128 channels a granule: two here), the
    # V heads each K head serves beside them; under -ts 3:1 a layer's cut rounds to 1:1 or, with the order of the
    # cards rotated on every other recurrent layer, 2:0, which over the layers is 3:1 (as a real server over two
    # Vulkan devices holds them: tests/test_vulkan.py)
    wide = load_model(factory.qwen35(n_embd=512, d_state=128, head_dim=128).write(tmp_path / "q35.gguf"))
    fp = estimate(wide, LoadSettings(n_ctx=4096, split_mode="tensor", tensor_split=(3.0, 1.0)), ["CUDA0", "CUDA1"])
    one = estimate(wide, LoadSettings(n_ctx=4096, split_mode="tensor"), ["CUDA0"])
    a, b, whole = fp.gpus["CUDA0"], fp.gpus["CUDA1"], one.gpus["CUDA0"]
    assert a.rs + b.rs == whole.rs and a.rs == 3 * b.rs
    assert {x.kind for x in fp.buffers if x.buft == tensor_split.META} == {"model", "kv", "rs", "compute"}


def test_the_fit_splits_each_layer_by_the_cards_room(l8b: ModelInfo) -> None:
    machine = Machine(tuple(described_gpus(["rtx-4090", "16GiB@rtx-4080"])), Host(total=256 * GiB, available=240 * GiB))
    plan = make_plan(l8b, machine, build_request(parse_server_args(["-sm", "tensor"])))
    shares = plan.settings.tensor_split
    assert len(shares) == 2 and shares[0] > shares[1]
    used = [d.use for d in plan.devices]
    assert all(u.compute == used[0].compute for u in used) and used[0].model > used[1].model
    assert any(d.code.startswith("placement") and "-sm tensor" in d.message for d in plan.decisions)


def test_what_llama_cpp_refuses_under_a_tensor_split(l8b: ModelInfo, tmp_path: Path) -> None:
    machine = Machine(tuple(described_gpus(["rtx-4090", "rtx-4090"])), Host(total=256 * GiB, available=240 * GiB))
    with pytest.raises(UsageError, match="requires flash attention"):
        make_plan(l8b, machine, build_request(parse_server_args(["-sm", "tensor", "-fa", "off"])))
    grok = load_model(factory.dense(arch="grok", name="grok", n_layer=2).write(tmp_path / "grok.gguf"))
    with pytest.raises(UsageError, match="not implemented for the grok architecture"):
        make_plan(grok, machine, build_request(parse_server_args(["-sm", "tensor"])))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tensor-models")
    return {
        "qwen06": factory.qwen3_0_6b().write(d / "qwen3-0.6b.gguf"),  # tied output: mirrored
        "gemma3": factory.gemma3().write(d / "gemma3.gguf"),  # sliding-window cache beside the full one
        "gpt_oss": factory.gpt_oss(n_layer=6).write(d / "gpt-oss.gguf"),  # experts, biases, sinks, own output
        # a draft model of the target's vocabulary, in a folder of its own (beside the target it is a sidecar)
        "draft": factory.dense(name="draft", arch="qwen3", n_layer=2, n_vocab=151936).write(
            tmp_path_factory.mktemp("tensor-draft") / "draft.gguf"
        ),
    }


@pytest.mark.server
@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("qwen06", ["-c", "4096", "-ts", "1,1"]),
        ("qwen06", ["-c", "8192", "-ub", "256", "-ts", "3,1"]),
        ("gemma3", ["-c", "4096", "-np", "2", "-ts", "2,1"]),
        ("gpt_oss", ["-c", "4096", "-ts", "1,1"]),
        ("gpt_oss", ["-c", "4096", "-ngl", "4", "-ts", "3,2"]),  # layers on the host beside the Meta device
        ("qwen06", ["-c", "4096"]),  # the fit's own shares
    ],
)
def test_the_meta_devices_buffers_are_the_plans(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path], model: str, args: list[str]
) -> None:
    prep = prepare(
        str(models[model]),
        Options(server_args=(*args, "-sm", "tensor"), rpc=[",".join(rpc_servers)], server=server_bin.path,
                calibrate=False),
    )  # fmt: skip
    assert "-sm" in prep.argv and not prep.plan.warnings, prep.plan.warnings
    rpc = next(d.message for d in prep.plan.decisions if d.code == "rpc.network")
    assert "every layer split over RPC0" in rpc and "RPC1" in rpc, rpc
    log = run_argv(server_bin, prep.argv[1:])
    rows = compare(prep.plan.footprint, log, "target", prep.plan.buffer_aliases)
    by = {(r.kind, r.buft): r for r in rows}
    for kind in ("model", "kv", "compute"):
        r = by[(kind, tensor_split.META)]
        assert r.actual_mib is not None and r.within, r
    assert all(r.within for r in rows), [r for r in rows if not r.within]


@pytest.mark.server
def test_a_drafter_under_a_tensor_split_is_on_one_card(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    """A drafter inherits -sm tensor and fails to load on no device (-devd none): the plan puts it whole on one card,
    which llama.cpp loads as a layer split, and prices both contexts as the server allocates them."""
    opts = Options(server_args=("-c", "4096", "-sm", "tensor"), rpc=[",".join(rpc_servers)], server=server_bin.path,
                   calibrate=False, draft=str(models["draft"]))  # fmt: skip
    prep = prepare(str(models["qwen06"]), opts)
    assert prep.argv[prep.argv.index("-devd") + 1] == "RPC0", prep.argv
    log = run_argv(server_bin, prep.argv[1:])
    assert prep.plan.draft_footprint is not None
    for context, fp in (("target", prep.plan.footprint), ("draft", prep.plan.draft_footprint)):
        rows = compare(fp, log, context, prep.plan.buffer_aliases)
        assert rows and all(r.within for r in rows), [r for r in rows if not r.within]


@pytest.mark.server
def test_over_one_card_the_buffers_are_still_the_meta_devices(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    """-sm tensor over one device still wraps it in a Meta device (src/llama.cpp:193-220): its buffers, whole, carry
    that name; backend sampling stays on the host."""
    for args in (["-c", "4096"], ["-c", "4096", "-bs", "-np", "2", "--spec-type", "ngram-mod"]):
        opts = Options(server_args=(*args, "-sm", "tensor", "-dev", "RPC0"), rpc=[",".join(rpc_servers)],
                       server=server_bin.path, calibrate=False)  # fmt: skip
        prep = prepare(str(models["qwen06"]), opts)
        rows = compare(prep.plan.footprint, run_argv(server_bin, prep.argv[1:]), "target", prep.plan.buffer_aliases)
        assert {r.kind for r in rows if r.buft == tensor_split.META} == {"model", "kv", "compute"}, rows
        assert all(r.within for r in rows), [r for r in rows if not r.within]
