"""The option table is llama.cpp's: the committed ``server_options.py`` equals a fresh generation from the
llama.cpp tree the server is built from. CI unpacks that tree and names it in ``LLAMA_CPP_SRC``."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from llamafit.server import option_table as server_options
from tests.realserver import llama_cpp_tree as tree

ROOT = Path(__file__).resolve().parent.parent
GEN: dict[str, Any] = runpy.run_path(str(ROOT / "tools" / "gen_server_options.py"))


def table(text: str) -> Any:
    ns: dict[str, Any] = {}
    exec(compile(text, "server_options.py", "exec"), ns)
    return ns["ROWS"]


def test_the_committed_table_matches_a_fresh_generation() -> None:
    fresh = table(GEN["generate"](tree()))
    assert len(fresh) > 200
    assert fresh == server_options.ROWS, (
        "regenerate: python tools/gen_server_options.py $LLAMA_CPP_SRC -o llamafit/server/option_table.py"
    )


def test_the_generator_reads_what_arg_cpp_declares(tmp_path: Path) -> None:
    common = tmp_path / "common"
    common.mkdir()
    (common / "arg.cpp").write_text(
        'add_opt(common_arg({"-c", "--ctx-size"}, "N", "size", [](common_params & params, int value) {'
        ' params.n_ctx = value; }).set_env("LLAMA_ARG_CTX_SIZE"));\n'
        'add_opt(common_arg({"-ot", "--override-tensor"}, "P", "o", [](common_params & params, const std::string & v) {'
        " }).set_examples({LLAMA_EXAMPLE_SERVER}));\n"
        # a markdown link in the help is not the handler's signature
        'add_opt(common_arg({"-cram", "--cache-ram"}, "N", string_format("size (default: %d)"'
        ' "[(more info)](https://github.com/ggml-org/llama.cpp/pull/16391)", 1),'
        " [](common_params & params, int value) { params.cache_ram_mib = value; }));\n"
    )
    rows = table(GEN["generate"](tmp_path))
    assert rows == (
        ("--ctx-size", ("-c", "--ctx-size"), (), 1, False, "LLAMA_ARG_CTX_SIZE", ("common",), ()),
        ("--override-tensor", ("-ot", "--override-tensor"), (), 1, True, None, ("server",), ()),
        ("--cache-ram", ("-cram", "--cache-ram"), (), 1, False, None, ("common",), ()),
    )


def test_the_committed_architectures_match_a_fresh_generation() -> None:
    from llamafit.gguf.archs import ARCHS

    gen: dict[str, Any] = runpy.run_path(str(ROOT / "tools" / "gen_archs.py"))
    fresh = table_of(gen["generate"](tree()), "ARCHS")
    assert "llama" in fresh and "clip" not in fresh
    assert fresh == ARCHS, "regenerate: python tools/gen_archs.py $LLAMA_CPP_SRC -o llamafit/gguf/archs.py"


def table_of(text: str, name: str) -> Any:
    ns: dict[str, Any] = {}
    exec(compile(text, "generated.py", "exec"), ns)
    return ns[name]
