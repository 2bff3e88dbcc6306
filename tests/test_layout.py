"""The repository's layout: what the installed package ships and how its modules import each other."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(roots: list[tuple[Path, str]]) -> dict[str, set[str]]:
    """Module -> the modules of ``roots`` it imports (anywhere in the file, type-checking and
    function-level imports included: a circle through those is still a circle to a reader)."""
    modules = {}
    for root, package in roots:
        for path in (root / package).rglob("*.py"):
            modules[_module_name(path, root)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package_parts[: len(package_parts) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                submodules = [f"{target}.{alias.name}" for alias in node.names]
                # ``from package import module`` imports the module, not the package's face.
                named = [m for m in submodules if m in modules]
                targets = named if len(named) == len(submodules) else [target, *submodules]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_import_graph_has_no_circle():
    edges = import_graph([(ROOT / "src", "ksemstamp"), (ROOT, "lab"), (ROOT, "benchmarks")])
    assert "lab.check" in edges and "ksemstamp.detector" in edges
    assert circles(edges) == []


def test_circle_finder_finds_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]


LAB_MAY_IMPORT = {"ksemstamp", "ksemstamp.experimental"}
"""What the lab imports of the package: its public API and the one module of internals."""


def test_every_public_name_and_experimental_name_resolves():
    """``from ksemstamp import X`` for each name ``__all__`` promises (they load lazily, so a
    moved module shows only when the name is asked for), and the lab's ``experimental``."""
    import ksemstamp
    import ksemstamp.experimental as experimental

    for name in ksemstamp.__all__:
        assert getattr(ksemstamp, name) is not None, name
    for name in experimental.__all__:
        assert getattr(experimental, name) is not None, name


def test_the_lab_imports_only_the_public_api_and_experimental():
    edges = import_graph([(ROOT / "src", "ksemstamp"), (ROOT, "lab")])
    lab = {name: targets for name, targets in edges.items() if name.startswith("lab")}
    assert "lab.check" in lab
    for name, targets in lab.items():
        inside = {t for t in targets if t.startswith("ksemstamp")}
        assert inside <= LAB_MAY_IMPORT, (name, inside - LAB_MAY_IMPORT)


def test_the_product_never_imports_the_lab():
    roots = [(ROOT / "src", "ksemstamp"), (ROOT, "lab"), (ROOT, "tests"), (ROOT, "benchmarks")]
    edges = import_graph(roots)
    for name, targets in edges.items():
        if name.startswith(("ksemstamp", "tests", "benchmarks")):
            assert not any(t.startswith("lab") for t in targets), name


def test_installed_package_ships_no_lab_code():
    """What ``pip install`` builds: the packages setuptools finds from pyproject.toml's
    ``packages.find``, expanded as a build expands it."""
    packages = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"]
    assert "ksemstamp" in packages and "ksemstamp.calibration" in packages
    assert not any(p.startswith(("lab", "research", "benchmarks")) for p in packages), packages


def test_lab_commands_run_from_the_repository_root():
    out = subprocess.run(
        [sys.executable, "-m", "lab", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("check", "compare", "curve"):
        assert command in out


RULE = re.compile(
    r"^May import: ksemstamp core modules(?: and (?P<allowed>[\w, ]+?))?;"
    r"(?: names by path: (?P<named>[\w, ]+?);)? never (?P<never>.+)\.$"
)


def _names(listed: str | None) -> set[str]:
    return {n.strip() for n in re.split(r",| or ", listed or "") if n.strip()}


def import_rules(package: Path) -> dict[str, tuple[set[str], set[str], set[str]]]:
    """Subpackage -> (the subpackages it may import, the modules it never imports, the
    subpackages whose objects it may name by path), from the second line of its ``__init__``
    docstring: ``May import: ksemstamp core modules[ and a, b];[ names by path: c, d;] never x,
    y or z.`` Any subpackage not named there is forbidden too."""
    rules = {}
    for init in sorted(package.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()), clean=False) or ""
        lines = doc.splitlines()
        match = RULE.match(lines[1]) if len(lines) > 1 else None
        assert match, f"{init}: the docstring's second line must be the import rule, got {lines}"
        rules[init.parent.name] = (
            _names(match["allowed"]),
            _names(match["never"]),
            _names(match["named"]),
        )
    return rules


PATH_NAME = re.compile(r"^(ksemstamp(?:\.\w+)+):(\w+)$")
"""An object named by path (``"ksemstamp.generation.batched:BatchedEngine"``): how a registry
names a class it must not import (it lies in a layer above the registry, or needs a package
that is not installed everywhere)."""


def named_by_path(package: Path) -> dict[str, set[str]]:
    """Module -> the ``"module:object"`` paths its string constants name."""
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        name = _module_name(path, package.parent)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and PATH_NAME.match(str(node.value)):
                found.setdefault(name, set()).add(node.value)
    return found


def test_every_subpackage_declares_what_it_may_import():
    package = ROOT / "src" / "ksemstamp"
    rules = import_rules(package)
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    assert set(rules) == subpackages and {"marks", "serve", "training"} <= subpackages
    for allowed, never, by_path in rules.values():
        named = allowed | never | by_path
        # Every name in a rule is a module or subpackage that exists.
        assert all((package / f"{n}.py").exists() or n in subpackages for n in named), named


def test_subpackages_keep_to_their_import_rules():
    package = ROOT / "src" / "ksemstamp"
    edges = import_graph([(ROOT / "src", "ksemstamp")])
    rules = import_rules(package)
    broken = []
    for name, targets in edges.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in rules:
            continue
        own = parts[1]
        allowed, never, _ = rules[own]
        for target in targets:
            top = target.split(".")[1] if target.count(".") else ""
            if not top or top == own:
                continue
            is_subpackage = top in rules
            if top in never or (is_subpackage and top not in allowed):
                broken.append(f"{name} imports {target}")
    assert broken == []


def test_objects_named_by_path_exist_and_keep_to_the_rules():
    """A registry's ``"module:object"`` strings are dependencies an import graph does not see:
    each names an object that exists, in a subpackage its own package's rule lists under
    ``names by path`` (the package's top-level modules may name any)."""
    import importlib

    package = ROOT / "src" / "ksemstamp"
    rules = import_rules(package)
    found = named_by_path(package)
    assert "ksemstamp.generation.batched:BatchedEngine" in found["ksemstamp.settings.groups"]
    broken = []
    for name, paths in sorted(found.items()):
        own = name.split(".")[1] if name.count(".") > 1 else ""
        for path in sorted(paths):
            module, _, attribute = path.partition(":")
            if not hasattr(importlib.import_module(module), attribute):
                broken.append(f"{name} names {path}, which does not exist")
            top = module.split(".")[1]
            if own in rules and top != own and top not in rules[own][2]:
                broken.append(f"{name} names {path}: not in {own}'s rule")
    assert broken == []


def test_the_rule_check_catches_a_broken_rule(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "__init__.py").write_text('"""A part.\nMay import: nothing at all.\n"""\n')
    with pytest.raises(AssertionError, match="import rule"):
        import_rules(package)
    (package / "sub" / "__init__.py").write_text(
        '"""A part.\nMay import: ksemstamp core modules and other; never cli or config.\n"""\n'
    )
    assert import_rules(package) == {"sub": ({"other"}, {"cli", "config"}, set())}
    (package / "sub" / "__init__.py").write_text(
        '"""A part.\nMay import: ksemstamp core modules; names by path: up, top; never cli.\n"""\n'
    )
    assert import_rules(package) == {"sub": (set(), {"cli"}, {"up", "top"})}
    (package / "sub" / "reg.py").write_text('WHERE = {"x": "ksemstamp.up.mod:Thing"}\n')
    assert named_by_path(package) == {"pkg.sub.reg": {"ksemstamp.up.mod:Thing"}}


def test_the_design_doc_maps_every_module():
    """docs/design.md's module map names every module at the package's top and every
    subpackage, so a reader finds each there."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## Module map") : text.index("## Settings")]
    package = ROOT / "src" / "ksemstamp"
    names = [f"`{p.name}`" for p in package.glob("*.py") if p.name != "__init__.py"]
    names += [f"`{p.parent.name}/`" for p in package.glob("*/__init__.py")]
    missing = [n for n in names if n not in table]
    assert missing == []


KIND_COMPARISON = re.compile(
    r"""(==|!=|===|!==|\bin\b)\s*["'](direction|region)["']"""
    r"""|["'](direction|region)["']\s*(==|!=|===|!==)"""
    r"""|\bmark\.kind\s*(==|!=|===|!==)|(==|!=|===|!==)\s*[\w.]*mark\.kind\b"""
    r"""|\bmark\s*(==|!=|===|!==)\s*["']"""
)
"""A comparison with a mark's kind: ``== "direction"``, ``mark.kind != ...``, ``"region" in``."""
ONLY_MARKS_KNOW_KINDS = ("marks", "settings")
"""Where a mark's kind may be compared: the marks and their settings."""


def test_no_product_file_outside_the_marks_compares_a_mark_s_kind():
    package = ROOT / "src" / "ksemstamp"
    found = []
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.js")]):
        inside = path.relative_to(package).parts
        if inside[0] in ONLY_MARKS_KNOW_KINDS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0] if path.suffix == ".py" else line.split("//", 1)[0]
            if KIND_COMPARISON.search(code):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_the_kind_finder_finds_kind_comparisons():
    for line in (
        'if mark.kind == "direction":',
        "scan = kind == 'direction' and mark.scan",
        'const direction = view.mark === "direction";',
        'keyed = "region" != settings.mark.kind',
        "if scheme.mark == 'region':",
    ):
        assert KIND_COMPARISON.search(line), line
    for line in ('"mark": described["kind"],', 'kmeans = settings.partition.kind == "kmeans"'):
        assert not KIND_COMPARISON.search(line), line


MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_TOP_LEVEL_MODULES = 400, 80, 15
"""The size the product keeps to: a module a reader holds at once, a function a screen shows."""


def sizes_over_the_limits(package: Path) -> list[str]:
    """Modules over ``MAX_MODULE_LINES`` lines and functions over ``MAX_FUNCTION_LINES`` under
    ``package``, and the top-level modules beyond ``MAX_TOP_LEVEL_MODULES``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(package.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    top = sorted(p.name for p in package.glob("*.py"))
    if len(top) > MAX_TOP_LEVEL_MODULES:
        found.append(f"{len(top)} top-level modules: {top}")
    return found


def test_modules_and_functions_stay_within_their_size():
    assert sizes_over_the_limits(ROOT / "src" / "ksemstamp") == []


def test_the_size_check_finds_a_long_module_and_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def f():\n{body}\n" + "\n" * MAX_MODULE_LINES)
    found = sizes_over_the_limits(package)
    assert any("long.py:1 f:" in f for f in found) and any(f.endswith(" lines") for f in found)
