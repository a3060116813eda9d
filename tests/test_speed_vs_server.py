"""The speed pipeline against the real binaries: the probe measures the host with llama-bench, tune measures
the candidates that fit and plan starts from the winner, and the demo holds a served request to the plan's
prediction. Nothing here asserts how fast anything is (bench/speed_model.py does that, in numbers)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.gguf.model import load_model
from llamafit.options import Options
from llamafit.paths import cache_dir
from llamafit.planning.planner import prepare
from llamafit.server.binary import ServerBinary
from llamafit.speed import attention_run as ar
from llamafit.speed import busy
from llamafit.speed import probe_models as pm
from llamafit.speed.bench import bench_binary, run_bench
from tests import factory

pytestmark = pytest.mark.server


@pytest.fixture
def probing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measuring allowed, on a machine quiet enough for the probe to measure: a probe rightly defers on a
    busy one (llamafit.speed.busy), so the test waits for the quiet it needs, and names what kept it busy."""
    monkeypatch.setenv("LLAMAFIT_PROBE", "auto")
    if (why := busy.wait_quiet(None, time.monotonic() + 90)) is not None:
        pytest.fail(f"{why}: {_busiest()}")


def _busiest() -> str:
    """The processes using the most CPU over a second, named."""
    procs = list(psutil.process_iter(["pid", "name"]))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
    time.sleep(1.0)
    use = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            use.append((p.cpu_percent(None), f"{p.info['name']}({p.info['pid']})"))
    return ", ".join(f"{name} {pct:.0f}%" for pct, name in sorted(use, reverse=True)[:5])


def invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_the_probe_measures_the_host_once_and_the_plan_predicts_from_it(
    server_bin: ServerBinary, tmp_path: Path, probing: None
) -> None:
    model = str(ensure_demo_model(tmp_path))
    rc, out, err = invoke("plan", model, "--cpu-only", "--json", "--server", server_bin.path, "--", "-c", "2048")
    assert rc == 0, err
    doc = json.loads(out)
    sp = doc["speed"]
    assert sp["source"] == "estimated", doc["notes"]
    assert sp["source"] == "estimated" and sp["pp"] > 0 and sp["tg"] > 0 and sp["devices"][0]["rates"] == "measured"
    assert any("measured this machine's speed" in n for n in doc["notes"])
    rc, out, err = invoke("plan", model, "--cpu-only", "--json", "--server", server_bin.path, "--", "-c", "2048")
    again = json.loads(out)
    assert again["speed"]["tg"] == sp["tg"] and not any("measured this machine" in n for n in again["notes"])
    # an attention run timed at a shallower cache than this plan has the time for (an earlier plan's, with less
    # time left) is timed again at the deepest, by the real llama-bench
    rates = cache_dir() / "speed" / "rates.json"
    doc = json.loads(rates.read_text())
    timed = [e for e in doc["entries"].values() if e.get("attn_tgd")]
    assert len(timed) == 1 and timed[0]["depth"] == ar.DEPTH_PLAN, timed  # a plan's own time: no deeper
    timed[0]["depth"] = ar.DEPTHS[-1]
    rates.write_text(json.dumps(doc))
    rc, out, err = invoke("plan", model, "--cpu-only", "--json", "--server", server_bin.path, "--", "-c", "2048")
    assert rc == 0 and any("measured this machine" in n for n in json.loads(out)["notes"]), err
    deep = [e for e in json.loads(rates.read_text())["entries"].values() if e.get("attn_tgd")]
    assert len(deep) == 1 and deep[0]["depth"] == ar.DEPTH_PLAN, deep
    # a longer budget than a plan's (tune's) times it as deep as the plan's context: a host's cost a cached cell
    # changes with the depth, so a 1024-cell run extrapolates to 2048 only roughly
    prep = prepare(model, Options(cpu_only=True, server=server_bin.path, server_args=("-c", "2048")), measure=60)
    assert prep.plan.footprint.context.n_ctx_seq == 2048
    full = [e for e in json.loads(rates.read_text())["entries"].values() if e.get("attn_tgd")]
    assert len(full) == 1 and full[0]["depth"] == 2048, full


def test_tune_measures_what_fits_and_plan_and_run_start_from_the_winner(
    server_bin: ServerBinary, tmp_path: Path, probing: None
) -> None:
    model = str(ensure_demo_model(tmp_path))
    rc, out, err = invoke("tune", model, "--cpu-only", "--budget", "20", "--json", "--server", server_bin.path)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "llamafit.tune/1" and doc["best"] is not None
    measured = [c for c in doc["candidates"] if c["tg"]]
    assert measured and all(c["argv"][1:3] == ["-m", model] and c["fits"] for c in measured)
    assert doc["best"]["tg"] and doc["best"]["pp"]
    rc, out, err = invoke("plan", model, "--cpu-only", "--json", "--server", server_bin.path)
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["speed"]["source"] == "measured" and plan["speed"]["tg"] == doc["best"]["tg"]
    assert any(d["code"] == "speed.tuned" for d in plan["decisions"])
    flags = doc["best"]["flags"]
    assert flags == [] or " ".join(flags) in " ".join(plan["argv"])
    rc, out, _ = invoke("run", model, "--cpu-only", "--dry-run", "--server", server_bin.path)
    assert rc == 0 and (flags == [] or " ".join(flags) in out)


def test_the_demo_holds_its_request_to_the_predicted_speed(server_bin: ServerBinary, probing: None) -> None:
    rc, out, err = invoke("demo", "--server", server_bin.path, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["plan"]["speed"]["source"] == "estimated"
    (check,) = doc["speed"]
    assert check["gen_tokens"] == 8 and check["tg_measured"] > 0 and check["tg_predicted"] > 0


def test_llama_bench_runs_the_twin_of_a_model_with_per_head_norms(server_bin: ServerBinary, tmp_path: Path) -> None:
    """The twin of a Qwen3-MoE-like model is written as a qwen3moe GGUF: the real llama-bench loads it and times
    both a prompt and a generation (the probe's two questions of a twin)."""
    bench = bench_binary(server_bin.path)
    assert bench is not None
    twin = pm.twin_of(load_model(str(factory.moe(n_expert=16, n_expert_used=4).write(tmp_path / "m.gguf"))))
    assert twin is not None and twin.arch == "qwen3moe"
    path = str(pm.ensure(twin, tmp_path))
    got = run_bench(bench, ["-m", path, "-p", "32", "-n", "4", "-r", "1", "-t", "1"], server_bin.env(), timeout=120)
    assert sorted((r.n_prompt, r.n_gen) for r in got if r.model == path) == [(0, 4), (32, 0)]
