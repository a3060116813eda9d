"""The command line through typer.testing.CliRunner: exact argv, JSON contracts, exit codes, no tracebacks."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.errors import ExitCode
from tests import factory

runner = CliRunner()


@pytest.fixture(scope="module")
def l8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return factory.llama31_8b().write(tmp_path_factory.mktemp("m") / "llama31-8b.gguf")


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def test_version_and_help() -> None:
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.startswith("llamafit ")
    r = invoke("--help")
    assert r.exit_code == 0
    for cmd in ("demo", "gpus", "inspect", "plan", "run"):
        assert cmd in r.stdout


def test_gpus_json_for_described_hardware() -> None:
    r = invoke("gpus", "--gpu", "22GiB/24GiB", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "llamafit.gpus/1"
    assert doc["gpus"][0] == {
        "id": "CUDA0", "kind": "gpu", "name": "--gpu 22GiB/24GiB", "uuid": "", "total": 24 << 30,
        "free": 22 << 30, "source": "override", "endpoint": None, "backend": "CUDA", "uma": False,
    }  # fmt: skip
    assert doc["host"]["total"] > 0


def test_inspect_human_and_json(l8b: Path) -> None:
    r = invoke("inspect", str(l8b))
    assert r.exit_code == 0, r.output
    assert "llama" in r.stdout and "131072" in r.stdout and "q4_K" in r.stdout
    assert "128.0 KiB at f16" in r.stdout  # 32 layers x 8 KV heads x 128 x (K + V) x 2 B
    doc = json.loads(invoke("inspect", str(l8b), "--json").stdout)
    assert doc["architecture"] == "llama"
    assert doc["hparams"]["n_layer_all"] == 32 and doc["hparams"]["n_head_kv"][0] == 8
    assert doc["tensors"][0]["name"] == "token_embd.weight"


def test_plan_json_contract(l8b: Path) -> None:
    r = invoke("plan", str(l8b), "--gpu", "12GiB", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # stdout is exactly one JSON object
    assert doc["schema"] == "llamafit.plan/1"
    assert set(doc["context"]) >= {"n_ctx", "n_ctx_seq", "n_seq", "kv_unified", "n_batch", "n_ubatch", "flash_attn",
                                   "type_k", "type_v"}  # fmt: skip
    dev = doc["devices"][0]
    assert dev["id"] == "CUDA0" and set(dev) >= {"id", "name", "total", "free", "usable", "use", "fits"}
    keys = {"model", "kv", "rs", "compute", "output", "draft_model", "draft_kv", "draft_compute", "mmproj", "overhead"}
    assert set(dev["use"]) >= keys
    assert set(doc["host"]) >= {"total", "available", "use"} and set(doc["host"]["use"]) >= keys
    assert all(isinstance(v, int) for v in dev["use"].values())
    assert dev["fits"] is True
    assert {d["code"] for d in doc["decisions"]} >= {"context.reduced"}
    assert any(d["code"].startswith("placement.") for d in doc["decisions"])
    assert doc["argv"][0].endswith("llama-server") and "-c" in doc["argv"]
    assert isinstance(doc["warnings"], list)
    # the trade-off the context was chosen from: rows by context, one chosen, each with its own flags
    rows = doc["tradeoffs"]
    assert len(rows) >= 3 and [r["n_ctx"] for r in rows] == sorted(r["n_ctx"] for r in rows)
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["n_ctx"] == doc["context"]["n_ctx"] and chosen[0]["flags"] == []
    for r in rows:
        assert {"n_ctx", "tg", "pp", "where", "tightest", "room", "flags", "placement"} <= set(r)
        assert r["chosen"] or ("-c" in r["flags"] and r["tg"] is not None)
        # no row has both a context at least as large and a faster generation than the chosen one
        assert r["chosen"] or not (r["n_ctx"] >= chosen[0]["n_ctx"] and r["tg"] > chosen[0]["tg"])


def test_plan_honours_extra_args(l8b: Path) -> None:
    a = json.loads(invoke("plan", str(l8b), "--gpu", "12GiB", "--json").stdout)
    b = json.loads(invoke("plan", str(l8b), "--gpu", "12GiB", "--json", "--", "-ctk", "q8_0", "-ctv", "q8_0").stdout)
    assert b["context"]["type_k"] == "q8_0"
    assert b["context"]["n_ctx"] > a["context"]["n_ctx"]
    assert b["argv"][-4:] == ["-ctk", "q8_0", "-ctv", "q8_0"]


def test_plan_human_view(l8b: Path) -> None:
    r = invoke("plan", str(l8b), "--gpu", "24GiB")
    assert r.exit_code == 0, r.output
    assert "CUDA0" in r.stdout and "training context fits" in r.stdout


def test_dry_run_prints_exactly_the_argv(l8b: Path) -> None:
    r = invoke("run", str(l8b), "--dry-run", "--server", "/bin/true", "--gpu", "24GiB", "--", "-ctk", "q8_0",
               "--port", "9000")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.stdout.count("\n") == 1
    argv = shlex.split(r.stdout)
    assert argv == [
        "/usr/bin/true" if Path("/bin/true").resolve() == Path("/usr/bin/true") else str(Path("/bin/true").resolve()),
        "-m", str(l8b), "-c", "131072", "-ngl", "all", "-fit", "off", "-ctk", "q8_0", "--port", "9000",
    ]  # fmt: skip


def test_a_dry_run_loads_nothing_it_does_not_use(l8b: Path) -> None:
    """A dry run plans and prints: the serving life, the Hub client, an HTTP client, package metadata and numpy
    stay unimported (plan time; a probe of a binary reads the metadata, the cached capabilities do not). The
    restart policy is read as every run option is, before the plan (``cli.keep``): its module and package only.
    Nor do the speed probe (nothing is measured of described cards), the no-alloc measurement and the server's
    log (a plan not held to one), the GGUF writer, the Hub's client (a local file), or the graph builders of other
    architectures than Llama's."""
    import subprocess
    import sys

    builders = ("dflash", "dsv4", "gemma3n", "gemma4", "hybrid", "layered", "mamba", "mla", "mtp")
    unused = [
        *(f"llamafit.speed.{m}" for m in ("probe", "probe_cache", "probe_models")),
        *(f"llamafit.server.{m}" for m in ("fitprint", "logparse")),
        "llamafit.gguf.writer",
        "llamafit.hub.remote",
        *(f"llamafit.memory.graph.{m}" for m in builders),
    ]
    code = (
        "import sys\n"
        "from llamafit.cli.entry import main\n"
        f"sys.argv = ['llamafit', 'run', {str(l8b)!r}, '--dry-run', '--server', '/bin/true', '--gpu', '24GiB']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('numpy', 'huggingface_hub')"
        " or m in ('http.client', 'importlib.metadata') or m.startswith('llamafit.serving')], file=sys.stderr)\n"
        f"print([m for m in {unused!r} if m in sys.modules], file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "-ngl" in r.stdout, r.stderr
    loaded, others = r.stderr.strip().splitlines()[-2:]
    assert loaded == "['llamafit.serving', 'llamafit.serving.restarts']", r.stderr
    assert others == "[]", r.stderr


def test_the_executable_tunes_the_collector_and_the_library_does_not(l8b: Path) -> None:
    """The ``llamafit`` executable runs the cyclic collector rarely (a plan's objects hold no cycles, plan time);
    importing and planning as a library leaves the process's collector as its owner set it."""
    import subprocess
    import sys

    from llamafit.cli.entry import GC_THRESHOLDS

    run = f"sys.argv = ['llamafit', 'run', {str(l8b)!r}, '--dry-run', '--server', '/bin/true', '--gpu', '24GiB']\n"
    run += "try:\n    main()\nexcept SystemExit:\n    pass\n"
    for code, want in (
        ("from llamafit.cli.entry import main\n" + run, GC_THRESHOLDS),
        ("from llamafit.fit import make_plan\nimport llamafit.cli.app\n", gc_default()),
    ):
        r = subprocess.run([sys.executable, "-c", f"import gc, sys\n{code}print(gc.get_threshold(), file=sys.stderr)"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == str(want), r.stderr


def gc_default() -> tuple[int, int, int]:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", "import gc; print(gc.get_threshold())"], capture_output=True, text=True, timeout=60
    )
    return tuple(int(x) for x in r.stdout.strip("()\n").split(","))  # type: ignore[return-value]


def test_dry_run_user_context_wins(l8b: Path) -> None:
    r = invoke("run", str(l8b), "--dry-run", "--gpu", "24GiB", "--", "--ctx_size", "8192")
    argv = shlex.split(r.stdout)
    assert argv.count("-c") == 0 and argv[-2:] == ["--ctx_size", "8192"]


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["plan", "/nonexistent/model.gguf"], ExitCode.MODEL_NOT_FOUND, "not found"),
        (["plan", "--gpu", "lots", "x.gguf"], ExitCode.USAGE, "not a size"),
        (["run", "x.gguf", "-ctk", "q8_0"], 2, "No such option"),
    ],
)
def test_errors_have_codes_and_no_traceback(args: list[str], code: int, text: str) -> None:
    r = invoke(*args)
    assert r.exit_code == code, r.output
    assert text in r.output
    assert "Traceback" not in r.output


def test_bad_gguf_and_does_not_fit(tmp_path: Path, l8b: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all, just text" * 4)
    r = invoke("plan", str(bad))
    assert r.exit_code == ExitCode.BAD_MODEL_FILE and "not a GGUF file" in r.output
    r = invoke("plan", str(l8b), "--gpu", "1GiB", "--", "-ngl", "all", "-c", "131072")
    assert r.exit_code == ExitCode.DOES_NOT_FIT and "does not fit" in r.output
    assert "Traceback" not in r.output


def test_a_cache_type_llama_cpp_refuses_is_a_usage_error(tmp_path: Path) -> None:
    mla = factory.deepseek2().write(tmp_path / "mla.gguf")
    r = invoke("plan", str(mla), "--", "-ctk", "q8_0")
    assert r.exit_code == ExitCode.USAGE and "different K" in r.output


def test_debug_env_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMAFIT_DEBUG", "1")
    r = invoke("plan", str(tmp_path / "missing.gguf"))
    assert r.exit_code == ExitCode.MODEL_NOT_FOUND
    assert "Traceback" in r.output


def test_demo_without_a_server_prints_plan_and_how_to_get_one() -> None:
    r = invoke("demo", "--server", "/nonexistent/llama-server")
    assert r.exit_code == ExitCode.SERVER_NOT_FOUND, r.output
    assert "pip install" in r.output
    assert "llama-server -m" in r.output


@pytest.mark.parametrize("command", ["gpus", "inspect", "plan", "run", "demo", "history"])
def test_every_command_has_working_help(command: str) -> None:
    r = CliRunner().invoke(app, [command, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output and "internal error" not in r.output


def test_an_unexpected_error_is_reported_as_one_line_with_its_type(l8b: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last-resort handler names the real exception (it once hid it behind its own UnboundLocalError)."""
    from llamafit.planning.planner import Planner

    def broken(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("a bug \x1b]0;title\x07 here")

    monkeypatch.setattr(Planner, "plan", broken)
    r = invoke("plan", str(l8b), "--gpu", "24GiB")
    assert r.exit_code == ExitCode.INTERNAL
    assert "internal error: ZeroDivisionError: a bug" in r.stderr and "LLAMAFIT_DEBUG=1" in r.stderr
    assert "UnboundLocalError" not in r.output and "Traceback" not in r.output
    assert "\x1b]0;" not in r.stderr  # escaped like any other text


def test_a_tensor_split_that_is_not_a_number_is_a_usage_error(l8b: Path) -> None:
    for ts in ("nan,1", "inf,1", "1,x"):
        r = invoke("plan", str(l8b), "--gpu", "24GiB", "--gpu", "24GiB", "--", "-ts", ts)
        assert r.exit_code == ExitCode.USAGE, (ts, r.output)
        assert "-ts" in r.stderr and "internal error" not in r.stderr


def test_plan_and_run_say_the_same_warnings(l8b: Path) -> None:
    """A warning of the plan (a context past the training one) is said by plan, run --dry-run and run alike:
    every command prints the plan's one report (Prepared.report)."""
    args = ("--gpu", "200GiB", "--", "-c", "1000000")
    plan = invoke("plan", str(l8b), *args)
    dry = invoke("run", str(l8b), "--dry-run", *args)
    assert plan.exit_code == 0 and dry.exit_code == 0
    assert "exceeds the training context" in plan.stdout
    assert "warning: n_ctx_seq 1000192 exceeds the training context 131072" in dry.stderr
    assert "exceeds" not in dry.stdout  # stdout carries the argv alone


def test_llamafits_own_options_are_known_after_the_separator() -> None:
    """Every option a llamafit command declares that llama-server does not have is one the server-flag check
    names as llamafit's (written after --, it would reach the server); none is listed that no command has."""
    import typer.main

    from llamafit.planning.asked import LLAMAFIT_OPTIONS
    from llamafit.server.option_table import ROWS

    declared: set[str] = set()

    def walk(c: object) -> None:
        for p in getattr(c, "params", []):
            if getattr(p, "param_type_name", "") == "option":
                declared.update(o for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
        for sub in getattr(c, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    server = {x for row in ROWS for part in row[1:3] for x in part if isinstance(x, str) and x.startswith("--")}
    typers = {"--help", "--version", "--install-completion", "--show-completion"}
    own = declared - server - typers
    assert own == LLAMAFIT_OPTIONS, (sorted(own - LLAMAFIT_OPTIONS), sorted(LLAMAFIT_OPTIONS - own))


def test_an_error_that_learns_more_is_a_new_one() -> None:
    """An error already raised is never changed: a caller that knows more raises ``but(...)`` from it."""
    from llamafit.errors import DoesNotFitError

    e = DoesNotFitError("does not fit", "try less", plan="p")
    more = e.but(message="m does not fit alone", model="m")
    assert (e.message, e.model, str(e)) == ("does not fit", None, "does not fit")
    assert (more.message, more.model, more.plan, more.hint, str(more)) == (
        "m does not fit alone", "m", "p", "try less", "m does not fit alone"
    )  # fmt: skip
    assert isinstance(more, DoesNotFitError) and more.exit_code == e.exit_code
    with pytest.raises(TypeError, match="has no colour"):
        e.but(colour="red")


def test_the_help_states_the_balanced_share_the_choice_uses() -> None:
    """``--prefer balanced`` keeps ``choice.SHARE`` of the fastest placement's speed; the help said 75 % where the
    choice kept 50 %."""
    from llamafit.cli.options import PreferOpt
    from llamafit.fit.choice import SHARE

    help_text = PreferOpt.__metadata__[0].help
    assert f"keeps {round(SHARE * 100)} % of the fastest" in help_text
    for command in ("plan", "run", "tune"):
        out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"}).output
        assert f"keeps {round(SHARE * 100)} % of the fastest" in " ".join(out.split()), command
