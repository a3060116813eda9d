"""llama.cpp RPC: real ggml-rpc-server processes on loopback, discovered, planned over, and loaded through."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.devices.rpc import parse_endpoints, rpc_devices
from llamafit.errors import UsageError
from llamafit.options import Options
from llamafit.planning import measure as measuring
from llamafit.planning.asked import read
from llamafit.planning.discover import machine_for
from llamafit.planning.planner import Planner, prepare
from llamafit.planning.resolve import resolve
from llamafit.server.binary import ServerBinary, free_port
from llamafit.serving.compare import compare
from llamafit.units import MiB
from tests import factory
from tests.realserver import read_until, run_argv

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rpc-models")
    # drafters in their own folder: beside the models, Auto would take them as sidecars (dflash-*, dspark-*)
    dd = tmp_path_factory.mktemp("rpc-drafters")
    return {
        "qwen06": factory.qwen3_0_6b().write(d / "qwen3-0.6b.gguf"),
        "gemma3": factory.gemma3().write(d / "gemma3.gguf"),
        "gpt_oss": factory.gpt_oss(n_layer=6).write(d / "gpt-oss.gguf"),
        "draft": factory.dense(name="draft", n_layer=2).write(d / "draft.gguf"),
        "mla": factory.deepseek2(n_layer=6, n_vocab=4096).write(d / "mla.gguf"),
        "hybrid": factory.qwen35().write(d / "hybrid.gguf"),
        "hybrid_moe": factory.qwen35(n_expert=8, name="hybrid-moe").write(d / "hybrid-moe.gguf"),
        "next": factory.qwen3next(name="next").write(d / "next.gguf"),
        "glm_dsa": factory.glm_dsa(name="glm-dsa", n_vocab=4096).write(d / "glm-dsa.gguf"),
        "dsv4": factory.deepseek4().write(d / "dsv4.gguf"),
        "dsv4_mtp": factory.deepseek4(n_nextn=1, name="dsv4-mtp").write(d / "dsv4-mtp.gguf"),
        "mamba2": factory.mamba2().write(d / "mamba2.gguf"),
        "mamba": factory.mamba().write(d / "mamba.gguf"),
        "lfm2": factory.lfm2().write(d / "lfm2.gguf"),
        "lfm2_swa": factory.lfm2(n_swa=512, name="lfm2-swa").write(d / "lfm2-swa.gguf"),
        "nemotron_h": factory.nemotron_h().write(d / "nemotron-h.gguf"),
        "lfm2moe": factory.lfm2(n_expert=8, name="lfm2moe").write(d / "lfm2moe.gguf"),
        "hybrid_mtp": factory.qwen35(n_nextn=1, name="hybrid-mtp").write(d / "hybrid-mtp.gguf"),
        "hybrid_moe_mtp": factory.qwen35(n_expert=8, n_nextn=1, name="hybrid-moe-mtp").write(d / "hybrid-moe-mtp.gguf"),
        "glm4moe_mtp": factory.glm4moe().write(d / "glm4moe-mtp.gguf"),
        "granite_h": factory.granite_hybrid().write(d / "granite-h.gguf"),
        "granite_h_moe": factory.granite_hybrid(n_expert=8, n_ff=128, n_ff_shexp=256, name="granite-h-moe").write(
            d / "granite-h-moe.gguf"
        ),
        "nemotron_h_moe": factory.nemotron_h(pattern="MEM*EM", latent=128, name="nemotron-h-moe").write(
            d / "nemotron-h-moe.gguf"
        ),
        "dflash": factory.dflash(
            n_layer=3, n_embd=1024, n_head=16, n_head_kv=8, n_ff=3072, target_layers=(1, 9, 17)
        ).write(dd / "dflash-qwen3-0.6b.gguf"),
        "dspark": factory.dflash(
            n_layer=3,
            n_embd=1024,
            n_head=16,
            n_head_kv=8,
            n_ff=3072,
            target_layers=(1, 9, 17),
            markov_rank=128,
            own_head=False,
            draft_vocab=32000,
            block_size=7,
        ).write(dd / "dspark-qwen3-0.6b.gguf"),
        "moe": factory.moe(
            name="moe", n_layer=8, n_embd=512, n_expert=16, n_expert_used=4, n_ff_exp=256, n_vocab=4096
        ).write(d / "moe.gguf"),
    }


def test_endpoints_accumulate_and_are_checked() -> None:
    assert parse_endpoints(["a:1,b:2", "a:1", "10.0.0.2:50052"]) == ["a:1", "b:2", "10.0.0.2:50052"]
    for bad in ("nohost", "h:0", "h:99999", "h:p", "a:b:c", "[zz]:5"):
        with pytest.raises(UsageError, match="is not host:port"):
            parse_endpoints([bad])
    for v6 in ("[::1]:50052", "::1", "fe80::2:50052"):  # llama.cpp cannot take IPv6 (it aborts)
        with pytest.raises(UsageError, match="cannot take an IPv6 address"):
            parse_endpoints([v6])
    with pytest.raises(UsageError, match="is a URL"):
        parse_endpoints(["http://10.0.0.2:50052"])
    text = (
        "Available devices:\n  RPC0: 10.0.0.2:50052 (24105 MiB, 23000 MiB free)\n"
        "  CUDA0: NVIDIA H200 (143 MiB, 1 MiB free)"
    )
    (dev,) = rpc_devices(text)
    assert (dev.id, dev.kind, dev.endpoint, dev.total, dev.free) == ("RPC0", "rpc", "10.0.0.2:50052", 24105 << 20,
                                                                     23000 << 20)  # fmt: skip


def test_devices_are_discovered_with_what_they_report(rpc_servers: list[str], server_bin: ServerBinary) -> None:
    r = CliRunner().invoke(app, ["gpus", "--rpc", ",".join(rpc_servers), "--json", "--server", server_bin.path])
    assert r.exit_code == 0, r.output
    devs = [g for g in json.loads(r.stdout)["gpus"] if g["kind"] == "rpc"]
    listed = subprocess.run([server_bin.path, "--rpc", ",".join(rpc_servers), "--list-devices"], env=server_bin.env(),
                            capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    expected = rpc_devices(listed)
    assert [(g["id"], g["endpoint"], g["total"]) for g in devs] == [(d.id, d.endpoint, d.total) for d in expected]
    assert [g["endpoint"] for g in devs] == rpc_servers


def test_the_devices_listed_while_a_command_starts_are_the_ones_its_plan_reads(
    rpc_servers: list[str], server_bin: ServerBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing started early (``start_listing``: before the command's imports) is the plan's own: no second
    listing, the same devices; one started for other endpoints is killed and not read; one nobody reads dies with
    llamafit."""
    from llamafit.devices import rpc

    env = server_bin.env()
    fresh = rpc.discover_rpc(rpc_servers, server_bin.path, env)
    started: list[list[str]] = []
    real = rpc.start_bounded

    def counted(argv: list[str], *, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
        started.append(argv)
        return real(argv, env=env)

    monkeypatch.setattr(rpc, "start_bounded", counted)
    rpc.start_listing(rpc_servers, server_bin.path, env)
    rpc.start_listing(rpc_servers, server_bin.path, env)  # started once
    assert len(started) == 1
    assert rpc.discover_rpc(rpc_servers, server_bin.path, env).devices == fresh.devices
    assert len(started) == 1 and not rpc._EARLY  # read, not listed again
    rpc.start_listing(rpc_servers[:1], server_bin.path, env)
    ((other, _),) = rpc._EARLY.values()
    assert rpc.discover_rpc(rpc_servers, server_bin.path, env).devices == fresh.devices
    assert len(started) == 3 and other.poll() is not None and not rpc._EARLY  # killed, and these listed now
    code = (
        "import sys\n"
        "from llamafit.devices.rpc import _EARLY, start_listing\n"
        f"start_listing({rpc_servers!r}, {server_bin.path!r}, {env!r})\n"
        "print(next(iter(_EARLY.values()))[0].pid)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with pytest.raises(ProcessLookupError):  # killed and reaped at exit, not left running
        os.kill(int(r.stdout), 0)


def test_an_unreachable_server_is_named(rpc_servers: list[str], server_bin: ServerBinary, tmp_path: Path,
                                        models: dict[str, Path]) -> None:  # fmt: skip
    dead = f"127.0.0.1:{free_port()}"
    r = CliRunner().invoke(app, ["plan", str(models["qwen06"]), "--rpc", dead, "--server", server_bin.path])
    assert r.exit_code == 8 and dead in r.output and "--rpc-optional" in r.output
    r = CliRunner().invoke(app, ["run", str(models["qwen06"]), "--dry-run", "--rpc", f"{rpc_servers[0]},{dead}",
                                 "--rpc-optional", "--server", server_bin.path])  # fmt: skip
    assert r.exit_code == 0, r.output
    argv = r.stdout.split()
    assert argv[argv.index("--rpc") + 1] == rpc_servers[0] and dead not in r.stdout
    assert "unreachable" in r.stderr


def test_rpc_devices_come_first_and_take_what_the_local_card_cannot(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    r = CliRunner().invoke(app, ["plan", str(models["qwen06"]), "--json", "--gpu", "2GiB", "--rpc",
                                 ",".join(rpc_servers), "--server", server_bin.path, "--", "-c", "8192"])  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [d["id"] for d in doc["devices"]] == ["RPC0", "RPC1", "CUDA0"]  # llama.cpp's order (src/llama.cpp:272)
    assert [d["kind"] for d in doc["devices"]] == ["rpc", "rpc", "gpu"]
    assert all(d["fits"] for d in doc["devices"])
    # the local card is filled first; only the overflow goes over the network
    layers = {d["id"]: d["layers"] for d in doc["devices"]}
    assert layers["CUDA0"] > 0 and layers["RPC0"] + layers["RPC1"] > 0
    assert doc["devices"][2]["use"]["kv"] + doc["devices"][2]["use"]["model"] > 0
    argv = doc["argv"]
    assert argv[1] == "--rpc"  # before any -dev/-ts naming its devices
    assert len(argv[argv.index("-ts") + 1].split(",")) == 3  # over the full device list
    note = next(d["message"] for d in doc["decisions"] if d["code"] == "rpc.network")
    assert "activations cross the network" in note and "->CUDA0" in note


def test_the_drafter_stays_local_unless_asked(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    base = ["plan", str(models["qwen06"]), "--json", "--rpc", ",".join(rpc_servers), "--server", server_bin.path,
            "--draft", str(models["draft"]), "--spec", "draft-simple"]  # fmt: skip
    doc = json.loads(CliRunner().invoke(app, base).stdout)
    argv = doc["argv"]
    assert argv[argv.index("-devd") + 1] == "none"  # no local GPU here: the drafter runs on the CPU
    asked = json.loads(CliRunner().invoke(app, [*base, "--", "-devd", "RPC1"]).stdout)["argv"]
    assert asked[asked.index("-devd") + 1] == "RPC1" and asked.count("-devd") == 1


@pytest.mark.parametrize(("model", "args"), [("qwen06", ["-c", "4096", "-ts", "1,1"]),
                                             ("qwen06", ["-c", "8192", "-ub", "256", "-ts", "3,2"]),
                                             ("gemma3", ["-c", "4096", "-np", "2", "-ts", "1,1"]),
                                             ("qwen06", ["-c", "4096"])])  # fmt: skip
def test_loaded_through_rpc_the_buffers_match_the_plan(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path], model: str, args: list[str]
) -> None:
    prep = prepare(str(models[model]), Options(server_args=args, rpc=[",".join(rpc_servers)], server=server_bin.path,
                                               calibrate=False))  # fmt: skip
    log = run_argv(server_bin, prep.argv[1:])
    rows = compare(prep.plan.footprint, log, "target", prep.plan.buffer_aliases)
    by = {(r.kind, r.buft): r for r in rows}
    # with -ts both servers hold layers; left to llamafit, the whole model goes to the last one (one hop)
    for dev in ("RPC0", "RPC1") if "-ts" in args else ("RPC1",):
        for kind in ("model", "kv", "compute"):
            r = by[(kind, dev)]
            assert r.actual_mib is not None and r.within, r
    assert all(r.within for r in rows), [r for r in rows if not r.within]


SPLITS = [
    # (model, flags); "{rpc1}" is the second device's buffer type as llama-server names it
    ("moe", ["-c", "4096", "-ngl", "all", "-ts", "5,3", "--n-cpu-moe", "3"]),  # experts on the CPU, full offload
    ("moe", ["-c", "4096", "-np", "2", "-ngl", "all", "-ts", "5,3", "--n-cpu-moe", "2", "-ot",
             r"blk\.2\.ffn_(gate|down)_(ch|)exps=CPU,blk\.4\.ffn_down_(ch|)exps={rpc1}"]),  # parts, a spill
    ("qwen06", ["-c", "4096", "-ngl", "20", "-ts", "3,2"]),  # layers on the CPU (no full offload)
    ("qwen06", ["-c", "4096", "-ngl", "25", "-ts", "3,2", "-fa", "off"]),
    ("gemma3", ["-c", "4096", "-np", "2", "-ngl", "5", "-ts", "1,1"]),  # sliding window, partial
    ("gpt_oss", ["-c", "4096", "-ngl", "5", "-ts", "1,1", "--n-cpu-moe", "1"]),  # sinks, biased experts, partial
    ("gpt_oss", ["-c", "4096", "-np", "2", "-ts", "1,1", "-fa", "off"]),  # pipeline parallelism
    ("mla", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),  # MLA, experts on the CPU
    ("mla", ["-c", "4096", "-ngl", "3", "-ts", "1,1", "-fa", "off"]),
    ("hybrid", ["-c", "4096", "-ngl", "5", "-ts", "1,1"]),  # gated delta-net + attention, partial
    ("hybrid", ["-c", "4096", "-np", "2", "-ngl", "4", "-ts", "2,1", "-fa", "off"]),
    ("hybrid_moe", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),  # gated shared expert
    ("next", ["-c", "4096", "-ngl", "5", "-ts", "1,1", "-fa", "off"]),  # ssm_in, ssm_ba, repeated q/k
    ("glm_dsa", ["-c", "4096", "-ngl", "3", "-ts", "1,1"]),  # the lightning indexer and its cache, partial
    ("dsv4", ["-c", "4096", "-ngl", "3", "-ts", "1,1"]),  # hyper-connections, compressors, indexer, partial
    ("dsv4", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),  # hash-routed experts on the CPU
    ("mamba2", ["-c", "4096", "-np", "2", "-ngl", "3", "-ts", "1,1"]),  # pure recurrent, partial
    ("mamba", ["-c", "4096", "-ngl", "3", "-ts", "2,1"]),
    ("lfm2_swa", ["-c", "4096", "-ngl", "5", "-ts", "2,1"]),  # short convolutions, windowed attention, partial
    ("nemotron_h", ["-c", "4096", "-ngl", "5", "-ts", "2,1", "-fa", "off"]),  # Mamba-2, attention, MLP, partial
    ("lfm2moe", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),  # experts on the CPU
    ("nemotron_h_moe", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "1"]),  # latent experts, CPU
    ("granite_h_moe", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),  # Granite's scales, experts
    ("granite_h", ["-c", "4096", "-np", "2", "-ts", "1,1"]),
    # a full offload without overrides: pipeline parallelism (four copies of every input)
    ("qwen06", ["-c", "4096", "-ts", "3,2"]),
    ("qwen06", ["-c", "8192", "-ub", "256", "-ts", "1,1", "-fa", "off"]),
    ("moe", ["-c", "4096", "-np", "2", "-ts", "5,3"]),
    ("gemma3", ["-c", "4096", "-np", "2", "-ts", "1,1"]),
    ("mla", ["-c", "4096", "-ts", "1,1"]),
    ("hybrid", ["-c", "4096", "-ts", "1,1"]),
    ("next", ["-c", "4096", "-np", "2", "-ts", "1,1"]),
    ("glm_dsa", ["-c", "4096", "-np", "2", "-ts", "1,1"]),
    ("dsv4", ["-c", "4096", "-ts", "1,1"]),
    ("mamba2", ["-c", "4096", "-ts", "1,1"]),
    ("lfm2", ["-c", "4096", "-np", "2", "-ts", "1,1", "-fa", "off"]),
    ("nemotron_h", ["-c", "4096", "-np", "2", "-ts", "1,1"]),
    # backend sampling: 130 verification rows, each sampler chain's ops and its random input per row
    ("qwen06", ["-c", "4096", "-bs", "-ngl", "20", "-ts", "3,2", "--spec-type", "ngram-mod", "-np", "2"]),
    ("qwen06", ["-c", "4096", "-bs", "-ts", "1,1", "-np", "2", "--spec-type", "ngram-mod"]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "args"), SPLITS)
def test_split_over_backends_the_compute_buffers_are_the_logged_ones(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path], model: str, args: list[str]
) -> None:
    """Each backend's compute buffer is its share of the scheduler's splits plus the copies of their inputs
    (with pipeline parallelism four of each, and of every graph input); the replay of the scheduler
    (llamafit.memory.graph.sched) holds every device's and the host's to the log."""
    args = [a.replace("{rpc1}", f"RPC0[{rpc_servers[1]}]") for a in args]
    prep = prepare(str(models[model]), Options(server_args=args, rpc=[",".join(rpc_servers)], server=server_bin.path,
                                               calibrate=False))  # fmt: skip
    assert prep.plan.footprint.pipeline_parallel == ("-ngl" not in args and "-ot" not in args and "-ncmoe" not in args)
    log = run_argv(server_bin, prep.argv[1:])
    rows = [r for r in compare(prep.plan.footprint, log, "target", prep.plan.buffer_aliases) if r.kind == "compute"]
    assert {r.buft for r in rows if r.actual_mib} == {"RPC0", "RPC1", "CPU"}
    for r in rows:
        assert r.actual_mib is not None and abs(r.predicted / MiB - r.actual_mib) <= 0.006, r


@pytest.mark.parametrize("model", ["lfm2", "nemotron_h", "granite_h"])
def test_auto_flash_attention_goes_off_where_the_scheduler_moves_a_layers_attention(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path], model: str
) -> None:
    """With -ngl 4 the first attention layer stays on the host, and the next recurrent layer gathers its states
    on RPC0 right after its attention in the graph: the scheduler expands RPC0 up onto that attention, so
    resolve_fused_ops turns -fa auto off (llama-context.cpp:509-562), with V still untransposed in the cache.
    The plan resolves it the same way and its compute buffers are those of that graph (RPC0's is 6x what flash
    attention takes); with every layer offloaded flash attention stays on."""
    for ngl, fa in (("4", False), ("all", True)):
        args = ["-c", "4096", "-ngl", ngl, "-ts", "1,1"]
        prep = prepare(str(models[model]), Options(server_args=args, rpc=[",".join(rpc_servers)],
                                                   server=server_bin.path, calibrate=False))  # fmt: skip
        assert prep.plan.footprint.flash_attn is fa
        assert ("memory.flash_attn" in {d.code for d in prep.plan.decisions}) is not fa  # said, with the way out
        log = run_argv(server_bin, prep.argv[1:])
        ctx = log.context("target")
        assert ctx is not None and ctx.flash_attn is fa  # "Flash Attention enabled" / "not supported"
        rows = [r for r in compare(prep.plan.footprint, log, "target", prep.plan.buffer_aliases) if r.kind == "compute"]
        for r in rows:
            assert r.actual_mib is not None and abs(r.predicted / MiB - r.actual_mib) <= 0.006, (ngl, r)


MTP_SPLITS = [
    ("hybrid_mtp", ["-c", "4096", "-ts", "1,1"]),  # pipeline parallelism: the head's context too
    ("hybrid_mtp", ["-c", "8192", "-np", "2", "-ts", "2,1", "-fa", "off"]),
    ("hybrid_moe_mtp", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),
    ("glm4moe_mtp", ["-c", "4096", "-ngl", "5", "-ts", "1,1"]),  # the trunk partly on the host
    ("dsv4_mtp", ["-c", "4096", "-ts", "1,1"]),  # DeepSeek-V4's NextN block, pipeline parallelism
    ("dsv4_mtp", ["-c", "4096", "-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),
]


@pytest.mark.parametrize(("model", "args"), MTP_SPLITS)
def test_an_mtp_heads_context_over_devices_is_the_scheduler_replay(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path], model: str, args: list[str]
) -> None:
    """The MTP context's graph (the NextN layer's token rows, hidden state, eh_proj, block, head) replayed
    through the scheduler with each weight where the target placed it: every device's and the host's compute
    equal to the log (the per-phase estimate was 7-18 % under on the device, over on the host)."""
    opts = Options(
        server_args=args, rpc=[",".join(rpc_servers)], server=server_bin.path, calibrate=False, spec="draft-mtp"
    )
    prep = prepare(str(models[model]), opts)
    log = run_argv(server_bin, prep.argv[1:])
    for context, fp in (("target", prep.plan.footprint), ("mtp", prep.plan.draft_footprint)):
        assert fp is not None
        rows = [r for r in compare(fp, log, context, prep.plan.buffer_aliases) if r.kind == "compute"]
        assert any(r.buft.startswith("RPC") for r in rows), context
        for r in rows:
            assert r.actual_mib is not None and abs(r.predicted / MiB - r.actual_mib) <= 0.006, (context, r)


DRAFTERS = [
    ("dflash", ["-c", "4096", "-devd", "RPC1"]),
    ("dflash", ["-c", "4096", "-devd", "RPC1", "-fa", "off", "-np", "2"]),
    ("dflash", ["-c", "4096", "-devd", "RPC1", "-ngld", "2"]),  # a layer and the head on the CPU
    ("dflash", ["-c", "4096", "-devd", "RPC0,RPC1"]),  # the target's -ts over the drafter's devices
    ("dspark", ["-c", "4096", "-devd", "RPC1"]),
    ("dspark", ["-c", "4096", "-devd", "RPC1", "-ub", "16", "-np", "4"]),  # the Markov head in the graph
]


@pytest.mark.parametrize(("draft", "args"), DRAFTERS)
def test_a_block_drafter_on_remote_devices_is_priced_as_loaded(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path], draft: str, args: list[str]
) -> None:
    """DFlash and DSpark drafters on RPC devices: their graph (the target's token rows and head, the d2t
    scatter, the Markov head, the backend samplers) replayed through the scheduler, each buffer equal to
    the log. The drafter inherits the target's -ts (common_base_params_to_speculative): with two draft
    devices and a target on one, the whole drafter goes where the target is (it was priced as split)."""
    spec = "draft-dspark" if draft == "dspark" else "draft-dflash"
    prep = prepare(str(models["qwen06"]), Options(server_args=args, rpc=[",".join(rpc_servers)], server=server_bin.path,
                                                  calibrate=False, draft=str(models[draft]), spec=spec))  # fmt: skip
    log = run_argv(server_bin, prep.argv[1:])
    for context, fp in (("target", prep.plan.footprint), ("draft", prep.plan.draft_footprint)):
        assert fp is not None
        rows = compare(fp, log, context, prep.plan.buffer_aliases)
        assert any(r.kind == "compute" and r.buft == "RPC1" for r in rows), context
        for r in rows:
            assert r.actual_mib is not None and r.within, (context, r)
            if r.kind == "compute":
                assert abs(r.predicted / MiB - r.actual_mib) <= 0.006, (context, r)


def test_run_over_rpc_reports_each_remote_device(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    env = dict(os.environ, LLAMAFIT_SERVER=server_bin.path)
    argv = [sys.executable, "-m", "llamafit", "run", str(models["qwen06"]), "--json", "--rpc", ",".join(rpc_servers),
            "--", "--port", str(free_port()), "--no-warmup", "-c", "4096", "-ts", "1,1"]  # fmt: skip
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None
    ok, lines = read_until(p.stdout, '"memory"', timeout=120)
    p.send_signal(2)
    rest = p.stdout.read()
    p.wait(timeout=60)
    assert ok and p.returncode == 0
    doc = json.loads("".join(lines) + rest)
    bufts = {m["buffer"] for m in doc["memory"]}
    assert {"RPC0", "RPC1"} <= bufts  # the logged RPC0[host:port] names, mapped to the plan's devices
    assert all(m["within_tolerance"] for m in doc["memory"]), doc["memory"]
    assert {d["endpoint"] for d in doc["plan"]["devices"]} == set(rpc_servers)


def test_backend_sampling_falls_back_to_the_host_under_tensor_split(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    """llama_context::set_sampler keeps the samplers on the host under -sm tensor: the output buffer has
    no sampled rows' buffers (4x the logits with them). (The Meta device's own buffers: tests/test_tensor_split.py.)"""
    args = ["-c", "4096", "-bs", "-sm", "tensor", "-ts", "1,1", "-np", "2", "--spec-type", "ngram-mod"]
    prep = prepare(str(models["qwen06"]), Options(server_args=args, rpc=[",".join(rpc_servers)], server=server_bin.path,
                                                  calibrate=False))  # fmt: skip
    log = run_argv(server_bin, prep.argv[1:])
    rows = [r for r in compare(prep.plan.footprint, log, "target", prep.plan.buffer_aliases) if r.kind == "output"]
    assert len(rows) == 1 and rows[0].actual_mib is not None and rows[0].within, rows


def test_an_rpc_server_nobody_measured_has_a_speed_with_its_range_but_does_not_choose(
    rpc_servers: list[str], server_bin: ServerBinary, models: dict[str, Path]
) -> None:
    """LLAMAFIT_PROBE=off (the tests' default): the plan's speed is priced with what is assumed of the RPC server
    (anything from a desktop's host to a card of its memory), wide, said so; the choice did not weigh it."""
    o = Options(server=server_bin.path, rpc=(rpc_servers[0],), server_args=("-ngl", "10"))
    prep = prepare(str(models["qwen06"]), o)
    sp = prep.plan.speed
    assert sp is not None and sp.tg is not None and sp.pp is not None and sp.tg_range is not None
    lo, hi = sp.tg_range
    assert lo < sp.tg < hi and hi / lo > 5  # a remote device of unknown kind: a wide range, not a number alone
    said = [u for u in sp.unknown if u.startswith("not measured: RPC0: an RPC server not measured")]
    assert said and "GiB card assumed" in said[0] and "llama-bench beside the server measures it" in said[0]
    # what the choice weighed: the host and nothing of the RPC server (it ranks the placements by the host's reads)
    planner = Planner.for_options(o)
    asked = read(o, planner.caps, planner.hub)
    mach, asked = machine_for(planner.machine, asked, planner.server, o)
    res = resolve(str(models["qwen06"]), o, asked, planner.hub, None)
    source = measuring.rate_source(mach, res, planner.server, o)
    assert "RPC0" not in measuring.before_fit(source, mach, res).rates
    assert "RPC0" in source.measured(["RPC0"], measure=False, priced=True).rates
