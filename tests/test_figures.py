"""report.html's figures are plain plotly dicts, written out unvalidated: they must be exactly
what plotly's graph objects would have made of them (every property valid, already in plotly's
normal form), and their subplot grid exactly make_subplots'."""
from __future__ import annotations

import json

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from plotly.subplots import make_subplots

import provisioner
from provisioner import figures


def without_template(layout: dict) -> dict:
    return {k: v for k, v in layout.items() if k != "template"}


@pytest.mark.parametrize("rows, cols, titles, spacing", [
    (1, 1, (), {}),
    (1, 3, ("cost $/h", "power kW", "throughput req/s"), {}),
    (2, 3, ("a", "b", "c", "d", "e"), {"horizontal_spacing": 0.08, "vertical_spacing": 0.14}),
    (8, 3, tuple("abcdefghijklmnopqrstuvwx"), {"horizontal_spacing": 0.06,
                                              "vertical_spacing": 0.0625}),
    (3, 2, ("", "b", "", "d"), {}),
    (4, 1, (), {"vertical_spacing": 0.08}),
])
def test_the_subplot_grid_is_make_subplots(rows, cols, titles, spacing):
    expected = make_subplots(rows=rows, cols=cols, subplot_titles=titles or None, **spacing)
    assert figures.subplot_grid(rows, cols, titles, **spacing) == \
        without_template(expected.to_plotly_json()["layout"])


def test_the_template_is_plotlys_default():
    assert figures.plotly_template() == pio.templates[pio.templates.default].to_plotly_json()


@pytest.fixture(scope="module")
def searches():
    small = dict(model="llama2-70b", duration=10, search_limit=8, jobs=1)
    return [provisioner.search(designs="splitwise-hh,splitwise-aa,baseline-h100", rate=2,
                               **small),
            provisioner.search(designs="splitwise-hh,sarathi-h100", goal="max-rate",
                               power_budget_kw=120, **small)]


def test_every_figure_is_valid_and_already_in_plotlys_normal_form(searches):
    seen = 0
    for result in searches:
        document = result.to_dict()
        for figure in (figures.design_space_figure(result.designs, document["inputs"]),
                       figures.latency_load_figure(result.designs, document["inputs"]),
                       figures.summary_figure(result.designs)):
            if figure is None:
                continue
            seen += 1
            validated = go.Figure(figure).to_plotly_json()   # raises on an invalid property
            assert validated["data"] == figure["data"]
            assert without_template(validated["layout"]) == figure["layout"]
    assert seen == 6


def page_layouts(page: str) -> list[dict]:
    """The layout argument of every Plotly.newPlot call on the page."""
    decoder, layouts, at = json.JSONDecoder(), [], 0
    while (at := page.find("Plotly.newPlot(", at) + 1) > 0:
        rest = page[at:]
        data_at = rest.index("[")
        _, end = decoder.raw_decode(rest, data_at)
        layout_at = rest.index("{", end)
        layouts.append(decoder.raw_decode(rest, layout_at)[0])
    return layouts


def test_the_page_draws_each_figure_with_the_default_template(searches):
    result = searches[1]
    page = figures.html_report(result.to_dict(), result.designs)
    layouts = page_layouts(page)
    assert len(layouts) == 3
    assert all(layout["template"] == figures.plotly_template() for layout in layouts)
    assert "budget limit" in page   # the max-rate frontier line


def test_each_figure_is_written_as_plotly_io_writes_it(searches):
    """figure_div is pio.to_html's div, byte for byte, with plotly.js on the first only; and a
    NaN, an infinity or a '</script>' inside the figure come out as plotly writes them."""
    result = searches[0]
    inputs = result.to_dict()["inputs"]
    odd = {"data": [{"type": "scatter", "x": [1.0, float("nan"), float("inf")], "y": [0, 1, 2],
                     "text": ["</script><b>", "NaN", "a/b"]}],
           "layout": {"width": 640, "height": "30em"}}
    drawn = [figures.design_space_figure(result.designs, inputs),
             figures.latency_load_figure(result.designs, inputs),
             figures.summary_figure(result.designs), odd]
    for first, figure in zip((True, False, False, False), drawn):
        figure["layout"]["template"] = figures.plotly_template()
        expected = pio.to_html(figure, full_html=False, include_plotlyjs=first, div_id="fig-x",
                               config={"displaylogo": False}, validate=False)
        assert figures.figure_div(figure, "fig-x", include_plotlyjs=first) == expected


def test_the_page_is_written_without_importing_plotly(run_python):
    """plotly.io (with narwhals and plotly's validators) stays out of a search's process."""
    code = ("import sys, provisioner\n"
            "r = provisioner.search(model='llama2-70b', designs='baseline-h100', rate=2, "
            "duration=10, search_limit=4, jobs=1)\n"
            "from provisioner import figures\n"
            "page = figures.html_report(r.to_dict(), r.designs)\n"
            "assert 'Plotly.newPlot(' in page\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('plotly', 'narwhals', '_plotly_utils')))\n")
    run = run_python(code, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
