"""Speculative decoding: each drafter priced, and under Auto given up before the context is cut.

The scenarios are the seed's (shared/seeds/004): they run the real planner on described devices.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.devices.machine import Device, Host, Machine
from llamafit.errors import UsageError
from llamafit.fit import Inputs, make_plan
from llamafit.fit.plan import Plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.server.args import compose, parse_server_args
from llamafit.server.capabilities import ASSUMED
from llamafit.speculative import detect_kind, find_sidecars, spec_options
from llamafit.units import GiB, MiB, fmt_bytes
from tests import factory

HOST = Host(total=256 * GiB, available=240 * GiB)
NO_NGRAM_MOD = ASSUMED.__class__(
    path="old-llama-server", version="old", build=None, flags=ASSUMED.flags,
    spec_types=tuple(t for t in ASSUMED.spec_types if t != "ngram-mod"),
)  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spec")
    q35_mtp = factory.qwen35_mtp_2b()
    return {
        "glm": factory.glm45_air().write(d / "GLM-4.5-Air-Q4_K_M.gguf"),
        "qwen8b": factory.qwen3_8b().write(d / "Qwen3-8B-Q4_K_M.gguf"),
        "qwen06b": factory.qwen3_0_6b().write(d / "Qwen3-0.6B-Q8_0.gguf"),
        # a dense hybrid with an MTP head and a real vocabulary: ngram-mod's verification batch (65
        # output rows per slot) grows its device compute, so the fallback has a device cost
        "q35mtp": q35_mtp.write(d / "q35-mtp.gguf"),
    }


gpu = factory.gpu


def plan(model: Path, gpus: list[Device], args: list[str] = (), caps=ASSUMED, **kw: str):  # type: ignore[no-untyped-def,assignment]
    a = parse_server_args(list(args))
    opts = spec_options(a, mode=kw.get("spec", "auto"), prefer=kw.get("prefer", "context"), draft=kw.get("draft"))
    return make_plan(load_model(model), Machine(tuple(gpus), HOST), build_request(a), opts, Inputs(caps))


def argv(p: Plan, args: list[str] = ()) -> list[str]:  # type: ignore[assignment]
    return compose("llama-server", p.planned, parse_server_args(list(args)))


def on_cpu(p: Plan) -> int:
    """The target's weight bytes on the host."""
    return p.host.use.model


def draft_bytes(p: Plan) -> int:
    return sum(d.use.draft_model + d.use.draft_kv + d.use.draft_compute for d in p.devices)


def test_detection_follows_llama_cpp(models: dict[str, Path]) -> None:
    assert detect_kind(load_model(models["glm"])) == "draft-mtp"  # blk.46.nextn.eh_proj.weight
    assert detect_kind(load_model(models["qwen06b"])) is None  # a plain model needs draft-simple


def test_auto_drops_the_drafter_when_only_the_target_fits(models: dict[str, Path]) -> None:
    alone = plan(models["glm"], [gpu(0, 96.5)], spec="off")
    p = plan(models["glm"], [gpu(0, 96.5)])
    s = p.speculative
    assert s is not None and s.fallback_reason == "drafter_no_vram"
    assert p.n_ctx == alone.n_ctx == 131072  # the context is kept
    assert s.chosen == "ngram-mod"
    assert "fits at context 131072 but its drafter" in s.message and "GiB budget" in s.message
    assert "--spec draft-mtp" in s.message and "--prefer speed" in s.message
    a = argv(p)
    assert a[a.index("--spec-type") + 1] == "ngram-mod" and "-md" not in a


def test_the_drop_releases_what_the_fit_charged(models: dict[str, Path]) -> None:
    alone = plan(models["glm"], [gpu(0, 96.5)], spec="off")
    dropped = plan(models["glm"], [gpu(0, 96.5)])
    forced = plan(models["glm"], [gpu(0, 96.5)], spec="draft-mtp")
    assert draft_bytes(dropped) == 0 and draft_bytes(forced) > 0
    # the NextN weights are not loaded once the drafter is gone, and no drafter context remains
    assert dropped.devices[0].use.model == alone.devices[0].use.model
    assert dropped.draft_footprint is None
    assert dropped.settings.load_nextn is False and forced.settings.load_nextn is True
    assert dropped.host.use.ngram == 16 * MiB  # ngram-mod's hash pool, host only


def test_auto_keeps_a_drafter_that_fits(models: dict[str, Path]) -> None:
    p = plan(models["glm"], [gpu(0, 141)])
    s = p.speculative
    assert s is not None and s.chosen == "draft-mtp" and s.fallback_reason is None
    assert p.n_ctx == 131072
    dev = p.devices[0].use
    assert dev.draft_model > 0 and dev.draft_kv > 0 and dev.draft_compute > 0
    assert p.devices[0].fits
    assert argv(p)[argv(p).index("--spec-type") + 1] == "draft-mtp"


def test_forcing_the_drafter_overrides_the_drop(models: dict[str, Path]) -> None:
    auto = plan(models["glm"], [gpu(0, 80)])
    forced = plan(models["glm"], [gpu(0, 80)], spec="draft-mtp")
    assert forced.speculative is not None and forced.speculative.chosen == "draft-mtp"
    # --prefer context: the context stays the largest the machine holds, more experts go to the host for it
    assert forced.n_ctx == auto.n_ctx and on_cpu(forced) > on_cpu(auto)
    assert forced.devices[0].fits
    cut = plan(models["glm"], [gpu(0, 80)], spec="draft-mtp", prefer="balanced")
    assert cut.n_ctx < auto.n_ctx or on_cpu(cut) > on_cpu(auto)
    if cut.n_ctx < auto.n_ctx:
        assert cut.speculative is not None and f"{cut.n_ctx} instead of" in cut.speculative.message


def test_prefer_speed_trades_context_for_the_drafter(models: dict[str, Path]) -> None:
    auto = plan(models["glm"], [gpu(0, 80)])
    speed = plan(models["glm"], [gpu(0, 80)], prefer="speed")
    assert speed.speculative is not None and speed.speculative.chosen == "draft-mtp"
    assert speed.n_ctx < auto.n_ctx
    assert speed.n_ctx >= 4096


def test_prefer_speed_gives_the_drafter_up_when_even_min_ctx_fails(models: dict[str, Path]) -> None:
    p = plan(models["glm"], [gpu(0, 73)], prefer="speed")
    assert p.speculative is not None and p.speculative.fallback_reason == "drafter_no_vram"
    assert "even at --min-ctx" in p.speculative.message


def test_the_vram_drop_does_not_emit_ngram_mod_on_a_build_without_it(models: dict[str, Path]) -> None:
    p = plan(models["glm"], [gpu(0, 96.5)], caps=NO_NGRAM_MOD)
    assert p.speculative is not None and p.speculative.chosen == "none"
    assert "--spec-type" not in argv(p)
    assert "ngram-mod" not in p.speculative.message


def placement(p: Plan) -> list[str]:
    a = argv(p)
    return [x for i, x in enumerate(a) if a[i - 1] in ("-c", "-ngl", "--n-cpu-moe", "-ot", "-ts")]


@pytest.mark.parametrize("gib", [2.4, 2.6])
def test_the_fallback_never_costs_context_or_layers(models: dict[str, Path], gib: float) -> None:
    """ngram-mod's verification batch needs device memory the kept plan does not leave: no speculation,
    the plan of the target alone, and the message says what ngram-mod would have cost."""
    alone = plan(models["q35mtp"], [gpu(0, gib)], spec="off")
    ngram = plan(models["q35mtp"], [gpu(0, gib)], spec="ngram-mod")
    p = plan(models["q35mtp"], [gpu(0, gib)])
    s = p.speculative
    assert s is not None and s.fallback_reason == "drafter_no_vram" and s.chosen == "none"
    assert placement(p) == placement(alone)
    assert placement(ngram) != placement(alone)  # what the old fallback did: ngram-mod fitted on its own
    assert "--spec-type" not in argv(p)
    assert "ngram-mod is not used either" in s.message and "MiB of device memory" in s.message
    assert p.host.use.ngram == 0


def test_the_fallback_prices_ngram_mod_beside_the_split_the_target_was_grown_to(models: dict[str, Path]) -> None:
    """Over two cards the target's split is grown past what a packing gives (``Search.grow``, ``finer_experts``):
    ngram-mod is priced beside that split, not beside a packing of it again, whose budgets are conservative and
    refused it at every card size (GLM-4.5-Air over two 24 GiB cards: 6.5 MiB more on the devices)."""
    cards = [gpu(0, 24), gpu(1, 24)]
    alone = plan(models["glm"], cards, ["-c", "8192"], spec="off")
    p = plan(models["glm"], cards, ["-c", "8192"])
    s = p.speculative
    assert s is not None and s.fallback_reason == "drafter_no_vram" and s.chosen == "ngram-mod", s.message
    assert placement(p) == placement(alone) and "-ot" in argv(alone)  # a split grown by parts of layers
    assert all(d.fits for d in p.devices)
    assert "at the same placement" in s.message


def test_a_free_fallback_states_its_real_cost(models: dict[str, Path]) -> None:
    alone = plan(models["q35mtp"], [gpu(0, 2.7)], spec="off")
    p = plan(models["q35mtp"], [gpu(0, 2.7)])
    s = p.speculative
    assert s is not None and s.fallback_reason == "drafter_no_vram" and s.chosen == "ngram-mod"
    assert placement(p) == placement(alone)
    grown = sum(d.use.compute + d.use.output for d in p.devices)
    grown -= sum(d.use.compute + d.use.output for d in alone.devices)
    assert grown > 0 and p.devices[0].fits
    assert f"using ngram-mod ({fmt_bytes(grown)} of device memory" in s.message
    assert "no device memory" not in s.message


def test_an_explicit_ngram_type_states_its_device_cost(models: dict[str, Path]) -> None:
    p = plan(models["qwen8b"], [gpu(0, 24)], spec="ngram-mod")
    assert p.speculative is not None and p.speculative.chosen == "ngram-mod"
    assert "of device memory" in p.speculative.message and "no device memory" not in p.speculative.message


def test_a_standalone_model_draft_in_extras_is_not_auto_dropped(models: dict[str, Path]) -> None:
    extra = ["-md", str(models["qwen06b"]), "--spec-type", "draft-simple"]
    alone = plan(models["qwen8b"], [gpu(0, 9)], spec="off")
    p = plan(models["qwen8b"], [gpu(0, 9)], extra)
    assert p.speculative is not None and p.speculative.chosen == "draft-simple"
    assert p.n_ctx < alone.n_ctx or on_cpu(p) > on_cpu(alone)  # honoured: the context or the layers give way
    a = argv(p, extra)
    assert a.count("--spec-type") == 1 and a.count("-md") == 1  # the user's, never a duplicate
    assert p.devices[0].use.draft_model > 500 * MiB


def test_a_plain_draft_gets_draft_simple_added(models: dict[str, Path]) -> None:
    p = plan(models["qwen8b"], [gpu(0, 24)], draft=str(models["qwen06b"]))
    a = argv(p)
    assert a[a.index("--spec-type") + 1] == "draft-simple"
    assert a[a.index("-md") + 1] == str(models["qwen06b"])


def test_draft_kv_uses_draft_cache_types_not_the_targets(models: dict[str, Path]) -> None:
    f16 = plan(models["qwen8b"], [gpu(0, 24)], ["-ctk", "q8_0", "-ctv", "q8_0"], draft=str(models["qwen06b"]))
    q8 = plan(models["qwen8b"], [gpu(0, 24)], ["-ctk", "q8_0", "-ctv", "q8_0", "-ctkd", "q8_0", "-ctvd", "q8_0"],
              draft=str(models["qwen06b"]))  # fmt: skip
    assert f16.n_ctx == q8.n_ctx
    assert q8.devices[0].use.draft_kv < f16.devices[0].use.draft_kv * 0.6


def test_a_drafter_pinned_to_cpu_costs_no_vram(models: dict[str, Path]) -> None:
    p = plan(models["qwen8b"], [gpu(0, 9)], ["-ngld", "0"], draft=str(models["qwen06b"]))
    assert p.devices[0].use.draft_model == 0
    assert p.host.use.draft_model > 500 * MiB
    p2 = plan(models["qwen8b"], [gpu(0, 9)], ["-devd", "none"], draft=str(models["qwen06b"]))
    assert p2.devices[0].use.draft_model == 0 and p2.devices[0].use.draft_kv == 0


def test_a_busy_second_gpu_does_not_condemn_a_drafter_the_first_one_holds(tmp_path: Path) -> None:
    """Auto with a separate drafter over two cards, the second nearly full: the first card holds it."""
    target = factory.qwen3_8b().write(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    head = factory.qwen3_0_6b()
    head.kv["qwen3.nextn_predict_layers"] = 1  # make it an MTP sidecar by name and by tensor
    head.tensors.append(factory.TensorSpec("blk.27.nextn.eh_proj.weight", (2048, 1024), "q8_0"))
    head.write(tmp_path / "mtp-Qwen3-8B-Q8_0.gguf")
    cards = [gpu(0, 24), gpu(1, 24, free_gib=6.8)]
    split = ["-ts", "1,1"]  # the target spans both cards; the second has room for its half only
    p = plan(target, cards, split)
    assert p.speculative is not None and p.speculative.chosen == "draft-mtp", p.speculative.message
    assert p.speculative.fallback_reason is None
    for dev in p.devices:
        assert dev.fits, dev.device.id
    a = argv(p, split)
    assert a[a.index("-devd") + 1] == "CUDA0"  # the drafter goes whole to the card with room
    assert p.devices[1].use.draft_model == 0 and p.devices[1].use.draft_kv == 0
    # following the target's split instead, the drafter's share would overflow the busy card
    follow = plan(target, cards, [*split, "-devd", "CUDA0,CUDA1"])
    assert follow.speculative is not None and follow.speculative.fallback_reason == "drafter_no_vram"


def test_an_unsized_drafter_is_priced_with_a_reserve(models: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "draft-broken.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 4096)
    p = plan(models["qwen8b"], [gpu(0, 24)], draft=str(broken))
    assert p.speculative is not None and p.speculative.drafter is not None
    assert not p.speculative.drafter.sized
    assert any("could not be sized" in w for w in p.warnings)
    assert p.devices[0].use.draft_compute == 224 * MiB
    assert p.devices[0].use.draft_model == broken.stat().st_size


def test_sidecars_beside_the_model_are_found(models: dict[str, Path], tmp_path: Path) -> None:
    target = factory.glm4moe(n_layer=2, n_nextn=0).write(tmp_path / "GLM-Q4_K_M.gguf")
    side = factory.glm4moe(n_layer=0, n_nextn=1, name="mtp head").write(tmp_path / "mtp-GLM-Q8_0.gguf")
    factory.glm4moe(n_layer=0, n_nextn=1).write(tmp_path / "mtp-GLM-BF16.gguf")
    found = find_sidecars(str(target))
    assert found == {"draft-mtp": str(side)}  # Q8_0 is closer to the model's 4 bits than BF16
    p = plan(target, [gpu(0, 24)])
    assert p.speculative is not None and p.speculative.drafter is not None
    assert p.speculative.drafter.source == "sidecar" and p.speculative.chosen == "draft-mtp"
    assert argv(p)[argv(p).index("-md") + 1].endswith("mtp-GLM-Q8_0.gguf")


def test_spec_type_in_extras_is_never_duplicated(models: dict[str, Path]) -> None:
    extra = ["--spec-type", "ngram-mod"]
    p = plan(models["glm"], [gpu(0, 96.5)], extra)
    a = argv(p, extra)
    assert a.count("--spec-type") == 1
    assert p.speculative is not None and p.speculative.chosen == "ngram-mod"


def test_forcing_mtp_on_a_model_without_it_is_a_clear_error(models: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match="no drafter"):
        plan(models["qwen8b"], [gpu(0, 24)], spec="draft-mtp")


def test_rollback_rows_on_a_rollback_architecture(tmp_path: Path) -> None:
    m = factory.qwen35(n_nextn=1).write(tmp_path / "q35.gguf")
    off = plan(m, [gpu(0, 24)], ["-c", "4096"], spec="off")
    mtp = plan(m, [gpu(0, 24)], ["-c", "4096"], spec="draft-mtp")
    assert mtp.speculative is not None and mtp.speculative.n_rs_seq == 3
    assert mtp.devices[0].use.rs == 4 * off.devices[0].use.rs


def test_checkpoints_and_cache_are_chosen_when_host_ram_would_run_out(tmp_path: Path) -> None:
    m = load_model(factory.gemma3(n_layer=6).write(tmp_path / "g.gguf"))
    small = Machine((gpu(0, 24),), Host(total=8 * GiB, available=int(0.3 * GiB)))
    a = parse_server_args(["-c", "16384"])
    p = make_plan(m, small, build_request(a, margin=64 * MiB), spec_options(a))
    assert p.decision("runtime.host") and "--cache-ram" in argv(p)
    assert p.host.runtime is not None and p.host.runtime.total <= p.host.runtime.room


def test_json_carries_the_speculative_block(models: dict[str, Path]) -> None:
    from llamafit.fit.plan import to_json

    p = plan(models["glm"], [gpu(0, 96.5)])
    doc = to_json(p, argv(p))
    spec = doc["speculative"]
    assert set(spec) >= {"requested", "chosen", "drafter", "n_rs_seq", "fallback_reason", "message"}
    assert spec["drafter"] == {"kind": "draft-mtp", "path": None, "sized": True, "source": "embedded",
                               "embedded": True}  # fmt: skip
    assert spec["fallback_reason"] == "drafter_no_vram"


@pytest.mark.parametrize(("arch", "tensors", "kind"), [
    ("dflash", ["markov_w1.weight"], "draft-dspark"),
    ("dflash", [], "draft-dflash"),
    ("eagle3", [], "draft-eagle3"),
])  # fmt: skip
def test_sidecar_kinds_are_detected_from_the_gguf(tmp_path: Path, arch: str, tensors: list[str], kind: str) -> None:
    from llamafit.gguf.writer import TensorSpec, write_gguf

    kv = {f"{arch}.block_count": 1, f"{arch}.embedding_length": 64, f"{arch}.context_length": 4096,
          f"{arch}.attention.head_count": 4, f"{arch}.target_layers": [1, 2, 3]}  # fmt: skip
    specs = [TensorSpec("blk.0.attn_norm.weight", (64,)), *(TensorSpec(t, (64, 64)) for t in tensors)]
    p = tmp_path / f"{arch}-draft.gguf"
    write_gguf(p, arch, kv, specs)
    assert detect_kind(load_model(p)) == kind


def test_hidden_state_extraction_is_priced_on_the_target(models: dict[str, Path], tmp_path: Path) -> None:
    from llamafit.gguf.writer import TensorSpec, write_gguf

    kv = {"eagle3.block_count": 1, "eagle3.embedding_length": 4096, "eagle3.context_length": 40960,
          "eagle3.attention.head_count": 32, "eagle3.attention.head_count_kv": 8, "eagle3.feed_forward_length": 12288,
          "eagle3.target_layers": [2, 18, 33]}  # fmt: skip
    side = tmp_path / "eagle3-Qwen3-8B.gguf"
    write_gguf(side, "eagle3", kv, [TensorSpec("blk.0.attn_norm.weight", (4096,)),
                                    TensorSpec("fc.weight", (3 * 4096, 4096), "f16")])  # fmt: skip
    off = plan(models["qwen8b"], [gpu(0, 24)], spec="off")
    p = plan(models["qwen8b"], [gpu(0, 24)], draft=str(side))
    assert p.speculative is not None and p.speculative.chosen == "draft-eagle3"
    assert p.settings.extract_hidden == 3
    # three target layer inputs of n_embd x n_batch floats land in the host output buffer
    assert p.host.use.output - off.host.use.output >= 3 * 4096 * 2048 * 4


def test_a_sidecar_made_for_another_model_is_passed_over_or_refused(tmp_path: Path) -> None:
    """A DFlash sidecar for a 4096-wide model beside a 1024-wide one: llama-server would abort on the
    pair (tests/test_speculative_vs_server.py shows it does). Auto passes it over for the next sidecar
    and says why; naming it is refused with the reason."""
    target = factory.qwen3_0_6b().write(tmp_path / "Qwen3-0.6B-Q8_0.gguf")
    wide = factory.dflash().write(tmp_path / "dflash-Qwen3-8B-Q8_0.gguf")
    deep = factory.dflash(n_embd=1024, n_ff=3072, target_layers=(1, 9, 30)).write(tmp_path / "dspark-x.gguf")
    p = plan(target, [gpu(0, 24)])
    assert p.speculative is not None and p.speculative.drafter is None
    assert any("dflash-Qwen3-8B-Q8_0.gguf passed over" in w and "4096 wide" in w for w in p.warnings), p.warnings
    assert any("dspark-x.gguf passed over" in w and "target layer 30" in w for w in p.warnings), p.warnings
    for path in (wide, deep):
        with pytest.raises(UsageError, match="made for another model") as e:
            plan(target, [gpu(0, 24)], draft=str(path))
        assert e.value.hint and "--spec off" in e.value.hint
    # the drafter made for it is taken
    fits = factory.dflash(n_embd=1024, n_head=16, n_ff=3072, target_layers=(1, 9, 17, 25))
    fits_path = fits.write(tmp_path / "elsewhere.gguf")
    ok = plan(target, [gpu(0, 24)], draft=str(fits_path))
    assert ok.speculative is not None and ok.speculative.chosen == "draft-dflash"


def test_a_drafter_under_a_tensor_split_is_on_a_card(models: dict[str, Path]) -> None:
    """It inherits -sm tensor, whose Meta device of no card fails to load: whole on one card, never -devd none."""
    cards = [gpu(0, 24), gpu(1, 24)]
    p = plan(models["qwen8b"], cards, ["-sm", "tensor"], draft=str(models["qwen06b"]))
    a = argv(p, ["-sm", "tensor"])
    assert a[a.index("-devd") + 1] in ("CUDA0", "CUDA1")
    assert sum(d.use.draft_model > 0 for d in p.devices) == 1
    with pytest.raises(UsageError, match="-devd none"):
        plan(models["qwen8b"], cards, ["-sm", "tensor", "-devd", "none"], draft=str(models["qwen06b"]))
