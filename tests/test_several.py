"""Several models at once: planned together, written as llama-server's router preset, run under the real
router with each instance's buffers held to its own plan."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.errors import ExitCode, UsageError
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary
from llamafit.several.preset import read_ini, section_text, to_tokens
from llamafit.several.router_log import RouterLog
from llamafit.several.together import entries_from_preset
from tests import factory
from tests.realserver import health, launch_run, read_json_doc, router_models, stop_run

# -- the preset format -----------------------------------------------------------------------------


def test_a_user_preset_is_read_as_llama_cpp_reads_it() -> None:
    text = """
version = 1
; a comment
[*]
c = 2048
no-warmup = true

[chat]
model = /m/chat.gguf   # where it is
np = 1
LLAMA_ARG_CACHE_TYPE_K = q8_0
kv-offload = false
load-on-startup = false
stop-timeout = 5

[embed]
hf-repo = acme/embed:Q8_0
embeddings = on
c = 512
"""
    chat, embed = entries_from_preset(read_ini(text), "in.ini")
    assert (chat.name, chat.ref, embed.ref) == ("chat", "/m/chat.gguf", "acme/embed:Q8_0")
    # [*]'s options, then the section's, each in the sorted order of its keys (llama.cpp's std::map)
    assert chat.args == (
        "--ctx-size",
        "2048",
        "--no-warmup",
        "--cache-type-k",
        "q8_0",
        "--no-kv-offload",
        "--parallel",
        "1",
    )
    assert chat.load_on_startup is False and chat.extra == (("stop-timeout", "5"),)
    # a model's own key is last-wins over [*], as llama.cpp merges them
    assert embed.args == ("--ctx-size", "2048", "--no-warmup", "--ctx-size", "512", "--embedding")
    assert parse_server_args(list(embed.args)).last("--ctx-size").value == "512"  # type: ignore[union-attr]
    assert embed.load_on_startup is None
    assert chat.pinned_ctx([]) and embed.pinned_ctx([])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[a]\nmodel = x.gguf\nwat = 1\n", "not a llama-server option"),
        ("[a]\nmodel = x.gguf\nthis line is not ini\n", "not a preset line"),
        ("[a]\nmodel = x.gguf\nmodels-max = 2\n", "router's command line"),
        ("[a]\nnp = 2\n", "no model"),
        ("[*]\nc = 2\n", "no model sections"),
        # the router reads a switch exactly (common/arg.cpp:1337-1343) and takes any other word as true
        ("[a]\nmodel = x.gguf\nkv-offload = False\n", "kv-offload = False: llama-server reads only"),
        ("[a]\nmodel = x.gguf\nno-kv-offload = yes\n", "it would pass --kv-offload"),
        ("[a]\nmodel = x.gguf\nload-on-startup = True\n", r"a\]: load-on-startup = True.*not load the model"),
    ],
)
def test_a_broken_preset_says_where(text: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        entries_from_preset(read_ini(text, "in.ini"), "in.ini")


def test_a_negated_switch_is_read_as_the_router_reads_it() -> None:
    # parse_bool_arg turns a negated key's value into its opposite, to_args puts the flag on unless it is falsey
    # (common/preset.cpp:53-64, 268-276)
    for text, on in (("no-kv-offload = true", False), ("no-kv-offload = 0", True), ("kv-offload = off", False)):
        (entry,) = entries_from_preset(read_ini(f"[a]\nmodel = x.gguf\n{text}\n", "in.ini"), "in.ini")
        assert parse_server_args(list(entry.args)).flag("--kv-offload") is on, text


def test_a_planned_section_starts_the_same_server() -> None:
    argv = ["-m", "/m/a.gguf", "-c", "4096", "-c", "8192", "-ot", "blk\\.0\\.ffn_.*=CPU", "-ot", "blk\\.1\\.ffn_.*=CPU",
            "-nkvo", "-fit", "off", "-ngl", "all"]  # fmt: skip
    text = section_text("a", argv, [("load-on-startup", "true")])
    (sec,) = read_ini(text)
    assert sec.values["ctx-size"] == "8192"  # last wins, as on the command line
    assert sec.values["override-tensor"] == "blk\\.0\\.ffn_.*=CPU,blk\\.1\\.ffn_.*=CPU"  # a list option, joined
    assert sec.values["kv-offload"] == "false" and sec.values["load-on-startup"] == "true"
    tokens, only = to_tokens(sec.values, "a")
    assert only == {"load-on-startup": "true"}
    args = parse_server_args(tokens)
    assert args.last("--model").value == "/m/a.gguf" and args.flag("--kv-offload") is False  # type: ignore[union-attr]
    assert args.last("--gpu-layers").value == "all"  # type: ignore[union-attr]


def test_models_on_the_command_line_get_names_of_their_own() -> None:
    from llamafit.several.together import entries_from_refs

    es = entries_from_refs(["/m/chat.gguf", "/n/chat.gguf", "/m/big-00001-of-00003.gguf", "acme/emb:Q8_0"], ["chat"])
    assert [e.name for e in es] == ["chat-2", "chat-3", "big", "emb:Q8_0"]


@pytest.mark.parametrize("path", ["/m/a#1.gguf", "/m/a;b.gguf", "/m/a.gguf ", "/m/a\nb.gguf"])
def test_a_value_a_preset_cannot_carry_is_refused(path: str) -> None:
    with pytest.raises(UsageError, match="preset cannot carry"):
        section_text("a", ["-m", path])


def test_the_router_log_is_told_apart_per_instance() -> None:
    rl = RouterLog()
    lines = [
        "0.00.024.004 I srv          load: spawning server instance with name=chat on port 43675",
        "0.00.024.349 I srv          load: spawning server instance with name=embed on port 44875",
        "0.00.030.399 I srv  llama_server: listening on http://127.0.0.1:18080",
        "[43675] 0.01.522.197 I load_tensors:   CPU_Mapped model buffer size =     1.32 MiB",
        "[44875] 0.01.524.015 I llama_kv_cache:        CPU KV buffer size =   448.00 MiB",
        "[43675] 0.01.788.154 I srv  llama_server: listening on http://127.0.0.1:43675",
        "0.00.037.039 I srv           run: instance name=embed exited with status 1",
    ]
    events = [rl.feed(x) for x in lines]
    assert [e[2] for e in events] == ["spawned", "spawned", "", "", "", "ready", "exited"]
    assert events[2][0] is None  # the router's own line
    chat, embed = rl.instances["chat"], rl.instances["embed"]
    assert chat.ready and chat.lines[0].endswith("1.32 MiB") and len(chat.lines) == 2
    assert not embed.ready and embed.exit_code == 1 and "KV buffer" in embed.lines[0]


def test_an_exit_logged_after_the_next_spawn_is_the_earlier_instances() -> None:
    """The router names an exit by model only, and may spawn the model's next instance (the last one unloaded)
    before it logs the last one's exit: that exit is the earlier instance's, not the one just spawned."""
    rl = RouterLog()
    lines = [
        "load: spawning server instance with name=one on port 40000",
        "[40000] I srv  llama_server: listening on http://127.0.0.1:40000",
        "load: spawning server instance with name=one on port 40001",
        "run: instance name=one exited with status -9",
        "[40001] I srv  llama_server: listening on http://127.0.0.1:40001",
        "run: instance name=one exited with status 0",
    ]
    events = [rl.feed(x) for x in lines]
    assert [(e[0].port if e[0] else None, e[2]) for e in events] == [
        (40000, "spawned"), (40000, "ready"), (40001, "spawned"), (40000, "exited"), (40001, "ready"), (40001, "exited")
    ]  # fmt: skip
    assert events[3][0] is not None and events[3][0].exit_code == -9
    assert rl.feed("run: instance name=one exited with status 1")[0] is None  # no instance of it is running


# -- planning together (described GPUs) ------------------------------------------------------------


@pytest.fixture(scope="module")
def eights(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("eights")
    return [factory.qwen3_8b().write(d / f"Qwen3-8B-{k}-Q4_K_M.gguf") for k in "ABC"]


def plan_json(*args: str, code: int = 0) -> dict:  # type: ignore[type-arg]
    cut = args.index("--") if "--" in args else len(args)
    r = CliRunner().invoke(app, ["plan", *args[:cut], "--json", "--", *args[cut + 1 :]])
    assert r.exit_code == code, r.stderr
    return json.loads(r.stdout) if code == 0 else {}  # type: ignore[no-any-return]


def test_two_models_that_fit_keep_what_they_get_alone(eights: list[Path]) -> None:
    doc = plan_json(str(eights[0]), str(eights[1]), "--gpu", "24GiB")
    a, b = doc["models"]
    assert doc["schema"] == "llamafit.plan-set/1" and a["schema"] == b["schema"] == "llamafit.plan/1"
    assert doc["models_max"] == 2 and a["resident"] and b["resident"]
    assert a["context"]["n_ctx"] == a["alone_ctx"] == 40960 == b["context"]["n_ctx"]
    assert {d["code"] for d in doc["decisions"]} == {"models.resident", "models.context"}
    (card,) = doc["devices"]
    assert card["id"] == "CUDA0" and card["need"] == a["devices"][0]["need"] + b["devices"][0]["need"] <= card["usable"]
    # the preset the router reads: one section each, with the planned context and placement
    secs = {s.name: s.values for s in read_ini(doc["preset"])}
    assert secs[a["name"]]["ctx-size"] == "40960" and secs[a["name"]]["fit"] == "off"
    # without --models-preset-out the preset's path is a placeholder: the preset itself is in the document
    assert doc["argv"][1:] == ["--models-preset", "PRESET.ini", "--models-max", "2"] and doc["preset_path"] is None


def test_contexts_are_cut_together_in_proportion(eights: list[Path]) -> None:
    doc = plan_json(str(eights[0]), str(eights[1]), "--gpu", "16GiB")
    a, b = doc["models"]
    assert a["alone_ctx"] == b["alone_ctx"] == 40960
    assert 4096 <= a["context"]["n_ctx"] < 40960
    assert abs(a["context"]["n_ctx"] - b["context"]["n_ctx"]) <= 256  # the same factor of the same alone context
    (card,) = doc["devices"]
    assert card["fits"] and card["need"] <= card["usable"] and doc["fits"]
    assert a["placement"]["n_gpu_layers"] == b["placement"]["n_gpu_layers"]  # both whole on the card
    msg = next(d["message"] for d in doc["decisions"] if d["code"] == "models.context")
    assert "cut to" in msg and "alone 40960" in msg
    # a tighter card: less context each, never below --min-ctx
    tight = plan_json(str(eights[0]), str(eights[1]), "--gpu", "14GiB")
    assert 4096 <= tight["models"][0]["context"]["n_ctx"] < a["context"]["n_ctx"]


def test_a_context_you_set_is_kept(eights: list[Path], tmp_path: Path) -> None:
    ini = tmp_path / "in.ini"
    ini.write_text(f"[a]\nmodel = {eights[0]}\nc = 8192\n\n[b]\nmodel = {eights[1]}\n")
    doc = plan_json("--models-preset", str(ini), "--gpu", "16GiB")
    a, b = doc["models"]
    assert (a["name"], a["context"]["n_ctx"]) == ("a", 8192)
    assert b["context"]["n_ctx"] > 8192  # the room a does not take goes to b
    assert "a 8192 (set)" in next(d["message"] for d in doc["decisions"] if d["code"] == "models.context")


def test_models_that_do_not_fit_together_get_a_budget_or_a_models_max(eights: list[Path], tmp_path: Path) -> None:
    """On the host alone: a margin that leaves room for one 0.6B at -c 4096 and not two."""
    one = factory.qwen3_0_6b().write(tmp_path / "one.gguf")
    two = factory.qwen3_0_6b().write(tmp_path / "two.gguf")
    alone = plan_json(str(one), "--cpu-only", "--", "-c", "4096", "--cache-ram", "0")["host"]["need"]
    margin = psutil.virtual_memory().available - int(alone * 1.5)
    flags = ("--cpu-only", "--margin", f"host={margin}B", "--", "-c", "4096", "--cache-ram", "0")
    doc = plan_json(str(one), str(two), *flags)
    assert doc["models_max"] == 1
    assert [m["resident"] for m in doc["models"]] == [True, False]
    assert {d["code"] for d in doc["decisions"]} >= {"models.budget"}
    assert doc["policy"]["kind"] == "budget" and doc["policy"]["resident_sets"] == [["one"], ["two"]]
    assert "--no-models-autoload" in doc["argv"]
    # a router on a unix socket is not fronted by llamafit: it keeps the router's count
    sock = plan_json(str(one), str(two), *flags, "--host", str(tmp_path / "r.sock"))
    assert sock["policy"] == {"kind": "count", "models_max": 1}
    assert {d["code"] for d in sock["decisions"]} >= {"models.max"}
    secs = {s.name: s.values for s in read_ini(doc["preset"])}
    assert secs["one"]["load-on-startup"] == "true" and secs["two"]["load-on-startup"] == "false"
    # one that does not fit even alone is refused with its numbers
    r = CliRunner().invoke(app, ["plan", str(one), str(eights[0]), "--gpu", "2GiB", "--margin", "host=4TiB"])
    assert r.exit_code == ExitCode.DOES_NOT_FIT and "even alone" in r.stderr


def test_the_planned_preset_and_argv_for_people(eights: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "planned.ini"
    r = CliRunner().invoke(app, ["plan", str(eights[0]), str(eights[1]), "--gpu", "24GiB", "--models-preset-out",
                                 str(out)])  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert out.exists() and [s.name for s in read_ini(out.read_text()) if s.name] == [
        "Qwen3-8B-A-Q4_K_M",
        "Qwen3-8B-B-Q4_K_M",
    ]
    assert f"--models-preset {out} --models-max 2" in r.stdout
    r = CliRunner().invoke(app, ["run", str(eights[0]), str(eights[1]), "--gpu", "24GiB", "--dry-run"])
    assert r.exit_code == 0 and "[Qwen3-8B-A-Q4_K_M]" in r.stdout and "--models-preset" in r.stdout
    r = CliRunner().invoke(app, ["run", str(eights[0]), str(eights[1]), "--exec"])
    assert r.exit_code == ExitCode.USAGE


def test_each_run_has_a_preset_of_its_own(eights: list[Path]) -> None:
    """Two routers started from one data directory at once never read each other's preset."""

    cmd = [sys.executable, "-m", "llamafit", "run", str(eights[0]), str(eights[1]), "--gpu", "24GiB", "--dry-run"]
    outs = [subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ) for _ in range(2)]
    paths = [next(t for t in o.stdout.split() if t.endswith(".ini")) for o in outs]
    assert all(o.returncode == 0 for o in outs) and paths[0] != paths[1]


def test_an_embedding_server_gets_the_context_it_can_use(shapes: dict[str, Path]) -> None:
    doc = plan_json(str(shapes["qwen3"]), "--cpu-only", "--", "--embeddings", "-np", "2", "-ub", "256")
    assert doc["context"]["n_ctx"] == 512 and doc["context"]["n_batch"] == 256
    assert "context.embeddings" in {d["code"] for d in doc["decisions"]}
    assert plan_json(str(shapes["qwen3"]), "--cpu-only", "--", "--embeddings", "-c", "8192")["context"]["n_ctx"] == 8192


# -- the real router ---------------------------------------------------------------------------------


@pytest.mark.server
def test_a_chat_model_with_a_drafter_and_an_embedding_model_run_together(
    server_bin: ServerBinary, shapes: dict[str, Path], tmp_path: Path
) -> None:
    chat = factory.dense(name="chat").write(tmp_path / "chat.gguf")
    draft = factory.dense(name="draft", n_layer=2, n_embd=128, n_head=4).write(tmp_path / "draft.gguf")
    embed = factory.qwen3_0_6b().write(tmp_path / "qwen3-embedding-0.6b-shape.gguf")  # a real embedding shape
    ini = tmp_path / "in.ini"
    ini.write_text(
        "[*]\nno-warmup = true\n\n"
        f"[chat]\nmodel = {chat}\nmodel-draft = {draft}\nnp = 1\n\n"
        f"[embed]\nmodel = {embed}\nembeddings = true\npooling = mean\nubatch-size = 256\n"
    )
    p = launch_run(["--models-preset", str(ini), "--cpu-only", "--json", "--", "--port", "0"], server_bin)
    try:
        doc = read_json_doc(p, 180)
        assert doc["schema"] == "llamafit.run-set/1" and doc["models_max"] == 2, doc  # an error doc says why
        assert set(doc["models"]) == {"chat", "embed"}
        for name, m in doc["models"].items():
            rows = m["memory"]
            assert rows and all(r["within_tolerance"] for r in rows), (name, rows)
            assert all(r["actual_mib"] is not None for r in rows if r["predicted"] > 0)
        assert any(r["context"] == "draft" for r in doc["models"]["chat"]["memory"])  # the drafter, held too
        assert router_models(doc["url"]) == {"chat": "loaded", "embed": "loaded"}
        # the plan the router runs: every model's own flags honoured, the sum within the host's budget
        plan = {m["name"]: m for m in doc["plan"]["models"]}
        assert plan["embed"]["context"]["n_ubatch"] == plan["embed"]["context"]["n_batch"] == 256
        assert plan["embed"]["context"]["n_ctx"] == 4 * 256  # four slots of one ubatch each: all it can use
        assert plan["chat"]["context"]["n_seq"] == 1 and plan["chat"]["speculative"]["chosen"] == "draft-simple"
        host = doc["plan"]["host"]
        assert host["fits"] and host["need"] == sum(m["host"]["need"] for m in plan.values()) <= host["usable"]
        ports = [m["port"] for m in doc["models"].values()]
    finally:
        code = stop_run(p)
    assert code == 0
    time.sleep(0.5)
    assert [health(port) for port in ports] == [0, 0]  # every instance went with the router
    # each instance's launch is recorded for calibration, like one server's
    r = CliRunner().invoke(app, ["history", "--json"])
    names = [e["model"]["name"] for e in json.loads(r.stdout)["launches"]]
    assert {"chat", "Qwen3-0.6B (shape)"} <= set(names)


@pytest.mark.server
def test_a_set_that_does_not_fit_runs_one_at_a_time(server_bin: ServerBinary, tmp_path: Path) -> None:
    one = factory.qwen3_0_6b().write(tmp_path / "one.gguf")
    two = factory.qwen3_0_6b().write(tmp_path / "two.gguf")
    alone = plan_json(str(one), "--cpu-only", "--", "-c", "4096", "--no-warmup")["host"]["need"]
    margin = psutil.virtual_memory().available - int(alone * 1.5)
    args = [str(one), str(two), "--cpu-only", "--json", "--margin", f"host={margin}B", "--", "-c", "4096",
            "--no-warmup", "--port", "0"]  # fmt: skip
    p = launch_run(args, server_bin)
    try:
        doc = read_json_doc(p, 180)
        assert doc["models_max"] == 1 and set(doc["models"]) == {"one"}
        assert router_models(doc["url"]) == {"one": "loaded", "two": "unloaded"}
        host, port = doc["url"].split("//")[1].split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.request(
            "POST", "/models/load", body=json.dumps({"model": "two"}), headers={"Content-Type": "application/json"}
        )
        assert c.getresponse().status == 200
        deadline = time.monotonic() + 120
        while router_models(doc["url"]) != {"one": "unloaded", "two": "loaded"}:
            assert time.monotonic() < deadline, router_models(doc["url"])
            time.sleep(0.3)
    finally:
        assert stop_run(p) == 0


@pytest.mark.server
def test_a_model_that_fails_to_load_is_named_and_the_router_stops(
    server_bin: ServerBinary, shapes: dict[str, Path], tmp_path: Path
) -> None:
    """A chat template file that is not there: the plan does not read it, the instance exits at start."""
    ini = tmp_path / "in.ini"
    ini.write_text(
        f"[*]\nno-warmup = true\n\n[chat]\nmodel = {shapes['dense']}\nnp = 1\n\n"
        f"[broken]\nmodel = {shapes['qwen3']}\nchat-template-file = {tmp_path / 'missing.jinja'}\n"
    )
    p = launch_run(["--models-preset", str(ini), "--cpu-only", "--verbose", "--", "--port", "0"], server_bin)
    _, err = p.communicate(timeout=180)
    assert p.returncode == ExitCode.SERVER_LOAD_FAILED, err[-3000:]
    assert "broken failed to load" in err
    ports = [int(m) for m in re.findall(r"spawning server instance with name=\S+ on port (\d+)", err)]
    assert len(ports) == 2 and [health(port) for port in ports] == [0, 0]


def test_devices_that_cannot_be_sized_are_said(shapes: dict[str, Path]) -> None:
    from llamafit.devices.machine import Host, Machine
    from llamafit.options import Options
    from llamafit.planning.planner import prepare
    from llamafit.server.capabilities import ASSUMED
    from llamafit.several.together import entries_from_refs, plan_together
    from llamafit.units import GiB

    machine = Machine((), Host(64 * GiB, 64 * GiB), blind=("Vulkan0 reports no memory",))
    entries = entries_from_refs([str(shapes["dense"]), str(shapes["qwen3"])])
    t = plan_together(entries, Options(), machine, lambda ref, o, m: prepare(ref, o, machine=m, server=(None, ASSUMED)))
    blind = next(d for d in t.decisions if d.code == "models.blind")
    assert "Vulkan0 reports no memory" in blind.message and t.models_max == 2


@pytest.mark.server
def test_a_router_that_dies_after_ready_is_started_again(server_bin: ServerBinary, tmp_path: Path) -> None:
    one = factory.qwen3_0_6b().write(tmp_path / "one.gguf")
    two = factory.qwen3_0_6b().write(tmp_path / "two.gguf")
    args = [str(one), str(two), "--cpu-only", "--json", "--max-restarts", "1", "--", "-c", "4096", "--no-warmup",
            "--port", "0"]  # fmt: skip
    p = launch_run(args, server_bin)
    try:
        first = read_json_doc(p, 180)
        router = [c for c in psutil.Process(p.pid).children() if "--models-preset" in " ".join(c.cmdline())]
        assert len(router) == 1
        router[0].kill()
        again = read_json_doc(p, 180)  # every resident model ready once more
        assert set(again["models"]) == set(first["models"]) == {"one", "two"}
        assert all(v == "loaded" for v in router_models(again["url"]).values())
    finally:
        assert stop_run(p) == 0


def test_a_bad_value_in_a_preset_section_says_whose(eights: list[Path], tmp_path: Path) -> None:
    """A value llama-server would refuse, in one model's section, is said with that model's name (it was said
    without: "--ctx-size expects an integer", of which of the models?)."""
    preset = tmp_path / "p.ini"
    preset.write_text(f"[chat]\nmodel = {eights[0]}\n[coder]\nmodel = {eights[1]}\nctx-size = abc\n")
    r = CliRunner().invoke(app, ["plan", "--models-preset", str(preset), "--gpu", "24GiB"])
    assert r.exit_code == ExitCode.USAGE, r.output
    assert "coder: --ctx-size expects an integer, got 'abc'" in r.stderr


def test_the_router_is_ready_only_after_its_instances_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's readiness (the announcer's thread) can come while the log's reader is between an instance's
    ready line and its InstanceReady: AllReady then waits for it, so a ``--json`` run-set names every model (it once
    came first and named none). The other thread's arrival is forced at that point: inside the keeper's ``ready``."""
    import threading
    from types import SimpleNamespace

    from llamafit.serving.events import AllReady, InstanceReady
    from llamafit.several import router

    monkeypatch.setattr(router, "compare_all", lambda prep, log: ())
    events: list[object] = []
    att = object.__new__(router._Attempt)
    att.plans = {"demo": SimpleNamespace(prep=None)}
    att.resident = frozenset({"demo"})
    att.reported, att.failures, att.front = set(), {}, None
    att.finishing = threading.Lock()
    att.w = router._Watch()
    att.on_event = events.append
    att.sup = SimpleNamespace(pid=1)

    def ready(*_: object) -> None:  # the router answers now, on the announcer's thread
        att.w.url = "http://127.0.0.1:1"
        att.finish_if_all_ready()

    att.keeper = SimpleNamespace(router_pid=None, ready=ready)
    att.instance_ready(SimpleNamespace(name="demo", port=2, log=lambda: None))
    kinds = [type(e) for e in events]
    assert kinds == [InstanceReady, AllReady], kinds
