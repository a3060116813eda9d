"""``llamafit demo``: the full pipeline on the embedded model, against the real llama-server.

The same pipeline as ``run`` (``prepare``: capability probe, flag translation, calibration; the one
process runner; the launch recorded in the history), plus one completion request and a clean stop.
"""

from __future__ import annotations

from typing import Any

from llamafit import shellwords
from llamafit.cli.output import err_console, note, out_console, print_json, progress_console, safe
from llamafit.cli.render import memory_tables, print_plan, rows_json
from llamafit.errors import ExitCode, LlamafitError
from llamafit.fit.plan import to_json
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.options import Options
from llamafit.planning.discover import discover_for, launch_env, new_hub, server_and_caps
from llamafit.planning.planner import Planner
from llamafit.server.binary import GET_SERVER_HINT, ServerBinary, free_port
from llamafit.server.capabilities import ASSUMED, Capabilities
from llamafit.server.supervisor import Supervisor
from llamafit.serving.outcome import check_speed, compare_all, record_launch
from llamafit.serving.timings import served_from_response

PROMPT = "The llama"
READY_TIMEOUT = 120.0  # the demo model loads in about a second; a server this slow is broken


def run_demo(server: str | None, json_out: bool) -> int:
    err = progress_console()
    path = ensure_demo_model()
    err.print(f"[dim]demo model:[/] {safe(path)}")
    missing: LlamafitError | None = None
    try:
        found: tuple[ServerBinary | None, Capabilities] = server_and_caps(server)
    except LlamafitError as e:  # a --server that is not one: plan anyway, then say so
        found, missing = (None, ASSUMED), e
    # -lv 4 makes llama.cpp print the buffer sizes we compare with; the port is a free loopback one
    args = ("--host", "127.0.0.1", "--port", str(free_port()), "-lv", "4", "--log-colors", "off")
    o = Options(server_args=args, server=server)
    prep = Planner(o, discover_for(o, found[0]), *found, new_hub(offline=True)).plan(str(path))
    for n in prep.notes:
        note(n)
    if prep.server is None:
        if json_out:
            print_json({"schema": "llamafit.gguf.demo_model/1", "plan": to_json(prep.plan, prep.argv), "server": None})
        else:
            print_plan(out_console(), prep.plan, prep.argv)
        why = missing.message if missing else "no llama-server found"
        err_console().print(f"[yellow]no llama-server to launch:[/] {safe(why)}", soft_wrap=True)
        err_console().print(f"[dim]hint:[/] {safe(GET_SERVER_HINT)}", soft_wrap=True)
        return int(ExitCode.SERVER_NOT_FOUND)

    if not json_out:
        print_plan(out_console(), prep.plan, prep.argv)
    err.print("[dim]starting llama-server ...[/]")
    running = Supervisor(prep.argv, launch_env(prep.server).env)
    running.start()
    try:
        url = running.wait_ready(timeout=READY_TIMEOUT)
        err.print(f"[green]ready[/] at {safe(url)}")
        reply = running.complete(PROMPT, n_predict=8)
    finally:
        outcome = running.stop()
    rows = compare_all(prep, outcome.log)
    served = served_from_response(reply)
    checks = [check_speed(prep, served)] if served is not None else []
    for why in record_launch(prep, outcome.log, checks):
        note(why)
    text = str(reply.get("content", ""))
    rc = outcome.returncode
    if json_out:
        doc: dict[str, Any] = {
            "schema": "llamafit.gguf.demo_model/1",
            "plan": to_json(prep.plan, prep.argv),
            "server": {"path": prep.server.path, "exit_code": rc, "url": url},
            "completion": {"prompt": PROMPT, "content": text, "tokens": reply.get("tokens_predicted")},
            "memory": rows_json(rows),
            "speed": [c.as_dict() for c in checks],
        }
        print_json(doc)
    else:
        out_console().print(f"completion of {PROMPT!r}: {safe(text)!r} (random weights: noise is the right answer)")
        for table in memory_tables(rows):
            err.print(table)  # the same stream as `run`'s predicted-vs-actual tables
        for c in checks:
            err.print(f"[dim]llamafit:[/] {safe(c.message())}", soft_wrap=True)
        err.print(f"[dim]server stopped (exit {rc}); argv was:[/] {safe(shellwords.join(prep.argv))}", soft_wrap=True)
    return 0 if rc == 0 else rc
