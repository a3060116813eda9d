"""Hub models through the real huggingface_hub client and a loopback Hub (tests/hubserver.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafit.cli.app import app
from llamafit.errors import ExitCode
from llamafit.gguf.demo_model import ensure_demo_model
from llamafit.gguf.writer import TensorSpec, write_gguf
from llamafit.hub.cache import hub_cache_dir
from llamafit.server.binary import ServerBinary, free_port
from tests import factory
from tests.hubserver import FakeHub
from tests.realserver import read_until

TOKEN = "hf_" + "a" * 34


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hubfiles")
    alone = tmp_path_factory.mktemp("qwen06")  # no sidecar beside it: the local plan has no drafter either
    out = {
        "q06_q8": factory.qwen3_0_6b().write(alone / "Qwen3-0.6B-Q8_0.gguf"),
        "q06_q4": factory.qwen3_0_6b(w="q4_K").write(alone / "Qwen3-0.6B-Q4_K_M.gguf"),
        "q8b": factory.qwen3_8b().write(d / "Qwen3-8B-Q4_K_M.gguf"),
        "gemma": factory.gemma3().write(d / "gemma3-Q8_0.gguf"),
        "mmproj": factory.siglip_mmproj(text_embd=256).write(d / "mmproj-gemma3-F16.gguf"),
        "demo": ensure_demo_model(d),
        # the logits' bias: a node no builder makes, so its compute is estimated
        "qwen2": factory.dense(arch="qwen2", name="qwen2", qkv_bias=True, output_bias=True).write(
            d / "qwen2-Q8_0.gguf"
        ),
        "readme": d / "README.md",
        "broken": d / "broken-Q8_0.gguf",
    }
    out["readme"].write_text("# a model card\n")
    out["broken"].write_bytes(b"<html>not a model</html>" * 100)
    eagle = d / "eagle3-Qwen3-8B-Q8_0.gguf"
    kv = {"eagle3.block_count": 1, "eagle3.embedding_length": 4096, "eagle3.context_length": 40960,
          "eagle3.attention.head_count": 32, "eagle3.attention.head_count_kv": 8, "eagle3.feed_forward_length": 12288,
          "eagle3.target_layers": [2, 18, 33]}  # fmt: skip
    write_gguf(eagle, "eagle3", kv, [TensorSpec("blk.0.attn_norm.weight", (4096,)),
                                     TensorSpec("fc.weight", (3 * 4096, 4096), "f16")])  # fmt: skip
    out["eagle3"] = eagle
    kv = {k.replace("eagle3", "dflash"): v for k, v in kv.items()}
    dflash_tensors = [TensorSpec("blk.0.attn_norm.weight", (4096,)), TensorSpec("fc.weight", (3 * 4096, 4096), "q8_0"),
                      *(TensorSpec(f"blk.0.attn_{t}.weight", (4096, 1024 if t in "kv" else 4096), "q8_0")
                        for t in ("q", "k", "v", "output"))]  # fmt: skip
    for q in ("Q8_0", "BF16"):
        out[f"dflash_{q}"] = d / f"dflash-Qwen3-8B-{q}.gguf"
        write_gguf(out[f"dflash_{q}"], "dflash", kv, dflash_tensors)
    mtp_dir = tmp_path_factory.mktemp("mtp")
    out["mtp1"], out["mtp2"] = factory.write_split(mtp_dir, "mtp-Qwen3-8B-Q8_0", factory.dense(n_embd=4096), 2)
    split_dir = d / "split"
    split_dir.mkdir()
    for i, p in enumerate(factory.write_split(split_dir, "m-Q8_0", factory.dense(w="q8_0"), 3)):
        out[f"split{i + 1}"] = p
    return out


@pytest.fixture(scope="module")
def fake_hub(files: dict[str, Path]) -> Iterator[FakeHub]:
    hub = FakeHub()
    f = files
    hub.add("acme/qwen3-0.6b", {"README.md": f["readme"], "Qwen3-0.6B-Q8_0.gguf": f["q06_q8"],
                                "Qwen3-0.6B-Q4_K_M.gguf": f["q06_q4"]})  # fmt: skip
    split = {f"Q8_0/m-Q8_0-0000{i}-of-00003.gguf": f[f"split{i}"] for i in (1, 2, 3)}
    hub.add("acme/split", split)
    hub.add("acme/partial", split, unlisted={"Q8_0/m-Q8_0-00002-of-00003.gguf"})
    hub.add("acme/gemma-vision", {"gemma3-Q8_0.gguf": f["gemma"], "mmproj-gemma3-F16.gguf": f["mmproj"]})
    hub.add("acme/qwen3-8b", {"Qwen3-8B-Q4_K_M.gguf": f["q8b"], "eagle3-Qwen3-8B-Q8_0.gguf": f["eagle3"]})
    hub.add("acme/qwen3-8b-dflash", {"Qwen3-8B-Q4_K_M.gguf": f["q8b"], "dflash-Qwen3-8B-BF16.gguf": f["dflash_BF16"],
                                     "dflash-Qwen3-8B-Q8_0.gguf": f["dflash_Q8_0"],
                                     "mtp-Qwen3-8B-Q8_0-00001-of-00002.gguf": f["mtp1"],
                                     "mtp-Qwen3-8B-Q8_0-00002-of-00002.gguf": f["mtp2"]},
            unlisted={"mtp-Qwen3-8B-Q8_0-00002-of-00002.gguf"})  # fmt: skip
    hub.add("acme/gated", {"Qwen3-0.6B-Q8_0.gguf": f["q06_q8"]}, gated=True, token=TOKEN)
    hub.add("acme/broken", {"broken-Q8_0.gguf": f["broken"]})
    hub.add("acme/demo", {"README.md": f["readme"], "demo-Q8_0.gguf": f["demo"], "demo-F16.gguf": f["q06_q8"]})
    hub.add("acme/qwen2", {"qwen2-Q8_0.gguf": f["qwen2"]})
    hub.start()
    yield hub
    hub.stop()


def plan_json(*args: str) -> dict:  # type: ignore[type-arg]
    cut = args.index("--") if "--" in args else len(args)
    r = CliRunner().invoke(app, ["plan", *args[:cut], "--json", "--", *args[cut + 1 :]])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def snapshot(repo: str, commit: str, path: str) -> str:
    return str(hub_cache_dir() / ("models--" + repo.replace("/", "--")) / "snapshots" / commit / path)


def test_a_hub_model_is_planned_from_its_header_alone(hub: FakeHub, files: dict[str, Path]) -> None:
    doc = plan_json("acme/qwen3-0.6b", "--gpu", "8GiB")
    commit = hub.repos["acme/qwen3-0.6b"].commit
    # no tag: Q4_K_M first, as llama.cpp; the argv names the file where the cache will hold it
    assert doc["model"]["path"] == snapshot("acme/qwen3-0.6b", commit, "Qwen3-0.6B-Q4_K_M.gguf")
    assert doc["argv"][doc["argv"].index("-m") + 1] == doc["model"]["path"]
    assert [d["path"] for d in doc["downloads"]] == ["Qwen3-0.6B-Q4_K_M.gguf"]
    gets = [r for r in hub.file_requests() if r.method == "GET"]
    assert gets and all(r.range for r in gets), gets  # Range requests only: no weights
    assert hub.bytes_sent("/resolve/") < 8 << 20 < files["q06_q4"].stat().st_size // 40
    assert not Path(doc["model"]["path"]).exists()  # plan downloads nothing


def test_the_hub_plan_equals_the_local_plan(hub: FakeHub, files: dict[str, Path]) -> None:
    remote = plan_json("acme/qwen3-0.6b:Q8_0", "--gpu", "6GiB", "--", "-np", "2")
    local = plan_json(str(files["q06_q8"]), "--gpu", "6GiB", "--", "-np", "2")
    for doc in (remote, local):
        for k in ("argv", "model", "downloads", "notes"):
            doc.pop(k, None)
        for k in ("available", "usable", "runtime"):  # host RAM moves between two calls of psutil
            doc["host"].pop(k)
    assert remote == local


def test_a_second_plan_reads_no_header(hub: FakeHub) -> None:
    plan_json("acme/qwen3-0.6b:Q8_0", "--gpu", "8GiB")
    hub.reset_counts()
    plan_json("acme/qwen3-0.6b:Q8_0", "--gpu", "8GiB")
    assert hub.file_requests() == []


def test_split_sets_and_partial_listings(hub: FakeHub) -> None:
    doc = plan_json("acme/split:Q8_0", "--cpu-only")
    assert len(doc["model"]["shards"]) == 3 and doc["model"]["path"].endswith("Q8_0/m-Q8_0-00001-of-00003.gguf")
    assert len(doc["downloads"]) == 3
    r = CliRunner().invoke(app, ["plan", "acme/partial:Q8_0", "--cpu-only"])
    assert r.exit_code == 4 and "lacks shard(s) 2" in r.output


def test_unknown_quant_lists_the_quants_there(hub: FakeHub) -> None:
    r = CliRunner().invoke(app, ["plan", "acme/qwen3-0.6b:Q5_K_S"])
    assert r.exit_code == 4 and "no Q5_K_S model file" in r.output and "Q8_0, Q4_K_M" in r.output


def test_unknown_repo_and_file(hub: FakeHub) -> None:
    r = CliRunner().invoke(app, ["plan", "acme/nothing"])
    assert r.exit_code == 4 and "no repo acme/nothing" in r.output
    r = CliRunner().invoke(app, ["plan", "acme/qwen3-0.6b", "--hf-file", "nope.gguf"])
    assert r.exit_code == 4 and "has no file nope.gguf" in r.output
    doc = plan_json("acme/qwen3-0.6b", "--hf-file", "Qwen3-0.6B-Q8_0.gguf", "--cpu-only")
    assert doc["model"]["path"].endswith("Qwen3-0.6B-Q8_0.gguf")


def test_a_gated_repo_says_how_to_authenticate(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    r = CliRunner().invoke(app, ["plan", "acme/gated", "--cpu-only"])
    assert r.exit_code == 8 and "gated" in r.output and "HF_TOKEN" in r.output
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    r = CliRunner().invoke(app, ["plan", "acme/gated", "--cpu-only"])
    assert r.exit_code == 0, r.output
    assert TOKEN not in r.output


def test_a_file_that_is_not_gguf(hub: FakeHub) -> None:
    r = CliRunner().invoke(app, ["plan", "acme/broken"])
    assert r.exit_code == 7 and "not a GGUF file" in r.output


def test_no_network_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    r = CliRunner().invoke(app, ["plan", "acme/qwen3-0.6b"])
    assert r.exit_code == 8 and "acme/qwen3-0.6b" in r.output and "Traceback" not in r.output


def test_the_projector_comes_with_the_model(hub: FakeHub) -> None:
    doc = plan_json("acme/gemma-vision", "--cpu-only")
    assert doc["mmproj"] is not None and doc["mmproj"]["path"].endswith("mmproj-gemma3-F16.gguf")
    argv = doc["argv"]
    assert argv[argv.index("-mm") + 1] == doc["mmproj"]["path"]
    assert {d["path"] for d in doc["downloads"]} == {"gemma3-Q8_0.gguf", "mmproj-gemma3-F16.gguf"}
    off = plan_json("acme/gemma-vision", "--cpu-only", "--", "--no-mmproj")
    assert off["mmproj"] is None and "-mm" not in off["argv"]
    assert {d["path"] for d in off["downloads"]} == {"gemma3-Q8_0.gguf"}


def test_a_sidecar_drafter_is_downloaded_only_when_the_plan_keeps_it(hub: FakeHub) -> None:
    kept = plan_json("acme/qwen3-8b", "--gpu", "24GiB")
    assert kept["speculative"]["chosen"] == "draft-eagle3"
    draft = kept["argv"][kept["argv"].index("-md") + 1]
    assert draft.endswith("eagle3-Qwen3-8B-Q8_0.gguf") and "snapshots" in draft
    assert {d["path"] for d in kept["downloads"]} == {"Qwen3-8B-Q4_K_M.gguf", "eagle3-Qwen3-8B-Q8_0.gguf"}
    off = plan_json("acme/qwen3-8b", "--gpu", "24GiB", "--spec", "off")
    assert {d["path"] for d in off["downloads"]} == {"Qwen3-8B-Q4_K_M.gguf"}


def test_sidecars_follow_llama_cpps_ranking_and_a_partial_one_is_unsized(hub: FakeHub) -> None:
    doc = plan_json("acme/qwen3-8b-dflash", "--gpu", "24GiB", "--spec", "draft-dflash")
    md = doc["argv"][doc["argv"].index("-md") + 1]
    assert md.endswith("dflash-Qwen3-8B-Q8_0.gguf")  # closest quant bits to the Q4_K_M model (8 over 16)
    assert doc["speculative"]["drafter"]["sized"] is True
    # MTP ranks first under auto, but only its first shard is listed: priced with a reserve, and said so
    auto = plan_json("acme/qwen3-8b-dflash", "--gpu", "24GiB")
    assert auto["speculative"]["drafter"]["kind"] == "draft-mtp" and auto["speculative"]["drafter"]["sized"] is False
    assert any("could not be sized" in w for w in auto["warnings"])


def test_draft_repos(hub: FakeHub) -> None:
    doc = plan_json("acme/qwen3-8b", "--gpu", "24GiB", "--draft", "acme/qwen3-0.6b:Q8_0")
    md = doc["argv"][doc["argv"].index("-md") + 1]
    assert md.endswith("Qwen3-0.6B-Q8_0.gguf") and doc["speculative"]["chosen"] == "draft-simple"
    # -hfd with a local-file model: llama-server would not download it, so llamafit resolves it to -md
    doc = plan_json("acme/qwen3-8b", "--gpu", "24GiB", "--", "-hfd", "acme/qwen3-0.6b:Q8_0",
                    "--spec-type", "draft-simple")  # fmt: skip
    assert "-hfd" not in doc["argv"] and doc["argv"][doc["argv"].index("-md") + 1] == md


def test_inspect_a_hub_model(hub: FakeHub) -> None:
    r = CliRunner().invoke(app, ["inspect", "acme/qwen3-0.6b:Q8_0", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["architecture"] == "qwen3"


def test_dry_run_downloads_nothing(hub: FakeHub) -> None:
    r = CliRunner().invoke(app, ["run", "acme/demo", "--dry-run", "--cpu-only"])
    assert r.exit_code == 0, r.output
    assert "run would download 1 file(s)" in r.stderr
    assert all(req.range for req in hub.file_requests() if req.method == "GET")


@pytest.mark.server
def test_run_downloads_the_planned_files_then_launches_them(
    hub: FakeHub, server_bin: ServerBinary, tmp_path: Path
) -> None:
    port = free_port()
    env = dict(os.environ, LLAMAFIT_SERVER=server_bin.path)
    argv = [sys.executable, "-m", "llamafit", "run", "acme/demo:Q8_0", "--cpu-only", "--", "--port", str(port)]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    ready, seen = read_until(p.stderr, "llamafit: ready")
    p.send_signal(2)
    rest = p.stderr.read()
    p.wait(timeout=60)
    err = "".join(seen) + rest
    assert ready and p.returncode == 0, err
    commit = hub.repos["acme/demo"].commit
    local = snapshot("acme/demo", commit, "demo-Q8_0.gguf")
    assert f"-m {local}" in err and "downloading 1 file(s)" in err
    assert Path(local).stat().st_size == ensure_demo_model(tmp_path).stat().st_size
    # only the planned file was fetched whole (the F16 file and the README were not)
    whole = [r.path for r in hub.file_requests() if r.method == "GET" and not r.range]
    assert whole and all(w.endswith("demo-Q8_0.gguf") for w in whole)
    # the ref is written, so the cache alone now plans it: offline, and with no Hub at all
    ref = hub_cache_dir() / "models--acme--demo" / "refs" / "main"
    assert ref.read_text() == commit
    env_off = dict(env, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    for extra, more_env in ((["--offline"], {}), ([], {"HF_HUB_OFFLINE": "1"}), ([], {})):
        argv = [sys.executable, "-m", "llamafit", "plan", "acme/demo:Q8_0", "--cpu-only", "--json", *extra]
        r = subprocess.run(argv, env={**env_off, **more_env}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["model"]["path"] == local
    r = subprocess.run([sys.executable, "-m", "llamafit", "plan", "acme/qwen3-8b", "--offline"], env=env_off,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 4 and "not in the Hugging Face cache" in r.stderr
    shutil.rmtree(hub_cache_dir() / "models--acme--demo")


@pytest.mark.server
def test_a_hub_plan_is_held_to_the_binarys_measurement_once_downloaded(hub: FakeHub, server_bin: ServerBinary) -> None:
    """A Qwen2 with a bias on its logits has its compute estimated (no builder replays that graph): its plan waits for
    the file to be measured by llama-fit-params; run downloads it, makes the plan again, and launches the plan
    the measurement held."""
    doc = plan_json("acme/qwen2:Q8_0", "--cpu-only", "--", "-c", "4096")
    assert doc["memory_model"]["bound"]["by"] is None and "not downloaded yet" in doc["memory_model"]["bound"]["note"]
    port = free_port()
    env = dict(os.environ, LLAMAFIT_SERVER=server_bin.path)
    run = ["run", "acme/qwen2:Q8_0", "--cpu-only", "--", "-c", "4096", "--port", str(port)]
    argv = [sys.executable, "-m", "llamafit", *run]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    ready, seen = read_until(p.stderr, "llamafit: ready")
    p.send_signal(2)
    err = "".join(seen) + p.stderr.read()
    p.wait(timeout=60)
    assert ready and p.returncode == 0, err
    assert "downloading 1 file(s)" in err and "Compute checked with llama-fit-params's no-alloc load" in err
    shutil.rmtree(hub_cache_dir() / "models--acme--qwen2")


def test_cache_directory_precedence_is_llama_cpps() -> None:
    env = {"HOME": "/h"}
    assert hub_cache_dir(env) == Path("/h/.cache/huggingface/hub")
    env["XDG_CACHE_HOME"] = "/x"
    assert hub_cache_dir(env) == Path("/x/huggingface/hub")
    env["HF_HOME"] = "/hf"
    assert hub_cache_dir(env) == Path("/hf/hub")
    env["HUGGINGFACE_HUB_CACHE"] = "/old"
    assert hub_cache_dir(env) == Path("/old")
    env["HF_HUB_CACHE"] = "/new"
    assert hub_cache_dir(env) == Path("/new")
    env["LLAMA_CACHE"] = "/llama"
    assert hub_cache_dir(env) == Path("/llama")  # itself, no /hub appended
    env["LLAMA_CACHE"] = ""
    assert hub_cache_dir(env) == Path("/new")  # an empty value counts as unset


def test_a_cache_written_by_llama_cpp_is_used_offline(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout llama.cpp and huggingface_hub share: refs/main, blobs, relative snapshot links."""
    commit = "c" * 40
    root = hub_cache_dir() / "models--someone--tiny"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    shutil.copy(files["demo"], root / "blobs" / ("b" * 64))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    os.symlink(os.path.join("..", "..", "blobs", "b" * 64), snap / "tiny-Q8_0.gguf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    doc = plan_json("someone/tiny", "--cpu-only")
    assert doc["model"]["path"] == str(snap / "tiny-Q8_0.gguf") and doc["downloads"] == []


def test_revisions(hub: FakeHub) -> None:
    commit = hub.repos["acme/qwen3-0.6b"].commit
    doc = plan_json("acme/qwen3-0.6b:Q8_0", "--revision", commit, "--cpu-only")
    assert f"/snapshots/{commit}/" in doc["model"]["path"]
    r = CliRunner().invoke(app, ["plan", "acme/qwen3-0.6b", "--revision", "nope"])
    assert r.exit_code == 4 and "no such revision" in r.output
    r = CliRunner().invoke(app, ["plan", str(hub.repos["acme/demo"].files["demo-Q8_0.gguf"]), "--revision", "x"])
    assert r.exit_code == 2


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("stall_tree", "got no answer within 3 s"),
        ("html", "did not answer listing the repo for acme/qwen3-0.6b like the Hub"),
    ],
)
def test_a_hub_that_stalls_or_answers_html(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch, fault: str, said: str
) -> None:
    monkeypatch.setenv("LLAMAFIT_HUB_TIMEOUT", "1")
    hub.fault = fault
    try:
        t = time.monotonic()
        r = CliRunner().invoke(app, ["plan", "acme/qwen3-0.6b", "--gpu", "8GiB"])
        elapsed = time.monotonic() - t
    finally:
        hub.fault = None
    assert r.exit_code == ExitCode.NETWORK, r.output
    assert said in r.stderr and hub.url in r.stderr and "--offline" in r.stderr
    assert "internal error" not in r.stderr and elapsed < 15


def test_an_unreachable_hub_names_its_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    r = CliRunner().invoke(app, ["plan", "acme/qwen3-0.6b", "--gpu", "8GiB"])
    assert r.exit_code == ExitCode.NETWORK, r.output
    assert dead in r.stderr and "--offline" in r.stderr


def test_a_download_killed_midway_is_cleaned_and_never_used(hub: FakeHub, tmp_path: Path) -> None:
    """huggingface_hub writes each download to a file of its own and cannot resume another process's:
    what a SIGKILLed download left is removed before the next one, and the partial file is never a model."""
    import os
    import signal as sig
    import subprocess
    import sys

    big = tmp_path / "big-Q8_0.gguf"
    big.write_bytes(os.urandom(1 << 20) * 48)
    hub.add("acme/big", {"big-Q8_0.gguf": big})
    code = (
        "from llamafit.hub.remote import HubClient\nfrom llamafit.hub.cache import hub_cache_dir\n"
        "c = HubClient()\nl = c.listing('acme/big')\n"
        "print(c.download('acme/big', l.commit, l.files[0], hub_cache_dir()))\n"
    )
    blobs = hub_cache_dir() / "models--acme--big" / "blobs"
    hub.delay_per_mib = 0.05  # a slow link, so the download is really cut midway
    try:
        p = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
        deadline = time.monotonic() + 60
        while (sum(f.stat().st_size for f in blobs.glob("*.incomplete")) if blobs.is_dir() else 0) < (8 << 20):
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        p.send_signal(sig.SIGKILL)
        p.wait()
    finally:
        hub.delay_per_mib = 0.0
    assert list(blobs.glob("*.incomplete"))  # what the killed download left
    # a partial file never becomes the snapshot's file, so nothing treats it as the model
    assert not list((hub_cache_dir() / "models--acme--big").glob("snapshots/*/big-Q8_0.gguf"))
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == big.read_bytes()
    assert not list(blobs.glob("*.incomplete"))


@pytest.mark.parametrize(
    "label",
    ["byte-level BPE, more merges than tokens (Llama 3)", "byte-level BPE, 47 layers of MoE tensors (GLM-4.5-Air)",
     "SentencePiece, 262k tokens (Gemma 3)", "byte-level BPE, a fifth as many merges as tokens"],
)  # fmt: skip
def test_a_header_is_read_in_a_few_requests_and_not_far_past_its_end(hub: FakeHub, tmp_path: Path, label: str) -> None:
    """Every byte before the tensor data is the floor; the reader asks for what the rest of the header likely
    needs (the vocabulary's count, the arrays beside it, the tensor table's count), never past 1.10 times the
    least it can still be."""
    from llamafit.gguf.reader import read_file_header

    shape = {
        "byte-level BPE, more merges than tokens (Llama 3)":
            factory.with_vocab(factory.llama31_8b(), factory.bpe_vocab(128256, 280147)),
        "byte-level BPE, 47 layers of MoE tensors (GLM-4.5-Air)":
            factory.with_vocab(factory.glm45_air(), factory.bpe_vocab(151552, 151552 - 256, seed=1)),
        "SentencePiece, 262k tokens (Gemma 3)": factory.gemma3(n_vocab=262144),
        # what the likely size alone read in two requests, 1.22 times the header (the 1.43x)
        "byte-level BPE, a fifth as many merges as tokens":
            factory.with_vocab(factory.llama31_8b(), factory.bpe_vocab(100352, 20000)),
    }[label]  # fmt: skip
    path = shape.write(tmp_path / "model-Q4_K_M.gguf")
    floor = read_file_header(path).data_offset
    repo = "acme/header-" + str(abs(hash(label)) % 10**6)
    hub.add(repo, {path.name: path})
    plan_json(repo, "--gpu", "200GiB")
    reads = [r for r in hub.file_requests() if r.method == "GET"]
    sent = hub.bytes_sent("/resolve/")
    assert len(reads) <= 6, [r.range for r in reads]
    assert floor <= sent <= 1.10 * floor, (sent, floor)
