"""The terminal experience: the plan view at 80 columns, colour rules, hostile text, --quiet, no tracebacks."""

from __future__ import annotations

import io
import json
import os
import random
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.cli.render import plan_view
from llamafit.devices.machine import Device, Host, Machine
from llamafit.errors import ExitCode
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.gguf.model import load_model
from llamafit.server.args import parse_server_args
from llamafit.speculative import SpecOptions
from llamafit.units import GiB
from tests import factory

SNAPSHOTS = Path(__file__).parent / "snapshots"
HOST = Host(total=64 * GiB, available=60 * GiB)
DOCUMENTED = {int(c) for c in ExitCode}


def gpu(i: int, total: float, free: float | None = None) -> Device:
    return factory.gpu(i, total, free, name=f"NVIDIA RTX {4090 + i}")


def render(plan: object, width: int = 80) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False)
    for line in plan_view(plan, width):
        con.print(line, soft_wrap=True)
    return buf.getvalue()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("views")
    return {
        "l8b": factory.llama31_8b().write(d / "l8b.gguf"),
        "air": factory.glm45_air().write(d / "air.gguf"),
        "hybrid_mtp": factory.qwen35(n_nextn=1, name="hybrid-mtp").write(d / "hybrid.gguf"),
    }


CASES = {
    "two_gpus": ("l8b", [gpu(0, 24, 20), gpu(1, 12)], [], "off"),
    "moe_experts_on_cpu": ("air", [gpu(0, 24)], [], "off"),
    "mtp_kept": ("hybrid_mtp", [gpu(0, 8)], [], "auto"),
    "user_context": ("l8b", [gpu(0, 16)], ["-c", "65536", "-ctk", "q8_0", "-ctv", "q8_0"], "off"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_view_snapshot(models: dict[str, Path], case: str) -> None:
    name, gpus, args, spec = CASES[case]
    plan = make_plan(load_model(models[name]), Machine(tuple(gpus), HOST), build_request(parse_server_args(args)),
                     SpecOptions(mode=spec))  # fmt: skip
    text = render(plan)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    path = SNAPSHOTS / f"plan_{case}.txt"
    if os.environ.get("LLAMAFIT_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}: run with LLAMAFIT_UPDATE_SNAPSHOTS=1 and review it"
    assert text == path.read_text(), f"plan view changed; if intended, LLAMAFIT_UPDATE_SNAPSHOTS=1 pytest {__file__}"


def test_bars_are_exactly_as_wide_as_the_terminal(models: dict[str, Path]) -> None:
    plan = make_plan(load_model(models["l8b"]), Machine((gpu(0, 24, 20), gpu(1, 12)), HOST), build_request(
        parse_server_args([])))  # fmt: skip
    for width in (60, 80, 100):
        bars = [line for line in render(plan, width).splitlines() if line.startswith("[")]
        assert len(bars) == 3 and all(len(b) == width for b in bars)


def test_no_colour_when_not_a_tty_or_no_color(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = str(ensure_demo_model(tmp_path))
    r = CliRunner().invoke(app, ["plan", model, "--gpu", "8GiB"])
    assert r.exit_code == 0 and "\x1b[" not in r.output
    monkeypatch.setenv("FORCE_COLOR", "1")
    coloured = CliRunner().invoke(app, ["plan", model, "--gpu", "8GiB"])
    assert "\x1b[" in coloured.stdout  # a terminal gets colour...
    monkeypatch.setenv("NO_COLOR", "1")
    r = CliRunner().invoke(app, ["plan", model, "--gpu", "8GiB"])
    assert r.exit_code == 0 and "\x1b[" not in r.output  # ...unless NO_COLOR says otherwise


def test_narrow_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    r = CliRunner().invoke(app, ["plan", str(ensure_demo_model(tmp_path)), "--gpu", "8GiB"])
    assert r.exit_code == 0
    argv_line = r.stdout.strip().splitlines()[-1]
    view = r.stdout.strip().splitlines()[:-1]
    assert all(len(line) <= 60 for line in view), r.stdout
    assert argv_line.startswith(("llama-server", "/")) and " -m " in argv_line  # the argv stays one line


def test_text_from_the_model_cannot_drive_the_terminal(tmp_path: Path) -> None:
    shape = factory.dense(name="[bold red]evil[/]\x1b]52;c;ZXZpbA==\x07\x1b[2J")
    path = shape.write(tmp_path / "evil.gguf")
    for args in (["plan", str(path), "--gpu", "8GiB"], ["inspect", str(path)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "\x1b" not in r.output and "\x07" not in r.output
        assert "[bold red]evil[/]" in r.output  # shown literally, not as markup
        assert "\\x1b]52" in r.output


def test_quiet_keeps_only_data_and_errors(tmp_path: Path) -> None:
    model = str(ensure_demo_model(tmp_path))
    loud = CliRunner().invoke(app, ["run", model, "--dry-run", "--gpu", "8GiB", "--", "--no-mmap"])
    assert loud.stderr.strip()
    quiet = CliRunner().invoke(app, ["run", model, "--dry-run", "--gpu", "8GiB", "-q", "--", "--no-mmap"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == loud.stdout
    bad = CliRunner().invoke(app, ["plan", str(tmp_path / "missing.gguf"), "-q"])
    assert bad.exit_code == 4 and "error:" in bad.stderr


@pytest.mark.parametrize("command", [["gpus"], ["inspect", "{m}"], ["plan", "{m}"], ["history"]])
def test_every_reporting_command_speaks_json(tmp_path: Path, command: list[str]) -> None:
    model = str(ensure_demo_model(tmp_path))
    args = [c.format(m=model) for c in command] + ["--json"]
    if command[0] in ("gpus", "plan"):
        args += ["--gpu", "8GiB"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert re.fullmatch(r"llamafit\.[a-z-]+/\d+", doc["schema"])


def _mutations(data: bytes, rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        b = bytearray(data[: rng.choice([4, 12, 24, 200, len(data) // 3, len(data)])])
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.3:
            pos = rng.randrange(8, 24)  # the tensor and key counts: absurd values
            b[pos : pos + 8] = rng.choice([b"\xff" * 8, (2**40).to_bytes(8, "little"), b"\x00" * 8])
        out.append(bytes(b))
    return out


def test_hostile_files_never_raise_a_traceback(tmp_path: Path) -> None:
    rng = random.Random(1234)
    src = ensure_demo_model(tmp_path / "d").read_bytes()[:300_000]
    for i, data in enumerate(_mutations(src, rng, 60)):
        path = tmp_path / f"fuzz{i}.gguf"
        path.write_bytes(data)
        for cmd in (["inspect", str(path)], ["plan", str(path), "--gpu", "8GiB", "--json"]):
            r = CliRunner().invoke(app, cmd)
            assert r.exit_code in DOCUMENTED, (cmd, r.exit_code, r.output)
            assert r.exit_code != ExitCode.INTERNAL, (cmd, r.output)
            assert ("Traceback" not in r.output and r.exception is None) or isinstance(r.exception, SystemExit)


BAD_ARGS = [
    [], ["nope"], ["plan"], ["plan", "--gpu"], ["plan", "m.gguf", "--gpu", "lots"], ["plan", "m.gguf", "--margin", "x"],
    ["plan", "m.gguf", "--min-ctx", "-5"], ["plan", "m.gguf", "--spec", "warp"], ["run", "a/b/c"],
    ["plan", "{m}", "--", "-c", "many"], ["plan", "{m}", "--", "-ctk", "q9_9"], ["plan", "{m}", "--", "-ngl", "x"],
    ["plan", "{m}", "--", "-ts", "a,b"], ["plan", "{m}", "--", "--mmproj"], ["plan", "{m}", "--", "-np", "0"],
    ["plan", "{m}", "--", "-ot", "[=CPU"], ["run", "{m}", "--log-file", "/", "--dry-run"], ["history", "-n", "0"],
    ["completion", "tcsh"], ["plan", "{m}", "--hf-file", "x.gguf"], ["plan", "a/b:Q4[", "--offline"],
    ["plan", "{m}", "--draft", "/nope.gguf"], ["plan", "{m}", "--gpu", "9GiB/8GiB"], ["inspect", "/"],
]  # fmt: skip


@pytest.mark.parametrize("args", BAD_ARGS, ids=[" ".join(a) or "(none)" for a in BAD_ARGS])
def test_bad_arguments_get_a_message_not_a_traceback(tmp_path: Path, args: list[str]) -> None:
    model = str(ensure_demo_model(tmp_path))
    r = CliRunner().invoke(app, [a.format(m=model) for a in args])
    assert r.exit_code in DOCUMENTED and r.exit_code != ExitCode.INTERNAL, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    if r.exit_code not in (0,):
        assert r.output.strip(), "a failure must say something"


def test_text_from_the_model_is_not_turned_into_emoji(tmp_path: Path) -> None:
    """rich replaces ``:name:`` with an emoji by default; a model's name, a path or a flag is shown as written."""
    path = factory.dense(name="qwen :smile: :thumbs_up:").write(tmp_path / ":fire:.gguf")
    for args in (["plan", str(path), "--gpu", "8GiB"], ["inspect", str(path)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert ":smile:" in r.output and "\N{SMILING FACE WITH OPEN MOUTH AND SMILING EYES}" not in r.output
        assert ":fire:" in r.output and "\N{FIRE}" not in r.output
