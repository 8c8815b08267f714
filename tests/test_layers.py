"""DESIGN.md's rule, enforced: imports go down the layers only (function-level imports count), and no two modules
import each other."""
import ast
from pathlib import Path

ROOT = Path(__file__).parents[1] / "src" / "lightfed"
LAYER = {"config": 0, "wire": 0, "assets": 0, "measure": 0, "seeds": 0, "device": 0, "provenance": 0,   # bottom
         "models": 1, "data": 1, "optim": 1,
         "methods": 2, "tasks": 2,
         "privacy": 3, "secagg": 3,
         "engine": 4,
         "cli": 5, "report": 5, "export": 5, "trained": 5, "devicecheck": 5}


def _imports():
    """{module: set of lightfed modules it imports} (`from pkg import sub` imports the submodule, not the package)"""
    files = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in ROOT.rglob("*.py")}
    out = {}
    for mod, p in files.items():
        got = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lightfed":
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(files)
                got |= subs or {node.module}
            elif isinstance(node, ast.Import):
                got |= {a.name for a in node.names if a.name.split(".")[0] == "lightfed"}
        out[mod] = got
    return out


def _layer(mod):
    parts = mod.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def test_imports_go_down_the_layers_only():
    bad = [(m, t) for m, ts in _imports().items() for t in ts
           if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m)]
    assert not bad, f"imports that go up a layer: {bad}"
    assert set(LAYER) >= {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
                          if p.name not in ("__init__.py", "__pycache__")}, "a new top-level module needs a layer"


def test_no_two_modules_import_each_other():
    imp = _imports()
    pairs = {tuple(sorted((a, b))) for a, ts in imp.items() for b in ts if a in imp.get(b, set()) and a != b}
    assert not pairs, f"modules that import each other: {sorted(pairs)}"
