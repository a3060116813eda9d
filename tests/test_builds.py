"""What llamafit prices for another llama.cpp build: the rules read from each build's own source
(llamafit.memory.builds), each checked against the b11434 model at the settings that build really ran with.
bench/accuracy.py --server holds them to a real older build (bench/results/accuracy-b9310.json)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.machine import Host, Machine
from llamafit.fit import Inputs, make_plan
from llamafit.fit.plan import Plan, to_json
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.memory.build_match import match
from llamafit.memory.builds import (
    BLOCK_DRAFT_SAMPLED_SINCE,
    KQ_MASK_F16_SINCE,
    MAMBA2_PROJ_2D_SINCE,
    MTP_DRAFT_CACHE_TYPES_SINCE,
    OLDEST_READ,
    OUTPUTS_PER_SLOT_SINCE,
    RULES,
    UNKNOWN,
    before,
    differences,
    mamba2_proj_2d,
    rs_one_gather,
    settled,
)
from llamafit.memory.footprint import estimate
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import ASSUMED, Capabilities, ggml_version
from llamafit.speculative import spec_options
from llamafit.units import GiB, MiB
from tests import factory
from tests.realserver import wrapped

HOST = Host(total=256 * GiB, available=240 * GiB)


def at(build: int | None) -> Capabilities:
    """A probed server of ``build`` (None: one that does not say) with b11434's flags."""
    said = f"version: {build} (abcdef0)" if build else "version: 0.6.0-dev (build 0, commit unknown)"
    return replace(ASSUMED, path="llama-server", version=said, build=build, probed=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("builds")
    q35 = factory.qwen35_mtp_2b()
    eagle = factory.eagle3(n_embd=2048, n_target=2048, n_head=16, n_head_kv=2, n_ff=6144, target_layers=(2, 11, 20))
    return {
        "q35": q35.write(d / "q35-mtp.gguf"),
        "eagle3": eagle.write(d / "eagle3-q35.gguf"),
        "qwen06b": factory.qwen3_0_6b().write(d / "Qwen3-0.6B-Q8_0.gguf"),
        "glm": factory.glm4moe(n_layer=8, n_nextn=1, n_vocab=32000).write(d / "glm4moe-mtp.gguf"),
    }


def plan(model: Path, args: list[str], caps: Capabilities, spec: str = "off", draft: str | None = None) -> Plan:
    a = parse_server_args(args)
    opts = spec_options(a, mode=spec, draft=draft)
    return make_plan(load_model(model), Machine((), HOST), build_request(a), opts, Inputs(caps))


def buffer(p: Plan, context: str, kind: str) -> int:
    fp = p.draft_footprint if context != "target" else p.footprint
    assert fp is not None
    return sum(b.nbytes for b in fp.buffers if b.kind == kind and b.context == context)


def test_an_mtp_context_before_9326_takes_the_targets_cache_types(models: dict[str, Path]) -> None:
    """9246-9310 made the MTP context from the target's parameters: its cache is -ctk/-ctv's, not -ctkd's f16."""
    q8 = ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"]
    old = plan(models["q35"], q8, at(MTP_DRAFT_CACHE_TYPES_SINCE - 16), spec="draft-mtp")
    new = plan(models["q35"], q8, at(MTP_DRAFT_CACHE_TYPES_SINCE), spec="draft-mtp")
    as_q8 = plan(
        models["q35"], [*q8, "-ctkd", "q8_0", "-ctvd", "q8_0"], at(MTP_DRAFT_CACHE_TYPES_SINCE), spec="draft-mtp"
    )
    assert buffer(old, "mtp", "kv") == buffer(as_q8, "mtp", "kv") < buffer(new, "mtp", "kv")
    assert buffer(old, "target", "kv") == buffer(new, "target", "kv")
    words = old.memory_build.message if old.memory_build else ""
    assert "an MTP context's cache in -ctk/-ctv" in words and "-ctk/-ctv" not in " ".join(new.memory_build.differences)  # type: ignore[union-attr]


def test_a_build_that_does_not_say_prices_the_larger_mtp_cache(models: dict[str, Path]) -> None:
    """Where the build is not known, the MTP context's K and V take whichever type is larger."""
    f16_k = ["-c", "8192", "-ctk", "f16", "-ctv", "q8_0", "-ctkd", "q4_0", "-ctvd", "f16"]
    unknown = plan(models["q35"], f16_k, at(None), spec="draft-mtp")
    f16 = plan(models["q35"], ["-c", "8192", "-ctk", "f16", "-ctv", "q8_0"], at(11434), spec="draft-mtp")
    assert unknown.memory_build is not None and unknown.memory_build.sure == "unknown"
    assert buffer(unknown, "mtp", "kv") == buffer(f16, "mtp", "kv")  # f16 K (the target's), f16 V (-ctvd)


def test_an_eagle3_drafter_keeps_rollback_rows_from_9725(models: dict[str, Path]) -> None:
    """EAGLE3 ran from 9246, but its target kept rollback rows only from 9725 (need_n_rs_seq)."""
    args = ["-c", "8192", "-np", "1"]
    old = plan(models["q35"], args, at(9713), spec="draft-eagle3", draft=str(models["eagle3"]))
    new = plan(models["q35"], args, at(9725), spec="draft-eagle3", draft=str(models["eagle3"]))
    assert old.speculative is not None and new.speculative is not None
    assert old.speculative.chosen == new.speculative.chosen == "draft-eagle3"
    assert old.speculative.n_rs_seq == 0 < new.speculative.n_rs_seq
    assert buffer(old, "target", "rs") * (1 + new.speculative.n_rs_seq) == buffer(new, "target", "rs")
    assert "no rollback rows for an EAGLE3 drafter" in match(9713, True, "qwen35").differences


def test_rollback_architectures_follow_the_build(models: dict[str, Path]) -> None:
    assert (
        "no rollback rows for deepseek4 (a speculative target keeps none)"
        in match(10227, True, "deepseek4").differences
    )
    assert not match(10235, True, "deepseek4").differences or all(
        "deepseek4" not in d for d in match(10235, True, "deepseek4").differences
    )


def test_each_rule_is_said_for_the_builds_before_it_and_no_later() -> None:
    """Every dated rule, for every architecture it dates: the build before its first says what it allocates
    otherwise (unless a rule it is moot beside says it instead), its first build says nothing of it, and a span
    of builds across it is not settled on one build's rules."""
    checked = 0
    for r in RULES:
        for arch in {**r.by_arch, min(r.only) if r.only else "llama": r.since}:  # an architecture it concerns
            first = r.first(arch)
            if first <= OLDEST_READ:
                continue
            said = r.older.format(arch=arch)
            last_old = first - 1
            assert before(r.key, last_old, arch) and not before(r.key, first, arch)
            assert not before(r.key, UNKNOWN, arch)
            if said and not any(before(m, last_old, arch) for m in r.moot):
                assert said in differences(last_old, arch), (r.key, arch)
                checked += 1
            assert not said or said not in differences(first, arch), (r.key, arch)
            assert settled(last_old, first, arch) == UNKNOWN
            if r.nextn:  # a model without NextN layers hears nothing of it, and a span across it is settled
                assert not said or said not in differences(last_old, arch, nextn=False)
                assert settled(last_old, first, arch, nextn=False) != UNKNOWN or any(
                    last_old < o.first(arch, False) <= first for o in RULES
                )
    assert checked >= 10  # the table is read, not skipped


def test_a_rule_for_some_architectures_holds_for_them_alone() -> None:
    """The recurrent-state rules date a Mamba-2 model's graph and leave a transformer's alone (the check
    without its architecture read every build as b11434 and never applied them)."""
    for key, rule in (("rs-one-gather", rs_one_gather), ("mamba2-proj-2d", mamba2_proj_2d)):
        first = next(r for r in RULES if r.key == key).since
        for arch in ("mamba2", "nemotron_h", "granitehybrid"):
            assert not rule(first - 1, arch) and rule(first, arch)
        assert rule(first - 1, "llama")


def test_mamba2_layers_before_10605_project_a_3d_batch(tmp_path: Path) -> None:
    """b10603 and older reshaped a Mamba-2 layer's normed input to 3-D before ssm_in and the out-projection's
    result back to 2-D after it (b10603's mamba-base.cpp): the residual add then reads a view,
    takes the residual's buffer in place and the projection is freed: at most one n_embd x ubatch buffer less
    at the peak from the third layer on (ggml-alloc.c:623-689). Real servers on Codestral's layer shape at
    -np 4: b10173 logs 133.19 MiB, b10985 137.19 (bench/results/accuracy-b10173.json); a transformer is alone."""
    m = factory.mamba2(name="m2", n_layer=3, n_embd=1024, d_inner=2048, d_state=64, n_group=2, n_head=32,
                       n_vocab=1000, w="f16").write(tmp_path / "m2.gguf")  # fmt: skip
    args = ["-c", "4096", "-np", "4"]
    old = buffer(plan(m, args, at(MAMBA2_PROJ_2D_SINCE - 1)), "target", "compute")
    new = buffer(plan(m, args, at(MAMBA2_PROJ_2D_SINCE)), "target", "compute")
    assert 0 < new - old <= 1024 * 512 * 4  # the out-projection's F32 rows of the reserve's ubatch, or less
    q = factory.qwen3_0_6b().write(tmp_path / "q.gguf")
    assert buffer(plan(q, args, at(MAMBA2_PROJ_2D_SINCE - 1)), "target", "compute") == buffer(
        plan(q, args, at(MAMBA2_PROJ_2D_SINCE)), "target", "compute"
    )


def test_a_block_drafter_before_10423_is_sampled_on_the_host(tmp_path: Path) -> None:
    """DFlash and DSpark drafters got backend samplers, and a block of outputs a slot for them, in 10423: before,
    their context reserved one output a slot and no sampler read its logits (no padded copy of them). Real
    servers, Qwen3-4B's DSpark drafter at -c 8192: b10173 logs 306.75 MiB, the block reserve 604.08."""
    target = factory.qwen3_4b().write(tmp_path / "q4b.gguf")
    draft = factory.dspark_qwen3_4b().write(tmp_path / "dspark.gguf")
    args = ["-c", "8192", "-np", "4"]
    old = plan(target, args, at(BLOCK_DRAFT_SAMPLED_SINCE - 1), spec="draft-dspark", draft=str(draft))
    new = plan(target, args, at(BLOCK_DRAFT_SAMPLED_SINCE), spec="draft-dspark", draft=str(draft))
    assert old.draft_footprint is not None and new.draft_footprint is not None
    assert old.draft_footprint.context.sampled_rows == 0 < new.draft_footprint.context.sampled_rows
    assert old.draft_footprint.context.n_outputs_max == 4 < new.draft_footprint.context.n_outputs_max
    n_vocab = load_model(target).hparams.n_vocab
    logits = n_vocab * 512 * 4  # every token's logits: the samplers' padded copy is one row more
    saved = buffer(new, "draft", "compute") - buffer(old, "draft", "compute")
    assert logits <= saved <= logits + n_vocab * 4 * 8


def test_the_nextn_layers_cache_follows_the_build(models: dict[str, Path]) -> None:
    """glm4moe with its NextN layer under draft-mtp: from 10909 the target's cache holds the trunk and the MTP
    context's the NextN layer; from 10603 (its loader's MTP) to 10908 both hold every layer; before, its loader
    kept the NextN layer out of both and its weights unloaded (b9310: the MTP context logged the target's 256
    MiB of cache, bench/results/accuracy-b9310.json)."""
    args = ["-c", "8192", "-np", "1"]
    split, every, trunk = (plan(models["glm"], args, at(b), spec="draft-mtp") for b in (10909, 10700, 9310))
    per_layer = buffer(split, "mtp", "kv")  # one NextN layer
    assert buffer(split, "target", "kv") == 8 * per_layer
    assert buffer(every, "target", "kv") == buffer(every, "mtp", "kv") == 9 * per_layer
    assert buffer(trunk, "target", "kv") == buffer(trunk, "mtp", "kv") == 8 * per_layer
    nextn = sum(d.use.draft_model for d in split.devices) + split.host.use.draft_model
    assert nextn > 0 and trunk.host.use.draft_model == 0 and not any(d.use.draft_model for d in trunk.devices)
    no_mtp = plan(models["glm"], args, at(10909))
    assert buffer(no_mtp, "target", "kv") == 8 * per_layer  # the trunk's on every build from 10909


def test_before_its_mtp_graph_an_mtp_context_is_a_second_target(models: dict[str, Path]) -> None:
    """glm4moe from 9528 (its hparams no longer kept the NextN layer out) to 10602 (its MTP graph): both caches
    hold every layer, the NextN weights are skipped and the MTP context builds the trunk's graph (b10173,
    GLM-4.5-Air's layers: 288 MiB of cache each, its compute the target's 178.01 MiB,
    bench/results/accuracy-b10173.json). Asked for, it is priced so; under Auto the head is not drafted."""
    args = ["-c", "8192", "-np", "1"]
    old, new = (plan(models["glm"], args, at(b), spec="draft-mtp") for b in (10173, 10603))
    per_layer = buffer(new, "target", "kv") // 9  # 10603-10908: every layer in both as well
    assert buffer(old, "target", "kv") == buffer(old, "mtp", "kv") == 9 * per_layer
    assert buffer(old, "mtp", "compute") > buffer(new, "mtp", "compute")  # the trunk's graph, not the head's
    assert old.host.use.draft_model == 0 and new.host.use.draft_model > 0
    said = " ".join(old.notes + old.warnings + tuple(d.message for d in old.decisions))
    assert "has no MTP graph for glm4moe (from b10603)" in said and "kept as asked" in said
    auto_old, auto_new = (plan(models["glm"], args, at(b), spec="auto") for b in (10173, 10603))
    assert auto_new.speculative.drafter is not None and auto_new.speculative.drafter.kind == "draft-mtp"
    assert auto_old.speculative.drafter is None
    said = " ".join(auto_old.notes + auto_old.warnings + tuple(d.message for d in auto_old.decisions))
    assert "the NextN head is not drafted with" in said


def test_glm_dsa_cached_every_layers_indexer_before_10248(tmp_path: Path) -> None:
    """10142-10247 read the indexer types and still cached an indexer row on every layer (b10173: 4.00 MiB of
    indexer cache where b11434, which caches only the full indexers' layers, takes 2.00)."""
    m = factory.glm_dsa(indexer_types=(1, 1, 0, 0)).write(tmp_path / "glm-dsa.gguf")
    old, new = (plan(m, ["-c", "8192"], at(b)) for b in (10240, 10248))
    # the two servers' logs: 10.00 MiB of MLA cache and 4.00 (b10173) or 2.00 (b11434) of indexer cache
    assert (buffer(old, "target", "kv"), buffer(new, "target", "kv")) == (14 * MiB, 12 * MiB)
    assert "an indexer cache on every layer, those that share a top-k too" in old.memory_build.differences  # type: ignore[union-attr]


def test_qwen35_before_10216_loads_its_nextn_weights_always(models: dict[str, Path]) -> None:
    """Its loader took the NextN block with or without an MTP drafter before load_mtp (b9310's Qwen3.5-35B-A3B
    logged 455 MiB more weights than b11434's rule gives)."""
    args = ["-c", "8192"]
    old, new = plan(models["q35"], args, at(10204)), plan(models["q35"], args, at(10216))
    mtp = plan(models["q35"], args, at(10216), spec="draft-mtp")
    assert buffer(old, "target", "model") == buffer(mtp, "target", "model") > buffer(new, "target", "model")


def test_a_build_before_9464_reserves_every_ubatch_tokens_logits(models: dict[str, Path]) -> None:
    """Its server set no n_outputs_max: the reserve's outputs were its tokens (graph_reserve(n_tokens, n_seqs,
    n_tokens)), as llama-fit-params still does; the output buffer is the same (it grows at run time)."""
    args = ["-c", "4096", "-np", "2", "-fa", "on"]
    old = plan(models["qwen06b"], args, at(OUTPUTS_PER_SLOT_SINCE - 11))
    new = plan(models["qwen06b"], args, at(OUTPUTS_PER_SLOT_SINCE))
    model = load_model(models["qwen06b"])
    all_outputs = estimate(model, replace(new.settings, n_outputs_max=0), ())
    assert buffer(old, "target", "compute") == sum(b.nbytes for b in all_outputs.buffers if b.kind == "compute")
    assert buffer(old, "target", "compute") > buffer(new, "target", "compute")
    assert buffer(old, "target", "output") == buffer(new, "target", "output")


def test_a_build_before_9415_casts_an_f32_mask(models: dict[str, Path]) -> None:
    """Under flash attention 9409 and older made the KQ mask F32 and cast it to F16: more compute, by at most
    the input's two more bytes and the cast's two per cell and token (ggml-alloc reuses what the peak does
    not hold); without flash attention the mask is F32 on every build."""
    for fa, more in (("on", True), ("off", False)):
        args = ["-c", "8192", "-np", "1", "-fa", fa]
        old = plan(models["qwen06b"], args, at(KQ_MASK_F16_SINCE - 6))
        new = plan(models["qwen06b"], args, at(KQ_MASK_F16_SINCE))
        diff = buffer(old, "target", "compute") - buffer(new, "target", "compute")
        cp = new.footprint.context
        assert (0 < diff <= 4 * cp.n_ctx_seq * cp.n_ubatch) if more else diff == 0


def test_the_plan_says_which_build_it_priced(models: dict[str, Path]) -> None:
    p = plan(models["q35"], ["-c", "8192"], at(9305), spec="draft-mtp")
    j = to_json(p, [])["memory_model"]
    assert j["priced_for"] == j["server_build"] == 9305 and j["sure"] == "unmeasured"
    held = plan(models["q35"], ["-c", "8192"], at(9310), spec="draft-mtp")
    assert held.memory_build is not None and held.memory_build.sure == "measured"  # the bench's b9310 run
    assert "logits reserved for every ubatch token" in j["differences"]
    older = plan(models["q35"], ["-c", "8192"], at(8000), spec="draft-mtp")
    assert to_json(older, [])["memory_model"]["priced_for"] == 9093  # the oldest build whose source was read
    same = plan(models["q35"], ["-c", "8192"], at(11434), spec="draft-mtp")
    assert to_json(same, [])["memory_model"]["differences"] == [] and same.memory_build.message is None  # type: ignore[union-attr]


def test_a_launch_on_one_build_calibrates_only_that_builds_plans(models: dict[str, Path]) -> None:
    """Calibration records carry the build: another build allocates otherwise, so its correction is its own."""
    from llamafit.memory.calibration import corrections, record

    model = load_model(models["qwen06b"])
    args = ["-c", "4096", "-np", "1"]

    def calibrated(build: int) -> Plan:
        a = parse_server_args(args)
        inputs = Inputs(at(build), calibrate=lambda s, devs: corrections(model, s, devs))
        return make_plan(model, Machine((), HOST), build_request(a), spec_options(a, mode="off"), inputs)

    old = calibrated(9310)
    measured = {b.buft: 1.5 * b.nbytes / 2**20 for b in old.footprint.buffers if b.kind == "compute"}
    record(
        model, old.settings, (), old.footprint, {"compute": measured}, {}, {"argv": ["llama-server", "-m", model.path]}
    )
    again, other = calibrated(9310), calibrated(11434)
    assert buffer(again, "target", "compute") > buffer(old, "target", "compute")  # its own record applies
    assert not other.calibrated_compute and other.decision("calibration.applied") is None


@pytest.mark.server
@pytest.mark.parametrize(
    ("ggml", "sure", "span", "priced"),
    [("0.12.0", "placed", [9114, 9325], 9325), ("0.13.1", "unknown", [9389, 9580], 11434)],
)
def test_a_build_that_says_build_0_is_placed_by_its_ggml(
    server_bin: ServerBinary, tmp_path: Path, ggml: str, sure: str, span: list[int], priced: int
) -> None:
    """A server from a tree without git says ``build 0``; the ggml library beside it still places it. 0.12.0
    shipped in b9114-b9325, where no rule changed for this model: priced with those builds' rules. 0.13.1 spans
    b9389-b9580, across the F16 mask (9415) and the outputs per slot (9464): b11434's rules, said so."""
    srv = wrapped(tmp_path, "llama-server", server_bin.path, server_bin.lib_dir,
                  version="version: 0.6.0-dev (build 0, commit unknown)")  # fmt: skip
    (tmp_path / f"libggml-base.so.{ggml}").write_bytes(b"")
    assert ggml_version(srv) == tuple(int(x) for x in ggml.split("."))
    r = CliRunner().invoke(app, ["plan", str(small_model(tmp_path)), "--cpu-only", "--server", srv, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    mm = doc["memory_model"]
    assert (mm["sure"], mm["placed_in"], mm["priced_for"], mm["server_build"]) == (sure, span, priced, None)
    assert any(f"its ggml {ggml} places it at b{span[0]}-b{span[1]}" in w for w in doc["warnings"])
    if sure == "placed":
        assert "logits reserved for every ubatch token" in mm["differences"]
    (tmp_path / "libggml-base.so.0.26.0").write_bytes(b"")  # two versions: it is not placed
    assert ggml_version(srv) is None


def small_model(tmp_path: Path) -> Path:
    return factory.qwen3_0_6b().write(tmp_path / "q.gguf")


def test_an_old_cuda_builds_log_does_not_lower_a_quantized_caches_compute(models: dict[str, Path]) -> None:
    """Before b9489 CUDA's pool took the F16 copies of a quantized K/V at run time (#23907): the logged compute
    buffer leaves them out, so a launch's record does not take them off the next plan; from b9489 it does."""
    from llamafit.devices.machine import Device
    from llamafit.memory.calibration import corrections, record
    from llamafit.units import MiB

    model = load_model(models["qwen06b"])
    machine = Machine((Device("CUDA0", "--gpu", 12 * GiB, 12 * GiB, source="override"),), HOST)
    a = parse_server_args(["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"])
    for build, lowered in ((9484, False), (9489, True)):
        p = make_plan(model, machine, build_request(a), spec_options(a, mode="off"), Inputs(at(build)))
        measured = {b.buft: 0.8 * b.nbytes / MiB for b in p.footprint.buffers if b.kind == "compute"}
        assert "CUDA0" in measured
        record(model, p.settings, ("CUDA0",), p.footprint, {"compute": measured}, {}, {"argv": ["llama-server"]})
        c = corrections(model, p.settings, ("CUDA0",))
        assert ("CUDA0" in c.compute_scale) == lowered, c
        assert any("CUDA pool" in n for n in c.notes) != lowered


def test_a_sliding_window_checkpoint_before_9479_holds_a_ubatch_more(tmp_path: Path) -> None:
    """9464 and older wrote every cell the SWA cache held for the sequence (no is_masked_swa filter in
    llama_kv_cache::state_write): the window and a ubatch not yet pruned. b9310's Gemma-3-4B checkpoint was
    174.02 MiB where b11434's is 116.01 (bench/results/accuracy-b9310.json): (1024 + 512) / 1024 of it."""
    from llamafit.memory.builds import CHECKPOINT_SWA_MASKED_SINCE
    from llamafit.memory.context import checkpoint_bytes

    m = factory.gemma3().write(tmp_path / "g.gguf")
    hp = load_model(m).hparams
    args = ["-c", "8192", "-np", "1"]
    old = plan(m, args, at(CHECKPOINT_SWA_MASKED_SINCE - 1)).footprint.context
    new = plan(m, args, at(CHECKPOINT_SWA_MASKED_SINCE)).footprint.context
    ratio = checkpoint_bytes(hp, old) / checkpoint_bytes(hp, new)
    assert abs(ratio - (hp.n_swa + old.n_ubatch) / hp.n_swa) < 1e-3  # the cells' rows; the headers are alike


def test_nemotron_h_selected_its_output_rows_in_the_last_layer_before_10355(tmp_path: Path) -> None:
    """Before 10355 nemotron-h.cpp took the output rows of the last layer's output and its residual (two
    get_rows in the layer); since, after the output norm. While every token is an output (before 9464) those
    are two ubatch-sized tensors at the peak: b9310 logs 291.00 MiB for Nemotron-Nano-9B-v2 at -c 32768, which
    the replay gives only with the rows in the layer (bench/results/accuracy-b9310.json)."""
    from llamafit.memory.builds import NEMOTRON_ROWS_AFTER_NORM_SINCE, rows_after_norm

    first = NEMOTRON_ROWS_AFTER_NORM_SINCE
    assert not rows_after_norm(first - 1, "nemotron_h") and rows_after_norm(first, "nemotron_h")
    assert not rows_after_norm(first - 1, "nemotron_h_moe") and rows_after_norm(first - 1, "llama")
    m = factory.nemotron_h(n_vocab=32000).write(tmp_path / "nh.gguf")
    args = ["-c", "4096", "-np", "1"]
    every_token = plan(m, args, at(OUTPUTS_PER_SLOT_SINCE - 11))  # 9453: its rows in the layer, all outputs
    model = load_model(m)
    # the same outputs (every token's: n_outputs_max 0), selected after the norm
    after_norm = estimate(model, replace(every_token.settings, build=first, n_outputs_max=0), ())
    in_layer = buffer(every_token, "target", "compute")
    assert in_layer > sum(b.nbytes for b in after_norm.buffers if b.kind == "compute")
