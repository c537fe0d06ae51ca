"""Imports run one way: the layer table of docs/architecture.md, checked against the whole tree.

Every import of every module of the product's packages counts, lazy ones inside functions
and type-only ones too. A module may import only from the layers its row allows, and no
module reaches itself through imports (no cycle). Every module also imports cleanly.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("base", "voxloop", "realtime", "pipeline", "asr", "llm", "tts_engine")
#: Modules that need an optional heavy package to import: (module prefix, package).
OPTIONAL = (("tts_engine.torch_vits", "torch"),)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def layer_table() -> dict[str, tuple[list[str], set[str]]]:
    """``{layer: (module prefixes, layers it may import)}`` from docs/architecture.md's table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layers") :]
    layers: dict[str, tuple[list[str], set[str]]] = {}
    for line in section.splitlines()[section.splitlines().index("| layer | modules | may import |") + 2 :]:
        if not line.startswith("|"):
            break
        name, modules, allowed = (cell.strip() for cell in line.strip("|").split("|"))
        layers[name] = (re.findall(r"`([\w.]+)`", modules), {a.strip() for a in allowed.split(",")})
    return layers


LAYERS = layer_table()


def folder_table() -> dict[str, set[str]]:
    """``{folder: folders it may import}`` from docs/architecture.md's folder table; a folder is its path
    (``base``, ``tts_engine/torch_vits/kernels``: a nested folder is a row of its own)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    lines = text[text.index("| folder | holds | may import folders |") :].splitlines()[2:]
    folders: dict[str, set[str]] = {}
    for line in lines:
        if not line.startswith("|"):
            break
        names, _, allowed = (cell.strip() for cell in line.strip("|").split("|"))
        for name in re.findall(r"`([\w/]+)/`", names):
            folders[name] = set(re.findall(r"`([\w/]+)/`", allowed))
    return folders


FOLDERS = folder_table()


def folder_of(module: str, folders: dict[str, set[str]] = FOLDERS) -> str:
    """The most specific folder of the table that holds ``module`` (its top-level folder at least)."""
    path = module.replace(".", "/")
    return max((f for f in folders if path == f or path.startswith(f + "/")), key=len, default=path.split("/")[0])


def layer_of(module: str) -> str:
    """The layer whose module list matches ``module`` most specifically."""
    best, best_len = None, -1
    for name, (prefixes, _) in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    assert best is not None, f"{module} is in no layer of docs/architecture.md"
    return best


def imports_of(module: str, path: Path) -> dict[str, int]:
    """Product modules ``module`` imports (``from pkg import mod`` counts as ``pkg.mod``): {name: line}."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            # `from pkg import submodule` is an import of the submodule, not of pkg's own code
            names = submodules + ([base] if len(submodules) < len(node.names) else [])
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import a.b.c` of a non-module attribute: its module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.setdefault(name, node.lineno)
    return found


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def test_the_table_names_every_package():
    assert set(LAYERS) == {"base", "engines", "protocol core", "pipeline", "clients", "CLI"}
    for name, (_, allowed) in LAYERS.items():
        assert name in allowed and allowed <= set(LAYERS), f"row {name}: unknown layer in {allowed}"
    for module in MODULES:
        layer_of(module)


def wrong_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """``module:line (layer) imports target (layer)`` for every import its layer's row does not allow."""
    wrong = []
    for module, targets in graph.items():
        allowed = LAYERS[layer_of(module)][1]
        for target, line in targets.items():
            if layer_of(target) not in allowed:
                wrong.append(f"{module}:{line} ({layer_of(module)}) imports {target} ({layer_of(target)})")
    return wrong


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_goes_up_or_sideways():
    wrong = wrong_imports(GRAPH)
    assert not wrong, "\n".join(wrong)


def wrong_folder_imports(graph: dict[str, dict[str, int]], folders: dict[str, set[str]] = FOLDERS) -> list[str]:
    """``module:line imports target`` for every import of another folder of the table that the module's
    folder's row does not name (a nested folder is apart from the folder around it, both ways)."""
    wrong = []
    for module, targets in graph.items():
        folder = folder_of(module, folders)
        for target, line in targets.items():
            other = folder_of(target, folders)
            if other != folder and other not in folders[folder]:
                wrong.append(f"{module}:{line} ({folder}/) imports {target} ({other}/)")
    return wrong


def test_the_folder_table_names_every_folder_in_order():
    assert {f.split("/")[0] for f in FOLDERS} == set(PACKAGES)
    assert all((ROOT / f).is_dir() for f in FOLDERS)
    # An order exists: each folder may import only folders listed before it (no two import each other).
    placed: list[str] = []
    while len(placed) < len(FOLDERS):
        ready = [f for f in FOLDERS if f not in placed and FOLDERS[f] <= set(placed)]
        assert ready, f"the folder table has a loop among {set(FOLDERS) - set(placed)}"
        placed += ready


def test_no_folder_imports_a_folder_above_it():
    wrong = wrong_folder_imports(GRAPH)
    assert not wrong, "\n".join(wrong)


def test_the_kernels_folder_imports_nothing_of_the_engine_around_it():
    """The Triton kernels (``tts_engine/torch_vits/kernels/``) have a row of their own: they import only
    the base, never the model, runner or scheduler beside them; the engine imports them."""
    kernels = "tts_engine/torch_vits/kernels"
    assert FOLDERS[kernels] <= {"base"}
    assert kernels in FOLDERS["tts_engine"]
    modules = [m for m in MODULES if folder_of(m) == kernels]
    assert {m.rsplit(".", 1)[-1] for m in modules} >= {"fused_resblock", "fused_resblock_ref", "gemm_conv"}
    graph = {"tts_engine.torch_vits.kernels.fused_prior": {"tts_engine.torch_vits.model": 27},
             "tts_engine.torch_vits.runner": {"tts_engine.torch_vits.kernels.fused_prior": 5}}
    assert wrong_folder_imports(graph) == ["tts_engine.torch_vits.kernels.fused_prior:27 (tts_engine/torch_vits/kernels/) "
                                           "imports tts_engine.torch_vits.model (tts_engine/)"]


def test_the_folder_check_catches_an_upward_import():
    graph = {"base.config": {"tts_engine.voice": 12}, "realtime.items": {"llm.replies": 3},
             "pipeline.hub": {"realtime.protocol": 9}, "voxloop.cli": {"pipeline.hub": 4}}
    assert wrong_folder_imports(graph) == ["base.config:12 (base/) imports tts_engine.voice (tts_engine/)",
                                           "realtime.items:3 (realtime/) imports llm.replies (llm/)"]


def test_no_import_cycle():
    assert not import_cycles(GRAPH)


def test_the_checks_catch_what_the_issue_found():
    """The two upward imports, the client -> server import and the protocol -> engine type one."""
    graph = {
        "base.models": {"tts_engine.onnx_streaming": 277},
        "voxloop.client": {"pipeline.protocol": 39},
        "realtime.client_events": {"tts_engine.engine": 27},
        "tts_engine.frontend": {"tts_engine.zh": 84},
        "tts_engine.zh": {"tts_engine.frontend": 21},
    }
    assert [w.split(" imports ")[0] for w in wrong_imports(graph)] == [
        "base.models:277 (base)", "voxloop.client:39 (clients)", "realtime.client_events:27 (protocol core)"]
    assert import_cycles(graph) == [["tts_engine.frontend", "tts_engine.zh"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module):
    for prefix, package in OPTIONAL:
        if module.startswith(prefix):
            pytest.importorskip(package)
    if module.endswith("__main__"):  # runs the program when imported
        compile(MODULES[module].read_text(), str(MODULES[module]), "exec")
        return
    importlib.import_module(module)


def private_names() -> set[str]:
    """Every private name the product's packages define: functions, classes, module names and
    attributes (``self._x = ...``), dunders aside."""
    names = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def bench_misuses(sources: dict[str, str], private: set[str]) -> list[str]:
    """``file:line what`` for each import from ``tests`` and each read of a private name of the product
    (``obj._x`` on anything but the bench's own ``self``/``cls``; ``from product import _x``)."""
    found = []
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source, name)):
            if isinstance(node, ast.Import):
                found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name.split(".")[0] == "tests"]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] == "tests":
                    found.append(f"{name}:{node.lineno} imports from {node.module}")
                elif node.module.split(".")[0] in PACKAGES:
                    found += [f"{name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names if a.name in private]
            elif isinstance(node, ast.Attribute) and node.attr in private and \
                    not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):  # fmt: skip
                found.append(f"{name}:{node.lineno} reads {ast.unparse(node)}")
    return found


def test_bench_uses_the_products_public_interfaces_only():
    """bench/ measures the product as a user of it: no import from tests/, no private attribute."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "bench").rglob("*.py"))}
    misuses = bench_misuses(sources, private_names())
    assert not misuses, "\n".join(misuses)


def test_the_bench_check_catches_a_private_read_and_a_test_import():
    private = private_names()
    assert {"_decode_steps", "_ll", "_model", "_ws"} <= private
    planted = {"bench/x.py": "from tests.client_fakes import FakeServer\nimport tests.rt\n"
                             "from realtime.protocol import _header_fields\n"
                             "def f(runner, self):\n    self._ll = runner._decode_steps\n    return self._ll\n"}
    assert bench_misuses(planted, private) == [
        "bench/x.py:1 imports from tests.client_fakes", "bench/x.py:2 imports tests.rt",
        "bench/x.py:3 imports realtime.protocol._header_fields", "bench/x.py:5 reads runner._decode_steps"]
