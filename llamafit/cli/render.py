"""Human output: tables for devices, models and plans. Only the CLI imports this (rich lives here)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from llamafit import shellwords
from llamafit.cli.output import safe, safe_plain
from llamafit.units import MiB, fmt_bytes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from llamafit.devices.types import Machine
    from llamafit.fit.plan import Plan
    from llamafit.gguf.model import ModelInfo
    from llamafit.memory.footprint import Use
    from llamafit.planning.quants import QuantPlan, QuantSource
    from llamafit.serving.compare import Row
    from llamafit.speed.prediction import Speed


def b(n: int) -> str:
    return fmt_bytes(n)


def machine_table(m: Machine) -> Table:
    t = Table(title="Devices", title_justify="left", expand=False)
    for col in ("device", "backend", "name", "total", "free"):
        t.add_column(col, justify="right" if col in ("total", "free") else "left")
    for g in m.gpus:
        t.add_row(g.id, g.backend + (" (unified memory)" if g.uma else ""), safe(g.name), b(g.total), b(g.free))
    t.add_row("host", "", "RAM", b(m.host.total), b(m.host.available) + " avail")
    return t


def model_tables(model: ModelInfo) -> list[Table]:
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


# one letter per kind of memory, so the bar reads the same without colour (NO_COLOR, pipes, logs)
SEGMENTS = (
    ("W", "weights", "bold blue"),
    ("K", "KV cache", "bold green"),
    ("R", "recurrent state", "bold cyan"),
    ("C", "compute", "bold magenta"),
    ("D", "drafter", "bold yellow"),
    ("P", "projector", "yellow"),
    ("O", "runtime overhead", "magenta"),
    ("x", "other processes", "dim red"),
    ("M", "margin", "dim"),
    (".", "free", "dim"),
)


def _parts(use: Use, used_by_others: int, margin: int, free_after: int) -> list[tuple[str, int]]:
    """(letter, bytes) of one device, in bar order."""
    return [
        ("W", use.model + use.adapters),
        ("K", use.kv),
        ("R", use.rs),
        ("C", use.compute + use.output + use.ngram),
        ("D", use.draft_model + use.draft_kv + use.draft_compute),
        ("P", use.mmproj),
        ("O", use.overhead),
        ("x", used_by_others),
        ("M", margin),
        (".", max(free_after, 0)),
    ]


def bar(parts: list[tuple[str, int]], width: int) -> Text:
    """A bar of ``width`` cells; every non-zero part gets at least one cell (largest remainders round)."""
    total = sum(n for _, n in parts) or 1
    nonzero = [(ch, n) for ch, n in parts if n > 0]
    cells = {ch: max(1, int(n * width / total)) for ch, n in nonzero}
    # hand out (or take back) cells by the largest remainder until the bar is exactly width wide
    order = sorted(nonzero, key=lambda p: -(p[1] * width / total - int(p[1] * width / total)))
    i = 0
    while sum(cells.values()) != width and order:
        ch = order[i % len(order)][0]
        if sum(cells.values()) < width:
            cells[ch] += 1
        elif cells[ch] > 1:
            cells[ch] -= 1
        i += 1
        if i > 4 * width:
            break
    styles = {ch: style for ch, _, style in SEGMENTS}
    t = Text("[")
    for ch, _ in nonzero:
        t.append(ch * cells[ch], style=styles[ch])
    t.append("]")
    return t


def _detail(parts: list[tuple[str, int]]) -> list[str]:
    names = {ch: name for ch, name, _ in SEGMENTS}
    return [f"{names[ch]} {b(n)}" for ch, n in parts if n > 0]


def pack_items(items: list[str], width: int, indent: str = " ") -> list[Text]:
    """Items joined by two spaces, wrapped between items (never inside one) to ``width``."""
    lines: list[Text] = []
    cur = indent
    for it in items:
        if cur.strip() and len(cur) + 2 + len(it) > width:
            lines.append(Text(cur))
            cur = indent
        cur += ("  " if cur.strip() else "") + it
    if cur.strip():
        lines.append(Text(cur))
    return lines


def wrapped(text: str, width: int, first: str, rest: str, style: str = "") -> list[Text]:
    import textwrap

    return [
        Text(line, style=style)
        for line in textwrap.wrap(
            text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False, break_long_words=False
        )
    ]


def device_block(name: str, desc: str, total: int, parts: list[tuple[str, int]], over: int, width: int) -> list[Text]:
    head = Text(f"{name}  ")
    head.append(desc[: max(width - len(name) - 14, 8)])
    size = b(total)
    head.append(" " * max(1, width - len(head.plain) - len(size)) + size)
    lines = [head, bar(parts, width - 2), *pack_items(_detail(parts), width)]
    if over > 0:
        lines.append(Text(f" does not fit: {b(over)} over the usable memory", style="bold red"))
    return lines


def plan_view(plan: Plan, width: int = 80, text_width: int | None = None) -> list[Text]:
    """The plan at a glance: a bar per device (``width`` columns), then the decisions in plain sentences
    (wrapped at ``text_width``, default ``width``: a pipe gets them whole)."""
    tw = text_width or width
    cp = plan.footprint.context
    out: list[Text] = []
    out.append(Text(safe_plain(plan.model.name)[:tw], style="bold"))
    slots = f"{cp.n_seq_max} slot{'s' if cp.n_seq_max != 1 else ''}" + (
        " sharing one KV cache" if cp.kv_unified and cp.n_seq_max > 1 else ""
    )
    out += pack_items(
        [
            f"context {cp.n_ctx}",
            slots,
            f"K {cp.type_k} / V {cp.type_v}",
            f"flash attention {'on' if plan.footprint.flash_attn else 'off'}",
        ],
        width,
        indent="",
    )
    out += speed_lines(plan.speed, tw)
    out.append(Text(""))
    for d in plan.devices:
        dev = d.device
        others = max(dev.total - dev.free, 0)
        margin = min(dev.free - d.usable, max(dev.free, 0))
        free_after = dev.free - margin - d.use.total
        out += device_block(
            dev.id,
            safe_plain(dev.name),
            dev.total,
            _parts(d.use, others, margin, free_after),
            d.use.total - d.usable,
            width,
        )
        out.append(Text(""))
    h = plan.host
    others = max(h.host.total - h.host.available, 0)
    margin = min(h.host.available - h.usable, max(h.host.available, 0))
    out += device_block(
        "host",
        "RAM",
        h.host.total,
        _parts(h.use, others, margin, h.host.available - margin - h.use.total),
        h.use.total - h.usable,
        width,
    )
    out += [
        Text(line.plain, style="dim")
        for line in pack_items([f"{ch} {name}" for ch, name, _ in SEGMENTS], width, indent="")
    ]
    out.append(Text(""))
    out += tradeoff_lines(plan, tw)
    if plan.decisions:
        out.append(Text("Decisions", style="bold"))
    for dec in plan.decisions:
        out += wrapped(safe_plain(dec.message), tw, "  - ", "    ")
    if plan.warnings:
        out.append(Text("Warnings", style="bold yellow"))
        for w in plan.warnings:
            out += wrapped(safe_plain(w), tw, "  ! ", "    ", style="yellow")
    return out


def tradeoff_lines(plan: Plan, width: int) -> list[Text]:
    """The context-speed trade-off: one row a context, the chosen one marked, each with the flags that give it."""
    if len(plan.tradeoffs) < 2:
        return []
    chosen = plan.chosen_row
    out = [Text("Context and speed (> chosen; the flags give another row)", style="bold")]
    for r in plan.tradeoffs:
        tg = _rate(r.speed.tg if r.speed else None)
        pp = _rate(r.speed.pp if r.speed else None)
        room = f"{r.tightest} {b(max(r.room, 0))} left"
        flags = shellwords.join(r.differing(chosen)) if not r.chosen else ""
        line = f"{'>' if r.chosen else ' '} {r.n_ctx:>7}  tg {tg:>6}  pp {pp:>6}  {r.where}; {room}"
        out += wrapped(
            safe_plain(f"{line}{'  ' + flags if flags else ''}"), width, "", "      ", style="bold" if r.chosen else ""
        )
    out.append(Text(""))
    return out


def next_row(plan: Plan) -> str | None:
    """What the row beside the chosen one gives (the next larger context, else the next faster one), in a line."""
    rows = list(plan.tradeoffs)
    chosen = plan.chosen_row
    if chosen is None or len(rows) < 2:
        return None
    i = rows.index(chosen)
    other = rows[i + 1] if i + 1 < len(rows) else rows[i - 1]
    tg = _rate(other.speed.tg if other.speed else None)
    flags = shellwords.join(other.differing(chosen))
    return f"context {other.n_ctx} at tg {tg} tok/s instead ({other.where}): -- {flags}"


def _rate(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _span(r: tuple[float, float] | None) -> str:
    return "" if r is None else f" ({_rate(r[0])}-{_rate(r[1])})"


def speed_lines(sp: Speed | None, width: int) -> list[Text]:
    """The plan's predicted speed, what it assumes, and what was not known."""
    if sp is None:
        return []
    if sp.source == "unknown":
        why = "; ".join(sp.unknown) or "no device's speed is known"
        return wrapped(safe_plain(f"speed unknown: {why}"), width, "", "  ", style="dim")
    text = (
        f"speed  pp {_rate(sp.pp)}{_span(sp.pp_range)}  tg {_rate(sp.tg)}{_span(sp.tg_range)} tok/s  "
        f"({sp.prompt}-token prompt, depth {sp.depth}"
    )
    if sp.at_context is not None:
        depth, pp, tg = sp.at_context
        text += f"; context full at {depth}: pp {_rate(pp)}, tg {_rate(tg)}"
    how = "measured" if any(d.source == "measured" for d in sp.devices) else "known"
    how = "prior" if any(d.source == "prior" for d in sp.devices) else how
    text += f"), {sp.source} from the devices' {how} rates; {sp.assumes}"
    out = wrapped(safe_plain(text), width, "", "  ")
    for u in sp.unknown:
        out += wrapped(safe_plain(u), width, "  ? ", "    ", style="dim")
    return out


def print_plan(console: Console, plan: Plan, argv: list[str]) -> None:
    for line in plan_view(plan, min(console.width, 100), console.width):
        console.print(line, soft_wrap=True)
    console.print(Text(""))
    console.print(Text(shellwords.join(argv)), soft_wrap=True)


# -- predicted vs actual (run, demo) ------------------------------------------------------------------


def device_of(buft: str) -> str:
    """The device a logged buffer lives on: host buffers (CPU, CPU_Mapped, CUDA_Host, CPU_REPACK) are the host."""
    from llamafit.memory import backends

    return buft.split("_")[0] if backends.is_device_buffer(buft) else "host"


def memory_tables(rows: list[Row]) -> list[Table]:
    """One table per device: each buffer llamafit predicted or the server logged there."""
    by_dev: dict[str, list[Row]] = {}
    for r in rows:
        by_dev.setdefault(device_of(r.buft), []).append(r)
    tables = []
    for dev in sorted(by_dev, key=lambda d: (d == "host", d)):
        t = Table(title=f"{dev}: Predicted vs actual (from llama-server's log)", title_justify="left")
        for col in ("context", "buffer", "kind", "predicted MiB", "actual MiB", "diff"):
            t.add_column(col, justify="right" if "MiB" in col or col == "diff" else "left")
        for r in by_dev[dev]:
            actual = "-" if r.actual_mib is None else f"{r.actual_mib:.2f}"
            # a difference under the log's precision is no difference: never "-0.00"
            diff = "" if r.diff_mib is None else f"{0.0 if abs(r.diff_mib) < 0.005 else r.diff_mib:+.2f}"
            t.add_row(
                r.context, r.buft, r.kind, f"{r.predicted / MiB:.2f}", actual, diff + ("" if r.within else " [red]!")
            )
        tables.append(t)
    return tables


def rows_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [
        {
            "context": r.context,
            "kind": r.kind,
            "buffer": r.buft,
            "predicted": r.predicted,
            "actual_mib": r.actual_mib,
            "within_tolerance": r.within,
        }
        for r in rows
    ]


# -- quants (plan --quants) -------------------------------------------------------------------------


def quants_table(src: QuantSource, rows: Sequence[QuantPlan]) -> Table:
    """One row per quant, highest precision first: its size and bits per weight, and its plan here."""
    t = Table(title=f"Quants of {safe(src.ref)} on this machine", title_justify="left")
    for col in ("quant", "size", "bpw", "fits", "context", "tg", "weights", "drafter", "download"):
        t.add_column(col, justify="right" if col in ("size", "bpw", "context", "tg", "download") else "left")
    for r in reversed(rows):
        if r.error is not None:
            t.add_row(safe(r.quant.tag), b(r.quant.size), "", "[red]error", "", "", safe(r.error.message), "", "")
            continue
        fits = "[green]yes" if r.full else "[yellow]yes" if r.fits else "[red]no"  # yellow: weights on the CPU
        down = r.prepared.downloads() if r.prepared is not None else []
        tg = r.tg
        t.add_row(
            safe(r.quant.tag),
            b(r.quant.size),
            f"{r.bpw:.2f}" if r.bpw else "",
            fits,
            str(r.plan.n_ctx) if r.fits and r.plan else "",
            _rate(tg) if tg is not None else "",
            safe(r.placement[1]),
            safe(r.speculative or ""),
            b(sum(f.size for _, f in down)) if down else ("cached" if r.fits and src.hub else ""),
        )
    return t


# -- history -------------------------------------------------------------------------------------------


def history_table(entries: list[dict[str, Any]], path: str) -> Table:
    """Past launches: their model, context, devices, and compute predicted against logged."""
    t = Table(title=f"Launches ({path})", title_justify="left")
    cols = ("time", "model", "n_ctx", "devices", "KV MiB", "compute MiB (pred -> actual)", "host MiB (ready -> peak)")
    for col in cols:
        t.add_column(col)
    for e in entries:
        pred = e.get("predicted_bytes", {}).get("compute", {})
        act = e.get("actual_mib", {}).get("compute", {})
        comp = ", ".join(f"{k} {pred.get(k, 0) / MiB:.1f} -> {v:.1f}" for k, v in act.items())
        kv = sum(e.get("actual_mib", {}).get("kv", {}).values())
        st = e.get("settings", {})
        t.add_row(
            safe(e.get("time", "")),
            safe(e.get("model", {}).get("name", "")),
            str(st.get("n_ctx", "")),
            safe(",".join(st.get("devices", [])) or "CPU"),
            f"{kv:.2f}",
            safe(comp),
            _host_memory(e.get("host_memory")),
        )
    return t


def _host_memory(h: object) -> str:
    """The server's own host memory over its life (run's watch): at ready -> peak, and what the plan allowed."""
    if not isinstance(h, dict):
        return ""
    at, peak, allowed = (_mib(h.get(k)) for k in ("at_ready_mib", "peak_mib", "allowed_mib"))
    if at is None or peak is None or allowed is None:
        return ""
    return f"{at:.0f} -> {peak:.0f} of {allowed:.0f}" + (" (over)" if peak > allowed else "")


def _mib(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
