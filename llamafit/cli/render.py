"""Human output: tables for devices, models and plans. Only the CLI imports this (rich lives here)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llamafit.units import fmt_bytes

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def safe(text: object) -> str:
    """Text from a GGUF header or the Hub, made harmless for a terminal: no control characters
    (so no escape sequences, OSC 8/52 included) and no rich markup."""
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    return escape(s)


def b(n: int) -> str:
    return fmt_bytes(n)


def machine_table(m: Any) -> Table:
    t = Table(title="Devices", title_justify="left", expand=False)
    for col in ("device", "name", "total", "free"):
        t.add_column(col, justify="right" if col in ("total", "free") else "left")
    for g in m.gpus:
        t.add_row(g.id, safe(g.name), b(g.total), b(g.free))
    t.add_row("host", "RAM", b(m.host.total), b(m.host.available) + " avail")
    return t


def model_tables(model: Any) -> list[Table]:
    hp = model.hparams
    t = Table(title=safe(model.name), title_justify="left", show_header=False)
    t.add_column("key")
    t.add_column("value")
    rows = [
        ("architecture", safe(hp.arch)),
        ("file", safe(model.path) + (f" (+{len(model.shards) - 1} shards)" if len(model.shards) > 1 else "")),
        ("size", f"{b(model.file_size)} ({len(model.tensors)} tensors, {b(model.tensor_bytes)} of weights)"),
        ("layers", f"{hp.n_layer_all}" + (f" ({hp.n_nextn} NextN/MTP)" if hp.n_nextn else "")),
        ("embedding", str(hp.n_embd)),
        ("heads", _per_layer(hp.n_head) + " / kv " + _per_layer(hp.n_head_kv)),
        (
            "head dim",
            f"k {hp.head_k} v {hp.head_v}"
            + (f" (swa k {hp.head_k_swa} v {hp.head_v_swa})" if hp.swa_type != "none" else ""),
        ),
        ("context", f"{hp.n_ctx_train} (training)"),
        ("vocabulary", str(hp.n_vocab)),
    ]
    from llamafit.memory.context import kv_bytes_per_cell

    per_cell = kv_bytes_per_cell(hp)
    if per_cell:
        rows.append(("KV per token", f"{b(per_cell)} at f16 ({b(per_cell * hp.n_ctx_train)} at the training context)"))
    if hp.mla:
        rows.append(("attention", "MLA (K-only latent cache)"))
    if hp.swa_type != "none":
        rows.append(("sliding window", f"{hp.n_swa} ({sum(hp.is_swa)} of {hp.n_layer_all} layers, {hp.swa_type})"))
    if hp.n_expert:
        rows.append(("experts", f"{hp.n_expert_used} of {hp.n_expert} (expert ff {hp.n_ff_exp})"))
    if any(hp.is_recr):
        rows.append(("recurrent", f"{sum(hp.is_recr)} layers, state r {hp.n_embd_r()} s {hp.n_embd_s()} floats"))
    for k, v in rows:
        t.add_row(k, v)
    types: dict[str, tuple[int, int]] = {}
    for x in model.tensors:
        n, s = types.get(x.info.type.name, (0, 0))
        types[x.info.type.name] = (n + 1, s + x.info.nbytes)
    tt = Table(title="Tensor types", title_justify="left")
    tt.add_column("type")
    tt.add_column("tensors", justify="right")
    tt.add_column("bytes", justify="right")
    for name, (n, s) in sorted(types.items(), key=lambda kv: -kv[1][1]):
        tt.add_row(name, str(n), b(s))
    return [t, tt]


def _per_layer(vals: tuple[int, ...]) -> str:
    uniq = sorted(set(vals))
    return str(uniq[0]) if len(uniq) == 1 else f"{min(vals)}..{max(vals)} (per layer)"


_USE_KEYS = (
    "model",
    "kv",
    "rs",
    "compute",
    "output",
    "draft_model",
    "draft_kv",
    "draft_compute",
    "mmproj",
    "overhead",
)


def plan_table(plan: Any) -> Table:
    t = Table(title=f"Plan for {safe(plan.model.name)}", title_justify="left")
    t.add_column("device")
    for k in ("weights", "KV", "recurrent", "compute", "other", "total", "usable", "fits"):
        t.add_column(k, justify="right")
    rows = [(d.device.id, d.use, d.usable, d.fits) for d in plan.devices]
    rows.append(("host", plan.host.use, plan.host.usable, plan.host.fits))
    for name, use, usable, fits in rows:
        other = use.total - use.model - use.kv - use.rs - use.compute
        t.add_row(
            name, b(use.model), b(use.kv), b(use.rs), b(use.compute), b(other), b(use.total), b(usable),
            "yes" if fits else "[bold red]NO[/]",
        )  # fmt: skip
    return t


def print_plan(console: Console, plan: Any, argv: list[str]) -> None:
    cp = plan.footprint.context
    console.print(plan_table(plan))
    console.print(
        f"context {cp.n_ctx} ({cp.n_seq_max} slots, {'unified' if cp.kv_unified else 'per-slot'} KV of "
        f"{cp.n_ctx_seq} cells, K {cp.type_k} / V {cp.type_v}, flash attention "
        f"{'on' if plan.footprint.flash_attn else 'off'})"
    )
    for d in plan.decisions:
        console.print(f"  - {safe(d.message)}")
    for w in plan.warnings:
        console.print(f"  [yellow]warning:[/] {safe(w)}")
    console.print(safe(shlex.join(argv)), soft_wrap=True)
