"""The layers of docs/architecture.md: no import circle inside `provisioner` (imports inside
functions count too), and `simcore` imports nothing from `provisioner`."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that the file imports anywhere (first component after it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            parts = name.split(".")
            if parts[0] == package:
                found.add(parts[1] if len(parts) > 1 else "")
    return found


def test_no_import_circle_in_provisioner():
    modules = {p.stem: p for p in (ROOT / "provisioner").glob("*.py")}
    graph = {name: _imports(path, "provisioner") & set(modules) for name, path in modules.items()}

    def reaches(start: str, goal: str) -> list[str] | None:
        seen, paths = set(), [[start]]
        while paths:
            path = paths.pop()
            for nxt in sorted(graph[path[-1]]):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append([*path, nxt])
        return None

    circles = [reaches(name, name) for name in sorted(graph)]
    assert not [c for c in circles if c], " -> ".join(next(c for c in circles if c))


def test_simcore_imports_nothing_from_provisioner():
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "simcore").rglob("*.py")
             if _imports(p, "provisioner")]
    assert users == []
