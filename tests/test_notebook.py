"""Issue 27: the "Python API" examples (docs/api.md; the README's until issue 40), run as a notebook in a Jupyter kernel
(nbclient) whose working directory is a temporary one outside the checkout, so `provisioner`
comes from the installed package: no cell fails, a displayed SearchResult has its HTML view
(`_repr_html_`), the displayed DataFrame has its HTML table and is the table the page prints,
and the reprs of the API's results are short (they ran to 54-176 KB)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
CHECKOUT = PAGE.parents[1]
KERNEL = "python3"
REPR_LIMIT = 2048   # bytes of repr() for any object of the provisioner package
MARK = "PROBE "
# after each cell of the page: the repr sizes of the provisioner objects in the namespace, and the
# displayed DataFrame (`_`, IPython's last result) as text
PROBE = f'''import json as _json, os as _os, sys as _sys
import pandas as _pd
print({MARK!r} + _json.dumps({{
    "reprs": {{f"{{_n}}: {{type(_v).__name__}}": len(repr(_v))
              for _n, _v in list(globals().items())
              if not _n.startswith("_") and type(_v).__module__.split(".")[0] == "provisioner"}},
    "frame": _.to_string() if isinstance(globals().get("_"), _pd.DataFrame) else None,
    "cwd": _os.getcwd(), "path": _sys.path,
    "module": getattr(_sys.modules.get("provisioner"), "__file__", None)}}))
'''


def readme_examples() -> list[tuple[str, str | None]]:
    """(code, the page's output of it or None) for each Python block of docs/api.md."""
    section = PAGE.read_text()
    examples: list[tuple[str, str | None]] = []
    for kind, body in re.findall(r"```(python|text)\n(.*?)```", section, re.S):
        if kind == "python":
            examples.append((body, None))
        elif examples and examples[-1][1] is None:
            examples[-1] = (examples[-1][0], body)
    return examples


def _kernel_or_skip() -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        pytest.skip(f"no '{KERNEL}' Jupyter kernel installed")


def _probe(cell) -> dict:
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    line = next(line for line in text.splitlines() if line.startswith(MARK))
    return json.loads(line[len(MARK):])


def _results(cell) -> list[dict]:
    return [o.data for o in cell.outputs if o.output_type == "execute_result"]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def test_the_readme_python_examples_run_in_a_notebook_outside_the_checkout(tmp_path):
    _kernel_or_skip()
    examples = readme_examples()
    assert len(examples) >= 3, "docs/api.md lost its examples"
    cells = []
    for code, _ in examples:
        cells += [nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell(PROBE)]
    notebook = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": KERNEL, "display_name": "Python 3", "language": "python"}})
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"a docs/api.md example failed in the notebook:\n{error}")
    errors = [o for cell in notebook.cells for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors

    probes = [_probe(cell) for cell in notebook.cells[1::2]]
    where = probes[-1]
    assert Path(where["cwd"]).resolve() == tmp_path.resolve()
    path = [Path(where["cwd"], p).resolve() for p in where["path"]]   # "" is the kernel's cwd
    assert CHECKOUT not in path, "the kernel imported the source tree, not the install"
    assert where["module"] and not Path(where["module"]).resolve().is_relative_to(tmp_path)

    shown_result = shown_frame = False
    for (code, output), cell, probe in zip(examples, notebook.cells[0::2], probes):
        for data in _results(cell):
            plain = data.get("text/plain", "")
            if plain.startswith("SearchResult("):   # a result displayed: its answer and table
                shown_result = True
                assert "\n" not in plain and len(plain) < REPR_LIMIT, plain
                assert "<table" in data.get("text/html", ""), "no _repr_html_ view"
            if 'class="dataframe"' in data.get("text/html", ""):
                shown_frame = True
                assert output is not None, f"docs/api.md shows no output of:\n{code}"
                assert _lines(output) == _lines(probe["frame"]), (
                    "docs/api.md's table is stale; the notebook shows:\n" + probe["frame"])
    assert shown_result and shown_frame, "docs/api.md's notebook cells no longer display a " \
        "SearchResult and a DataFrame"

    sizes = {name: size for probe in probes for name, size in probe["reprs"].items()}
    kinds = {name.split(": ")[1] for name in sizes}
    assert {"SearchResult", "DesignResult", "SimulationRun"} <= kinds, sizes
    assert all(size < REPR_LIMIT for size in sizes.values()), sizes
