"""The multimodal projector (--mmproj): read, placed where clip.cpp puts it, priced, compared with the log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.machine import Device, Host, Machine
from llamafit.errors import BadModelFileError, UsageError
from llamafit.fit import Inputs, make_plan
from llamafit.fit.plan import to_json
from llamafit.fit.request import build_request
from llamafit.gguf.mmproj import Projector, read_projector
from llamafit.gguf.model import load_model
from llamafit.memory.mmproj import vit_compute_bytes, warmup_side
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.server.logparse import parse
from llamafit.serving.compare import compare_mmproj
from llamafit.units import GiB, MiB
from tests import factory
from tests.realserver import run_argv

HOST = Host(total=64 * GiB, available=48 * GiB)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mmproj")
    return {
        "text": factory.gemma3().write(d / "gemma3.gguf"),
        "small": factory.siglip_mmproj(text_embd=256).write(d / "mmproj-small.gguf"),
        "merge3": factory.siglip_mmproj(
            text_embd=256, n_embd=192, n_head=6, n_ff=768, image_size=336, merge=3, name="merge3"
        ).write(d / "mmproj-merge3.gguf"),
        "g3_896": factory.gemma3_siglip_896(256).write(d / "mmproj-896.gguf"),
        "wrong_embd": factory.siglip_mmproj(text_embd=512).write(d / "mmproj-512.gguf"),
    }


def _proj(**kw: object) -> Projector:
    base: dict[str, object] = dict(path="p", name="p", projector="gemma3", has_vision=True, has_audio=False,
                                   weights=0, n_embd=1152, n_ff=4304, n_head=16, n_layer=27, image_size=896,
                                   patch_size=14)  # fmt: skip
    base.update(kw)
    return Projector(**base)  # type: ignore[arg-type]


def test_read_projector(files: dict[str, Path]) -> None:
    p = read_projector(files["g3_896"])
    assert (p.projector, p.n_embd, p.n_layer, p.image_size, p.patch_size, p.n_merge) == ("gemma3", 1152, 27, 896, 14, 4)
    # the file's tensor bytes, which clip.cpp logs as "model size" (796.44 MiB for Gemma 3's tower)
    assert round(p.weights / MiB, 2) == 796.44


def test_a_text_model_is_not_a_projector(files: dict[str, Path]) -> None:
    with pytest.raises(BadModelFileError, match="not a multimodal projector"):
        read_projector(files["text"])


def test_warmup_image_follows_each_projectors_rule() -> None:
    assert warmup_side(_proj()) == 896  # gemma3: the tower's image size
    qwen = _proj(projector="qwen2.5vl_merger", image_size=1024, n_merge=2)
    assert warmup_side(qwen) == 46 * 14 * 2  # set_warmup_n_tokens(46*46)
    assert warmup_side(qwen, image_max_tokens=1024) == 32 * 14 * 2  # capped by --image-max-tokens
    lfm2 = _proj(projector="lfm2", patch_size=16, n_merge=2)
    assert warmup_side(lfm2) == 16 * 16 * 2  # set_limit_image_tokens(64, 256): sqrt(256 x patch area)
    assert warmup_side(_proj(projector="gemma4uv", patch_size=16, n_merge=3)) == 16 * 48  # merge folded in the patch
    assert warmup_side(_proj(has_vision=False)) == 0


def test_compute_terms() -> None:
    p = _proj()
    n_pos, row = 64 * 64, 64 * 64 * 1152 * 4
    # the FFN phase dominates Gemma 3's tower: residual, normed input and output plus the n_ff activation
    assert vit_compute_bytes(p, 896, True) == 3 * row + n_pos * 4304 * 4
    # without flash attention the n_head x n_pos^2 scores are allocated in full
    assert vit_compute_bytes(p, 896, False) == 6 * row + 16 * n_pos * n_pos * 4
    assert vit_compute_bytes(_proj(gated=True), 896, True) == 3 * row + 2 * n_pos * 4304 * 4


_gpu = factory.gpu


def _plan(files: dict[str, Path], gpus: list[Device], args: list[str], mm: str = "g3_896"):  # type: ignore[no-untyped-def]
    model = load_model(files["text"])
    req = build_request(parse_server_args(["--mmproj", str(files[mm]), *args]))
    return make_plan(model, Machine(tuple(gpus), HOST), req, inputs=Inputs(mmproj=read_projector(files[mm])))


def test_placement_follows_clip_cpp(files: dict[str, Path]) -> None:
    p = _plan(files, [_gpu(0, 24), _gpu(1, 24)], [])
    assert p.mmproj is not None and p.mmproj.device == "CUDA0"  # the first GPU
    dev = {d.device.id: d for d in p.devices}
    assert dev["CUDA0"].use.mmproj == p.mmproj.weights + p.mmproj.compute and dev["CUDA1"].use.mmproj == 0
    assert p.decision("mmproj.placed") is not None
    assert _plan(files, [_gpu(0, 24), _gpu(1, 24)], ["-mmdev", "CUDA1"]).mmproj.device == "CUDA1"
    assert _plan(files, [_gpu(0, 24), _gpu(1, 24)], ["-dev", "CUDA1"]).mmproj.device == "CUDA1"
    off = _plan(files, [_gpu(0, 24)], ["--no-mmproj-offload"])
    assert off.mmproj.device == "CPU" and off.host.use.mmproj == off.mmproj.weights + off.mmproj.compute
    with pytest.raises(UsageError, match="no such device"):
        _plan(files, [_gpu(0, 24)], ["-mmdev", "CUDA7"])


def test_the_projector_takes_its_room_from_the_context(files: dict[str, Path], tmp_path: Path) -> None:
    model = load_model(factory.llama31_8b().write(tmp_path / "l8b.gguf"))
    proj = factory.siglip_mmproj(text_embd=4096, n_embd=1152, n_head=16, n_ff=4304, n_layer=27, image_size=896)
    projector = read_projector(proj.write(tmp_path / "mm.gguf"))
    machine = Machine((_gpu(0, 8),), HOST)
    without = make_plan(model, machine, build_request(parse_server_args([])))
    req = build_request(parse_server_args(["--mmproj", projector.path]))
    with_mm = make_plan(model, machine, req, inputs=Inputs(mmproj=projector))
    assert with_mm.mmproj is not None and with_mm.mmproj.device == "CUDA0"
    assert with_mm.n_ctx < without.n_ctx
    # the projector's bytes come out of the KV cache: the difference is at least its weights and compute
    kv_lost = without.devices[0].use.kv - with_mm.devices[0].use.kv
    assert kv_lost >= with_mm.mmproj.weights + with_mm.mmproj.compute - 64 * MiB
    assert all(d.fits for d in with_mm.devices) and not with_mm.warnings


def test_no_room_on_the_gpu_says_how_to_keep_the_projector_off_it(files: dict[str, Path]) -> None:
    """A card too small for the projector and its own buffers: the load goes without it (-dev none, the
    projector with it), and the plan says how to keep the projector on the CPU and the card for layers."""
    p = _plan(files, [_gpu(0, 2.0)], [])
    d = p.decision("placement.cpu")
    assert p.fits and p.mmproj.device == "CPU" and d is not None and "--no-mmproj-offload" in d.message
    kept = _plan(files, [_gpu(0, 2.0)], ["--no-mmproj-offload"])
    assert kept.mmproj.device == "CPU" and kept.placement_code != "placement.cpu"


def test_a_projector_for_another_model_is_flagged(files: dict[str, Path]) -> None:
    p = _plan(files, [], [], mm="wrong_embd")
    assert any("n_embd 512" in w for w in p.warnings)


def test_plan_json_has_the_projector(files: dict[str, Path]) -> None:
    p = _plan(files, [_gpu(0, 24)], ["-fa", "off"])
    doc = to_json(p, ["llama-server"])
    m = doc["mmproj"]
    assert m["device"] == "CUDA0" and m["warmup_image"] == 896 and m["flash_attn"] is False
    assert m["compute"] == vit_compute_bytes(read_projector(files["g3_896"]), 896, False)
    assert doc["devices"][0]["use"]["mmproj"] == m["weights"] + m["compute"]
    assert any("attention scores" in w for w in doc["warnings"])


def test_cli_errors_for_bad_projectors(files: dict[str, Path], tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["plan", str(files["text"]), "--", "--mmproj", str(files["text"])])
    assert r.exit_code == 7 and "not a multimodal projector" in r.output
    r = CliRunner().invoke(app, ["plan", str(files["text"]), "--", "--mmproj", str(tmp_path / "none.gguf")])
    assert r.exit_code == 4 and "mmproj file not found" in r.output
    r = CliRunner().invoke(app, ["plan", str(files["text"]), "--json", "--", "--mmproj-url", "https://x/y.gguf"])
    assert r.exit_code == 0 and any("not sized" in w for w in json.loads(r.stdout)["warnings"])


def test_the_fit_measurement_is_not_a_load() -> None:
    lines = [
        "I clip_ctx: CLIP using CPU backend",  # the server's --fit dry run, before the model loads
        "I load_hparams: model size:         10.00 MiB",
        "I reserve_compute_meta:        CPU compute buffer size =   5.00 MiB",
        "I llama_context: constructing llama_context",
        "I clip_ctx: CLIP using CUDA0 backend",
        "I load_hparams: model size:         10.00 MiB",
        "I reserve_compute_meta:      CUDA0 compute buffer size =   4.00 MiB",
        "I reserve_compute_meta:      CUDA0 compute buffer size =   6.00 MiB",  # re-reserved without FA
        "I warmup: flash attention is disabled",
    ]
    log = parse(lines)
    assert len(log.mmproj) == 1
    c = log.mmproj[0]
    assert c.backend == "CUDA0" and c.weights_mib == 10.0 and c.compute == {"CUDA0": 6.0} and c.flash_attn is False


@pytest.mark.server
@pytest.mark.parametrize("fa", ["auto", "off"])
@pytest.mark.parametrize("mm", ["small", "merge3", "g3_896"])
def test_projector_matches_the_server(server_bin: ServerBinary, files: dict[str, Path], mm: str, fa: str) -> None:
    p = _plan(files, [], ["-fa", fa, "-c", "4096"], mm=mm)
    assert p.mmproj is not None
    log = run_argv(server_bin, ["-m", str(files["text"]), "-fit", "off", "-c", "4096", "-fa", fa, "--mmproj",
                                str(files[mm])], warmup=True)  # fmt: skip
    rows = compare_mmproj(p.mmproj, log)
    assert {(r.kind, r.buft) for r in rows} == {("model", "CPU"), ("compute", "CPU")}
    for r in rows:
        assert r.actual_mib is not None and abs(r.predicted / MiB - r.actual_mib) <= 0.0051, r
    assert log.mmproj[-1].flash_attn is (fa != "off")


@pytest.mark.server
def test_wrong_projector_is_explained(server_bin: ServerBinary, files: dict[str, Path]) -> None:
    r = CliRunner().invoke(app, ["run", str(files["text"]), "--server", server_bin.path, "--", "--mmproj",
                                 str(files["wrong_embd"]), "--port", "0"])  # fmt: skip
    assert r.exit_code == 5, r.output
    assert "could not load the multimodal projector" in r.output and "mismatch" in r.output
