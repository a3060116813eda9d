"""Files and flags llama-server would refuse (or abort on) are caught at plan time, with the key, tensor
or flag named: exit 7 for a model file, 2 for a flag, 4 for a drafter that is not a file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.errors import ExitCode
from tests import factory

A = "llama"


def drop(key: str) -> Callable[[factory.Shape], None]:
    return lambda s: s.kv.pop(key)


def setkv(key: str, value: object) -> Callable[[factory.Shape], None]:
    return lambda s: s.kv.__setitem__(key, value)


def no_block(il: int) -> Callable[[factory.Shape], None]:
    return lambda s: s.tensors.__setitem__(slice(None), [t for t in s.tensors if not t.name.startswith(f"blk.{il}.")])


BROKEN = {
    "unknown architecture": (lambda s: setattr(s, "arch", "llama-nova"), "unknown model architecture 'llama-nova'"),
    "no context_length": (drop(f"{A}.context_length"), f"{A}.context_length is missing"),
    "context_length 0": (setkv(f"{A}.context_length", 0), "context_length = 0"),
    "context_length absurd": (setkv(f"{A}.context_length", 1 << 40), "is not a usable training context"),
    "head_count 0": (setkv(f"{A}.attention.head_count", 0), "head_count is 0"),
    "key of the wrong type": (setkv(f"{A}.attention.head_count", "eight"), "head_count should be an integer"),
    "array too short": (setkv(f"{A}.attention.head_count", [8, 8]), "head_count has 2 entries for 4 layers"),
    "block_count past the tensors": (setkv(f"{A}.block_count", 6), "block 4 has no tensors"),
    "a block missing": (no_block(2), "block 2 has no tensors"),
    "more experts used than exist": (
        lambda s: s.kv.update({f"{A}.expert_count": 4, f"{A}.expert_used_count": 8}),
        "4 experts with 8 used",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_file_llama_server_would_refuse(tmp_path: Path, case: str) -> None:
    shape = factory.dense()
    change, said = BROKEN[case]
    if case == "unknown architecture":
        shape.kv = {k.replace(f"{A}.", "llama-nova."): v for k, v in shape.kv.items()}
    change(shape)
    path = shape.write(tmp_path / "m.gguf")
    r = CliRunner().invoke(app, ["plan", str(path), "--gpu", "8GiB"])
    assert r.exit_code == ExitCode.BAD_MODEL_FILE, r.output
    assert said in r.stderr and "Traceback" not in r.output


def test_a_projector_given_as_the_model(tmp_path: Path) -> None:
    path = factory.gemma3_siglip_896(2560).write(tmp_path / "mmproj.gguf")
    r = CliRunner().invoke(app, ["plan", str(path), "--gpu", "8GiB"])
    assert r.exit_code == ExitCode.BAD_MODEL_FILE and "--mmproj" in r.stderr


def test_a_sound_file_passes(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["plan", str(factory.dense().write(tmp_path / "m.gguf")), "--gpu", "8GiB"])
    assert r.exit_code == 0, r.output


def test_a_trunk_only_file_plans_where_its_loader_takes_one(tmp_path: Path) -> None:
    """NextN blocks declared and left out of the file: glm-dsa's loader takes it (trunk_only,
    src/models/glm4-moe.cpp:32-40 and its kin; tests/test_memory_vs_server.py loads it), Qwen3.5's does not."""
    trunk_only = factory.glm_dsa(n_nextn=1, indexer_types=(1, 0, 1, 0, 0)).write(tmp_path / "glm-dsa.gguf")
    r = CliRunner().invoke(app, ["plan", str(trunk_only), "--gpu", "8GiB"])
    assert r.exit_code == 0, r.output
    q35 = factory.qwen35(n_layer=4, n_nextn=1)
    no_block(4)(q35)
    r = CliRunner().invoke(app, ["plan", str(q35.write(tmp_path / "q35.gguf")), "--gpu", "8GiB"])
    assert r.exit_code == ExitCode.BAD_MODEL_FILE and "block 4 has no tensors" in r.stderr, r.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-ot", "exps=NOPE"], "no buffer type 'NOPE'"),
        (["-ot", "exps=cpu"], "no buffer type 'cpu'"),  # llama.cpp matches buffer names exactly
        (["-ngl", "99999999999999999999"], "out of range"),
        (["-c", "4294967296"], "out of range"),
        (["--rpc", ""], "empty endpoint"),
        (["--rpc", "127.0.0.1:50052,"], "empty endpoint"),
    ],
)
def test_a_flag_llama_server_would_refuse(tmp_path: Path, args: list[str], said: str) -> None:
    path = factory.dense().write(tmp_path / "m.gguf")
    r = CliRunner().invoke(app, ["plan", str(path), "--gpu", "8GiB", "--", *args])
    assert r.exit_code == ExitCode.USAGE, r.output
    assert said in r.stderr


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_drafter_that_is_not_a_file(tmp_path: Path, kind: str) -> None:
    path = factory.dense().write(tmp_path / "m.gguf")
    draft = tmp_path / "draft"
    if kind == "folder":
        draft.mkdir()
    else:
        os.mkfifo(draft)
    t = time.monotonic()
    r = CliRunner().invoke(app, ["plan", str(path), "--gpu", "8GiB", "--draft", str(draft)])
    assert r.exit_code == ExitCode.MODEL_NOT_FOUND, r.output
    assert "is not a file" in r.stderr and time.monotonic() - t < 10


def test_llama_arg_variables_are_said_where_no_launch_follows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLAMA_ARG_*`` variables llama-server would read are dropped at launch (said then); ``plan`` and
    ``run --dry-run`` say so too, by name and flag, never value (they may hold tokens)."""
    from llamafit.gguf.demo_model import ensure_demo_model

    model = str(ensure_demo_model(tmp_path))
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "8192")
    monkeypatch.setenv("LLAMA_ARG_HF_TOKEN", "hf_secret_value")
    for args in (["plan", model, "--gpu", "8GiB"], ["run", model, "--gpu", "8GiB", "--dry-run"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "LLAMA_ARG_CTX_SIZE (-c)" in r.output and "LLAMA_ARG_HF_TOKEN" in r.output, r.output
        assert "not passed to llama-server" in r.output and "hf_secret_value" not in r.output
    monkeypatch.delenv("LLAMA_ARG_CTX_SIZE")
    monkeypatch.delenv("LLAMA_ARG_HF_TOKEN")
    assert "not passed to llama-server" not in CliRunner().invoke(app, ["plan", model, "--gpu", "8GiB"]).output


def test_a_margin_for_a_device_the_plan_lacks_is_said(tmp_path: Path) -> None:
    """``--margin CUDA9=1GiB`` on a one-card plan (a typo, a card of another machine) was silently unused."""
    from llamafit.gguf.demo_model import ensure_demo_model

    model = str(ensure_demo_model(tmp_path))
    r = CliRunner().invoke(app, ["plan", model, "--gpu", "8GiB", "--margin", "CUDA9=1GiB,cuda0=2GiB,host=1GiB"])
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.stderr.splitlines() if "no such device" in x]
    assert line.endswith("--margin CUDA9: no such device in this plan (its devices: CUDA0, host); not used")
    ok = CliRunner().invoke(app, ["plan", model, "--gpu", "8GiB", "--margin", "CUDA0=2GiB"])
    assert "no such device" not in ok.stderr
