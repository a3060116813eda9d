"""The choice by speed (issue #51): placements weighed with the speed model at every context shown, one policy for
dense, MoE and hybrid models, and the trade-off a plan shows. The cases are the issue's: real shapes (sparse files)
on described cards beside a described host."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.errors import DoesNotFitError
from llamafit.fit import choice, policy
from llamafit.fit.plan import to_json
from llamafit.options import Options
from llamafit.planning.planner import prepare
from tests import factory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import shapes

HOST = {"host_ram": "32GiB", "host_bandwidth": "60GB/s", "host_cores": 8}


def gemma3_12b() -> factory.Shape:
    """google/gemma-3-12b-it (text): 48 layers, 3840 embd, 16 heads, 8 KV heads of 256, 15360 FFN, SWA 1024."""
    return factory.gemma3(name="Gemma-3-12B (shape)", n_layer=48, n_embd=3840, n_head=16, n_head_kv=8, head_dim=256,
                          n_ff=15360, n_vocab=262208, ctx=131072, sliding_window=1024, w="q4_K")  # fmt: skip


CASES = {  # the three cases
    "qwen3-8b": ("6GiB@rtx-4060", factory.qwen3_8b),
    "gemma3-12b": ("rtx-4060", gemma3_12b),
    "qwen3-30b-a3b": ("rtx-3060", shapes.qwen3_30b_a3b),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("choice")
    return {name: make().write(d / f"{name}.gguf") for name, (_, make) in CASES.items()}


def plan(model: Path, gpu: str, args: list[str] = (), prefer: str = "balanced") -> dict[str, Any]:  # type: ignore[assignment]
    """The plan's JSON; a pinned placement that does not fit the memory: its closest plan (``fits`` false)."""
    o = Options(gpu=(gpu,), server_args=list(args), prefer=prefer, calibrate=False, **HOST)  # type: ignore[arg-type]
    try:
        p = prepare(str(model), o, tuned=False)
    except DoesNotFitError as e:
        return {"fits": False, "warnings": [], "speed": None, "closest": e.message}
    return to_json(p.plan, p.argv)


def within_margin(doc: dict[str, Any]) -> bool:
    return doc["fits"] and not any("not the margins" in w for w in doc["warnings"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_chosen_row_is_the_fastest_placement_at_its_context_and_none_dominates_it(
    models: dict[str, Path], name: str
) -> None:
    gpu = CASES[name][0]
    doc = plan(models[name], gpu)
    rows, ctx, tg = doc["tradeoffs"], doc["context"]["n_ctx"], doc["speed"]["tg"]
    assert 3 <= len(rows) <= 6 and sum(r["chosen"] for r in rows) == 1
    assert not any(r["n_ctx"] >= ctx and r["tg"] > tg for r in rows if not r["chosen"])
    # more layers on the GPU than chosen: either past the margin or no more than 2 % faster
    ngl = doc["placement"]["n_gpu_layers"]
    if ngl >= 0:
        for more in (ngl + 1, ngl + 2):
            other = plan(models[name], gpu, ["-c", str(ctx), "-ngl", str(more)])
            assert not within_margin(other) or other["speed"]["tg"] <= tg * 1.02, (more, other["speed"]["tg"], tg)
    if name != "qwen3-30b-a3b":  # dense: the fastest FFN-first placement that fits is no more than 2 % faster
        for m in range(1, 48):
            other = plan(models[name], gpu, ["-c", str(ctx), "-ngl", "all", "--n-cpu-ffn", str(m)])
            if within_margin(other):
                assert other["speed"]["tg"] <= tg * 1.02, (m, other["speed"]["tg"], tg)
                break


def test_each_preference_takes_its_row(models: dict[str, Path]) -> None:
    """speed: the fastest row, then the largest context its placement holds; context: the largest the machine
    holds; balanced between them, at half the fastest generation or more."""
    gpu = CASES["qwen3-8b"][0]
    docs = {p: plan(models["qwen3-8b"], gpu, prefer=p) for p in ("speed", "balanced", "context")}
    ctx = {p: d["context"]["n_ctx"] for p, d in docs.items()}
    tg = {p: d["speed"]["tg"] for p, d in docs.items()}
    assert ctx["speed"] < ctx["balanced"] < ctx["context"] == 40960
    assert tg["speed"] > tg["balanced"] > tg["context"] and tg["balanced"] >= 0.5 * tg["speed"]
    fastest = max(docs["balanced"]["tradeoffs"], key=lambda r: r["tg"])
    assert fastest["tg"] == pytest.approx(tg["speed"], rel=0.02)
    reason = next(d["message"] for d in docs["balanced"]["decisions"] if d["code"] == "context.reduced")
    assert "keeps 50% of the fastest placement's speed" in reason and "--prefer context" in reason


def test_a_moe_keeps_its_training_context_under_prefer_context(models: dict[str, Path]) -> None:
    gpu = CASES["qwen3-30b-a3b"][0]
    context = plan(models["qwen3-30b-a3b"], gpu, prefer="context")
    speed = plan(models["qwen3-30b-a3b"], gpu, prefer="speed")
    assert context["context"]["n_ctx"] == 40960  # the host holds it: more experts go there
    assert speed["context"]["n_ctx"] < 8192 and speed["speed"]["tg"] > context["speed"]["tg"]
    argv = " ".join(context["argv"])
    assert "--n-cpu-moe" in argv and "-c 40960" in argv


def test_ffn_first_is_a_placement_llama_server_reads(models: dict[str, Path]) -> None:
    """An FFN-first choice reaches the server as --n-cpu-ffn (common/arg.cpp), the same weights the plan put on the
    CPU; a build without the flag gets the same placement as -ot entries."""
    from llamafit.server.args import Planned
    from llamafit.server.capabilities import ASSUMED
    from llamafit.server.compat import supported

    doc = plan(models["qwen3-8b"], CASES["qwen3-8b"][0], prefer="speed")
    assert "--n-cpu-ffn" in doc["argv"]
    m = int(doc["argv"][doc["argv"].index("--n-cpu-ffn") + 1])
    assert [o for o in doc["placement"]["overrides"]] == [rf"blk\.{i}\.ffn_(up|down|gate)\.=CPU" for i in range(m)]
    older = type(ASSUMED)(**{**ASSUMED.__dict__, "flags": ASSUMED.flags - {"--n-cpu-ffn", "-ncffn"}})
    kept, _ = supported([Planned("overrides", ("--n-cpu-ffn", "2", "-ot", "x=CPU"))], older)
    assert kept == [
        Planned("overrides", ("-ot", r"blk\.0\.ffn_(up|down|gate)\.=CPU,blk\.1\.ffn_(up|down|gate)\.=CPU,x=CPU"))
    ]


def test_plan_shows_the_trade_off_and_run_says_the_next_row(models: dict[str, Path]) -> None:
    gpu, path = CASES["qwen3-8b"][0], str(models["qwen3-8b"])
    host = ["--host-ram", "32GiB", "--host-bandwidth", "60GB/s", "--host-cores", "8"]
    shown = CliRunner().invoke(app, ["plan", path, "--gpu", gpu, *host])
    assert shown.exit_code == 0, shown.output
    table = shown.stdout[shown.stdout.index("Context and speed") :].split("\n\n")[0].splitlines()[1:]
    assert 3 <= len(table) <= 6 and sum(line.startswith(">") for line in table) == 1
    assert all("tg" in line and "pp" in line for line in table)
    doc = json.loads(CliRunner().invoke(app, ["plan", path, "--gpu", gpu, *host, "--json"]).stdout)
    rows = doc["tradeoffs"]
    i = next(i for i, r in enumerate(rows) if r["chosen"])
    nxt = rows[i + 1]
    ran = CliRunner().invoke(app, ["run", path, "--gpu", gpu, *host, "--dry-run"])
    assert ran.exit_code == 0, ran.output
    assert f"trade-off: context {nxt['n_ctx']} at tg {nxt['tg']:.1f} tok/s instead" in ran.stderr
    assert " ".join(nxt["flags"]) in ran.stderr


def test_a_card_slower_than_the_host_is_left_the_layers_it_would_slow(models: dict[str, Path]) -> None:
    """A small card that reads its memory at a sixth of the host's: every layer it could take is faster on the
    host, so the choice takes the ladder's host end and says what it was weighed against; a fast card of the
    same size takes the most it holds."""
    slow = plan(models["qwen3-8b"], "3GiB@10GB/s", ["-c", "4096"])
    fast = plan(models["qwen3-8b"], "3GiB@300GB/s", ["-c", "4096"])
    held = fast["placement"]["n_gpu_layers"]
    assert 0 < held < 37 and slow["placement"]["n_gpu_layers"] == 0
    pinned = plan(models["qwen3-8b"], "3GiB@10GB/s", ["-c", "4096", "-ngl", str(held)])
    assert pinned["fits"] and pinned["speed"]["tg"] < slow["speed"]["tg"]
    said = next(d["message"] for d in slow["decisions"] if d["code"] == "placement.partial")
    assert f"Predicted faster than the most CUDA0 holds here ({held} of 37 layers on the GPUs" in said


@pytest.fixture
def placed_args(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the fit's choice is called with (``args``: search, base, lo, hi, pinned, spec, prefer), once a plan runs."""
    seen: dict[str, Any] = {}
    real = choice.placed

    def spy(*args: Any) -> choice.Fitted:
        seen["args"] = args
        return real(*args)

    monkeypatch.setattr(policy, "placed", spy)
    return seen


def test_a_step_far_from_the_fit_settles_where_the_next_step_no_longer_fits_or_gains(
    models: dict[str, Path], placed_args: dict[str, Any]
) -> None:
    """``settle`` takes a candidate the quick estimate put far from the exact fit (here every layer on the host, 37
    steps from the card) as far toward the card as the exact estimate holds and speeds up: a step, then twice as
    many, then halving. It took at most four single steps before: a quick estimate three times over, as Gemma 3n's
    per-phase one was on a card, left about twenty layers' room."""
    doc = plan(models["qwen3-8b"], CASES["qwen3-8b"][0])
    search, base, _lo, _hi, _pinned, spec, _prefer = placed_args["args"]
    ch = choice.Chooser(search, base, spec, search.rates, search.gpus)
    layers, ctx = ch.ladders[0], doc["context"]["n_ctx"]
    far = ch.trial(layers, layers.last, ctx, exact=True)
    assert far is not None and far.ok
    got = ch.settle(ch._priced(layers, layers.last, far))
    assert got is not None and layers.last - got.step > 8, got.step
    nearer = ch.trial(layers, got.step - 1, ctx, exact=True)
    assert nearer is None or not nearer.ok or not choice.faster(ch._priced(layers, got.step - 1, nearer), got)


def test_a_gemma3n_fills_the_card_its_per_layer_table_is_not_priced_on(
    tmp_path: Path, placed_args: dict[str, Any]
) -> None:
    """An E2B-sized Gemma 3n on a 4 GiB card: one more layer than chosen does not fit it. Its per-phase compute
    estimate, which the quick search packs by, priced op offload's copy of its 2 GB per-layer table (read by rows,
    never offloaded) on the card, three times the replay: 4 of 31 layers were chosen (15.8 tok/s predicted) where
    30 fit (75)."""
    model = factory.gemma3n(n_layer=30, n_embd=2048, n_head=8, head_dim=256, n_ff=8192, n_vocab=262144, w="q8_0").write(
        tmp_path / "gemma3n-e2b.gguf"
    )
    doc = plan(model, "4GiB")
    ngl = doc["placement"]["n_gpu_layers"]
    assert doc["fits"] and 20 < ngl < 31, ngl
    more = plan(model, "4GiB", ["-ngl", str(ngl + 1), "-c", str(doc["context"]["n_ctx"])])
    assert not within_margin(more), more.get("placement", {}).get("n_gpu_layers")
    search, base, _lo, _hi, _pinned, spec, _prefer = placed_args["args"]
    quick = search.run(replace(base, n_ctx=doc["context"]["n_ctx"], n_gpu_layers=ngl), spec, exact=False)
    table = next(t.info.nbytes for t in search.model.tensors if t.name == "per_layer_token_embd.weight")
    assert quick.fp.gpus["CUDA0"].compute < table / 4
