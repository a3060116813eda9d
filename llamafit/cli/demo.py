"""``llamafit demo``: the full pipeline on the embedded model, against the real llama-server."""

from __future__ import annotations

import json
import shlex
from typing import Any

from llamafit.argv import compose, parse_server_args
from llamafit.cli.app import err_console, out_console, progress_console
from llamafit.cli.render import memory_tables, print_plan, rows_json, safe
from llamafit.compare import compare
from llamafit.demo import ensure_demo_model
from llamafit.devices import discover
from llamafit.errors import ExitCode, LlamafitError
from llamafit.fit import make_plan
from llamafit.gguf.model import load_model
from llamafit.logparse import parse
from llamafit.plan import to_json
from llamafit.request import build_request
from llamafit.server import GET_SERVER_HINT, find_server, free_port, start_background

PROMPT = "The llama"


def run_demo(server: str | None, json_out: bool) -> int:
    err = progress_console()
    path = ensure_demo_model()
    err.print(f"[dim]demo model:[/] {safe(path)}")
    model = load_model(path)
    machine = discover()
    port = free_port()
    # -lv 4 makes llama.cpp print the buffer sizes we compare with; the port is a free loopback one
    extra = parse_server_args(["--host", "127.0.0.1", "--port", str(port), "-lv", "4", "--log-colors", "off"])
    req = build_request(extra)
    plan = make_plan(model, machine, req)
    try:
        srv = find_server(server)
    except LlamafitError as e:
        argv = compose("llama-server", plan.planned, extra)
        if json_out:
            print(json.dumps({"schema": "llamafit.demo/1", "plan": to_json(plan, argv), "server": None}, indent=2))
        else:
            print_plan(out_console(), plan, argv)
        err_console().print(f"[yellow]no llama-server to launch:[/] {safe(e.message)}")
        err_console().print(f"[dim]hint:[/] {safe(GET_SERVER_HINT)}", soft_wrap=True)
        return int(ExitCode.SERVER_NOT_FOUND)

    argv = compose(srv.path, plan.planned, extra)
    if not json_out:
        print_plan(out_console(), plan, argv)
    err.print("[dim]starting llama-server ...[/]")
    running = start_background(argv, srv.env(), "127.0.0.1", port)
    try:
        running.wait_ready(timeout=120)
        err.print(f"[green]ready[/] at {running.url}")
        reply = running.complete(PROMPT, n_predict=8)
    finally:
        rc = running.stop()
    log = parse(running.lines)
    rows = compare(plan.footprint, log)
    text = str(reply.get("content", ""))
    if json_out:
        doc: dict[str, Any] = {
            "schema": "llamafit.demo/1",
            "plan": to_json(plan, argv),
            "server": {"path": srv.path, "exit_code": rc, "url": running.url},
            "completion": {"prompt": PROMPT, "content": text, "tokens": reply.get("tokens_predicted")},
            "memory": rows_json(rows),
        }
        print(json.dumps(doc, indent=2))
    else:
        con = out_console()
        con.print(f"completion of {PROMPT!r}: {safe(text)!r} (random weights: noise is the right answer)")
        for table in memory_tables(rows):
            con.print(table)
        err.print(f"[dim]server stopped (exit {rc}); argv was:[/] {safe(shlex.join(argv))}", soft_wrap=True)
    return 0 if rc == 0 else rc
