"""Host memory at run time: context checkpoints held to the server's own "created context checkpoint"
lines, the prompt cache to its "cache state" lines, and the fit choosing --ctx-checkpoints/--cache-ram
so the host never runs out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llamafit.devices.machine import Device, Host, Machine
from llamafit.fit import make_plan
from llamafit.fit.plan import Plan, to_json
from llamafit.fit.request import build_request
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.memory.context import checkpoint_bytes, draft_checkpoint_bytes
from llamafit.server.args import compose, parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.speculative import spec_options
from llamafit.units import GiB, MiB
from tests import factory
from tests.realserver import CREATED_CHECKPOINT, chat_log

CHECKPOINT_TOKENS = re.compile(r"created context checkpoint .*n_tokens = (?P<n>\d+), size = (?P<mib>[\d.]+) MiB")
CACHE_STATE = re.compile(r"cache state: (?P<n>\d+) prompts, (?P<mib>[\d.]+) MiB \(limits: (?P<limit>[\d.]+) MiB")


def plan(model: ModelInfo, args: list[str], host: Host, gpus: tuple[Device, ...] = ()) -> Plan:
    user = parse_server_args(args)
    return make_plan(model, Machine(gpus, host), build_request(user), spec_options(user, mode="off"))


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rt")
    return {
        "gemma3": factory.gemma3().write(d / "gemma3.gguf"),  # sliding window: the SWA cells
        "hybrid": factory.qwen35().write(d / "hybrid.gguf"),  # recurrent state rows
        "mamba": factory.mamba().write(d / "mamba.gguf"),
    }


GROWING = [" hello world" * 60 * k for k in (1, 2, 3)]


@pytest.mark.server
@pytest.mark.parametrize(
    ("shape", "args"),
    [
        ("gemma3", ["-c", "8192", "-np", "1"]),
        ("gemma3", ["-c", "8192", "-np", "2"]),
        ("gemma3", ["-c", "8192", "-np", "2", "-no-kvu"]),
        ("gemma3", ["-c", "8192", "-np", "1", "-fa", "off"]),
        ("gemma3", ["-c", "8192", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"]),
        ("hybrid", ["-c", "8192", "-np", "1"]),
        ("hybrid", ["-c", "8192", "-np", "2"]),
        ("mamba", ["-c", "4096", "-np", "1"]),
    ],
)
def test_a_checkpoint_is_the_size_the_server_logs(
    server_bin: ServerBinary, shapes: dict[str, Path], shape: str, args: list[str]
) -> None:
    model = load_model(shapes[shape])
    p = plan(model, args, Host(64 * GiB, 60 * GiB))
    lines = chat_log(server_bin, shapes[shape], [*args, "--checkpoint-min-step", "64"], GROWING)
    logged = [float(m["mib"]) for line in lines if (m := CREATED_CHECKPOINT.search(line))]
    assert logged, "no checkpoint was created"
    # a checkpoint holds the sequence's cells the window keeps: the largest once a prompt passes it
    predicted = checkpoint_bytes(model.hparams, p.footprint.context) / MiB
    assert max(logged) == pytest.approx(predicted, abs=0.0006), (logged, predicted)
    assert p.host.runtime is not None and p.host.runtime.checkpoint == checkpoint_bytes(
        model.hparams, p.footprint.context
    )


@pytest.mark.server
def test_a_draft_models_sequence_is_saved_with_each_checkpoint(
    server_bin: ServerBinary, shapes: dict[str, Path], tmp_path: Path
) -> None:
    """With a separate draft model the checkpoint also holds the drafter's state; a plain KV cache has no
    partial state, so its whole sequence is written: it grows with the prompt, and the plan prices it at
    a full context."""
    draft = factory.dense(name="draft").write(tmp_path / "draft.gguf")  # the same vocabulary as gemma3
    args = ["-c", "8192", "-np", "1", "-md", str(draft), "--spec-type", "draft-simple"]
    user = parse_server_args(args)
    target = load_model(shapes["gemma3"])
    p = make_plan(target, Machine((), Host(64 * GiB, 60 * GiB)), build_request(user), spec_options(user, mode="auto"))
    assert p.draft_footprint is not None
    dhp, dcp = load_model(draft).hparams, p.draft_footprint.context
    lines = chat_log(server_bin, shapes["gemma3"], [*args, "--checkpoint-min-step", "64"], GROWING)
    found = [(int(m["n"]), float(m["mib"])) for line in lines if (m := CHECKPOINT_TOKENS.search(line))]
    # once a prompt passes the window the target's part is its window (the test above), the drafter's grows
    found = [(n, mib) for n, mib in found if n >= target.hparams.n_swa]
    assert len(found) >= 3, "too few checkpoints were created"
    own = checkpoint_bytes(target.hparams, p.footprint.context)
    for n_tokens, mib in found:
        predicted = own + draft_checkpoint_bytes(dhp, dcp, n_tokens)
        assert mib == pytest.approx(predicted / MiB, abs=0.0006), (n_tokens, mib, predicted / MiB)
    assert p.host.runtime is not None
    assert p.host.runtime.checkpoint == own + draft_checkpoint_bytes(dhp, dcp) > max(m for _, m in found) * MiB


@pytest.mark.server
def test_the_prompt_cache_stays_within_what_the_plan_prices(server_bin: ServerBinary, shapes: dict[str, Path]) -> None:
    args = ["-c", "4096", "-np", "2", "--cache-ram", "1"]
    p = plan(load_model(shapes["gemma3"]), args, Host(64 * GiB, 60 * GiB))
    assert p.host.runtime is not None and p.host.runtime.prompt_cache == 1 * MiB
    # different prompts on alternating slots: each new task saves the idle slot into the cache
    prompts = [f" topic {i}" + " hello world" * (40 + 10 * i) for i in range(6)]
    lines = chat_log(server_bin, shapes["gemma3"], args, prompts)
    states = [(float(m["mib"]), float(m["limit"])) for line in lines if (m := CACHE_STATE.search(line))]
    assert states, "the prompt cache never reported its state"
    assert all(size * MiB <= p.host.runtime.prompt_cache + 0.0005 * MiB for size, _ in states), states


GEMMA3_12B = factory.gemma3(name="Gemma-3-12B (shape)", n_layer=48, n_embd=3840, n_head=16, n_head_kv=8,
                            head_dim=256, n_ff=15360, n_vocab=262144, ctx=131072, sliding_window=1024,
                            w="q4_K")  # fmt: skip


@pytest.fixture(scope="module")
def g12(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return load_model(GEMMA3_12B.write(tmp_path_factory.mktemp("g12") / "gemma3-12b.gguf"))


def test_flags_are_chosen_when_the_defaults_would_run_the_host_out(g12: ModelInfo) -> None:
    """Gemma-3-12B's shape on a 24 GiB card with 24 GiB of RAM: 4 slots x 32 checkpoints of 320 MiB
    and an 8 GiB prompt cache would not fit what the load leaves."""
    host = Host(24 * GiB, int(21.7 * GiB))
    p = plan(g12, [], host, (Device("CUDA0", "24 GiB", 24 * GiB, 24 * GiB, source="override"),))
    rt = p.host.runtime
    assert rt is not None and rt.checkpoint > 300 * MiB
    argv = compose("llama-server", p.planned, parse_server_args([]))
    n = int(argv[argv.index("--ctx-checkpoints") + 1])
    assert 1 <= n < 32 and rt.per_slot == n
    assert rt.total <= rt.room  # the growth now fits
    assert (n + 1) * rt.slots * rt.checkpoint > rt.room  # and n was the largest that does
    assert p.decision("runtime.host") and not any("grows at run time" in w for w in p.warnings)
    doc = to_json(p, argv)["host"]["runtime"]
    assert doc["fits"] and doc["checkpoints_per_slot"] == n and doc["available"] == rt.room


def test_a_users_values_win_and_are_checked(g12: ModelInfo) -> None:
    host = Host(24 * GiB, int(21.7 * GiB))
    gpu = (Device("CUDA0", "24 GiB", 24 * GiB, 24 * GiB, source="override"),)
    p = plan(g12, ["--ctx-checkpoints", "32", "--cache-ram", "8192"], host, gpu)
    argv = compose("llama-server", p.planned, parse_server_args(["--ctx-checkpoints", "32", "--cache-ram", "8192"]))
    assert argv.count("--ctx-checkpoints") == 1 and argv[argv.index("--ctx-checkpoints") + 1] == "32"
    assert any("kept as given" in w for w in p.warnings) and not p.decision("runtime.host")
    # one given, the other chosen around it
    p = plan(g12, ["--cache-ram", "0"], host, gpu)
    argv = compose("llama-server", p.planned, parse_server_args(["--cache-ram", "0"]))
    assert "--ctx-checkpoints" in argv and p.host.runtime is not None and p.host.runtime.total <= p.host.runtime.room


def test_a_model_without_checkpoints_and_an_unbounded_cache(tmp_path: Path) -> None:
    dense = load_model(factory.dense().write(tmp_path / "dense.gguf"))
    p = plan(dense, [], Host(64 * GiB, 60 * GiB))
    assert p.host.runtime is not None and p.host.runtime.checkpoint == 0 and p.host.runtime.per_slot == 0
    p = plan(dense, ["--cache-ram", "-1"], Host(64 * GiB, 60 * GiB))
    assert any("without limit" in w for w in p.warnings)
