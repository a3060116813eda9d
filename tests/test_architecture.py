"""The shape of the house (docs/architecture.md): no import cycle, the core never imports the CLI, no
module reaches for another's private names, no hand-written module grows past 500 lines, no function takes more
than eight parameters or has a body over 100 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "llamafit"
GENERATED = {"llamafit.server.option_table"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports(name: str) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in ``name``, lazy ones included."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("llamafit")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            if not base.startswith("llamafit"):
                continue
            names = [a.name for a in node.names]
            subs = [n for n in names if f"{base}.{n}" in MODULES]
            if subs:
                out += [(f"{base}.{n}", []) for n in subs]
            rest = [n for n in names if n not in subs]
            if rest:
                out.append((base, rest))
    return out


def graph() -> dict[str, set[str]]:
    return {m: {t for t, _ in imports(m) if t in MODULES and t != m} for m in MODULES}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for t in sorted(g[n]):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (c := visit(t)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()) or [])


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between top-level packages (``llamafit.X``; a top-level module is its own)."""

    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, ts in g.items():
        out.setdefault(top(m), set()).update(top(t) for t in ts if top(t) != top(m))
    return out


def test_the_packages_import_each_other_in_one_direction() -> None:
    """Two packages on one floor that import each other (devices and speed did) are a cycle the module graph
    cannot see: each module's imports go one way, the packages' both."""
    assert find_cycle(package_graph(graph())) is None, " -> ".join(find_cycle(package_graph(graph())) or [])


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    modules = {"llamafit.a.x": {"llamafit.b.y"}, "llamafit.b.y": set(), "llamafit.b.z": {"llamafit.a.w"}}
    assert find_cycle(package_graph(modules)) == ["llamafit.a", "llamafit.b", "llamafit.a"]


def test_the_core_never_imports_the_cli() -> None:
    core = {m: ts for m, ts in graph().items() if not m.startswith("llamafit.cli") and m != "llamafit.__main__"}
    bad = [(m, t) for m, ts in core.items() for t in ts
           if t.startswith("llamafit.cli")]  # fmt: skip
    assert not bad


def test_only_the_cli_imports_typer_and_rich() -> None:
    bad = []
    for m, path in MODULES.items():
        if m.startswith("llamafit.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            bad += [(m, n) for n in names if n.split(".")[0] in ("typer", "rich", "click")]
    assert not bad


def test_no_private_names_across_modules() -> None:
    bad = [(m, t, n) for m in MODULES for t, names in imports(m) for n in names
           if n.startswith("_") and not n.startswith("__")]  # fmt: skip
    assert not bad


def test_no_hand_written_module_is_over_500_lines() -> None:
    long = {m: n for m, p in MODULES.items() if m not in GENERATED and (n := len(p.read_text().splitlines())) > 500}
    assert not long


def test_the_line_cap_is_met_as_formatted() -> None:
    """No formatter opt-outs in the package: a module is under the cap as ruff formats it, not by keeping
    lines together by hand."""
    marked = [m for m, p in MODULES.items() if "fmt: " + "skip" in p.read_text() or "fmt: " + "off" in p.read_text()]
    assert not marked


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    return [
        (m, n)
        for m, p in MODULES.items()
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _typer_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A command whose parameters are its options (Typer reads the signature); its body is held like any other."""
    notes = [ast.unparse(a.annotation) for a in fn.args.args if a.annotation is not None]
    return fn.name.endswith("_command") and any("Annotated" in t or t.endswith("Opt") for t in notes)


def test_no_function_takes_more_than_eight_parameters() -> None:
    """What travels together is one value (``Inputs``, ``Load``, ``Pricing``, ``RunOptions``...), not a list of
    parameters; a Typer command's options are its signature, so only its body is held (next test)."""
    many = [
        (m, fn.name, n)
        for m, fn in _functions()
        if not _typer_command(fn)
        and (n := len([a for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs) if a.arg != "self"])) > 8
    ]
    assert not many


def test_no_function_body_is_over_100_lines() -> None:
    long = [(m, fn.name, n) for m, fn in _functions() if (n := (fn.end_lineno or 0) - fn.body[0].lineno + 1) > 100]
    assert not long


# The floors of docs/architecture.md, top first: a module imports its own floor and the ones below, never
# one above.
FLOORS = [
    {"cli", "__main__"},
    {"several", "tune"},
    {"serving"},
    {"planning"},
    {"fit"},
    {"hub"},
    {"speculative"},
    {"speed"},
    {"devices"},
    {"memory", "memory.graph"},
    {"server"},
    {"gguf", "options", "paths", "shellwords", "units", "errors", "numbers", "store", "llamafit"},
]


def floor_of(module: str) -> int:
    parts = module.split(".")
    name = "memory.graph" if parts[1:3] == ["memory", "graph"] else (parts[1] if len(parts) > 1 else parts[0])
    return next(i for i, f in enumerate(FLOORS) if name in f)


def test_nothing_imports_a_floor_above_its_own() -> None:
    bad = [(m, t) for m, ts in graph().items() for t in ts if floor_of(t) < floor_of(m)]
    assert not bad, bad


def test_every_module_has_a_floor() -> None:
    for m in MODULES:
        assert floor_of(m) >= 0  # a new package gets a floor in FLOORS and in docs/architecture.md


def _named_modules(doc: str) -> list[str]:
    """The modules a package docstring names in its ``Modules:`` list (``* ``name``: what it is for``)."""
    _, found, rest = doc.partition("\nModules:\n")
    assert found, "no 'Modules:' list"
    return re.findall(r"^\* ``(\w+)``: \S", rest, re.M)


def test_every_package_names_its_modules() -> None:
    """Each package's docstring says in a line what each of its modules (and subpackages) is for: a module left
    out, or one named that does not exist, fails here."""
    for init in sorted(PKG.rglob("__init__.py")):
        d = init.parent
        have = {p.stem for p in d.glob("*.py") if not p.stem.startswith("__")}
        have |= {p.name for p in d.iterdir() if (p / "__init__.py").exists()}
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        named = _named_modules(doc) if doc else []
        where = init.relative_to(ROOT)
        assert len(named) == len(set(named)), f"{where}: a module named twice"
        assert not have - set(named), f"{where}: modules not named: {sorted(have - set(named))}"
        assert not set(named) - have, f"{where}: named but missing: {sorted(set(named) - have)}"
