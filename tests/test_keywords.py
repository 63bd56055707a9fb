"""The typed Python API (issue 40): `provisioner.search(**options: Unpack[SearchKeywords])`,
the keywords generated from the option declarations (provisioner/keywords.py, written by
scripts/generate_keywords.py), never stale, every public option in them and nothing else."""
from __future__ import annotations

import inspect
import typing
from pathlib import Path

import provisioner
from provisioner.keywords import SearchKeywords, SimulateKeywords
from provisioner.options import (KEYWORDS_MODULE, SearchOptions, SimulateOptions,
                                 keywords_source, public_names)

REPO = Path(__file__).resolve().parents[1]


def test_the_generated_keywords_are_current():
    assert (REPO / KEYWORDS_MODULE).read_text() == keywords_source(), \
        "run `python scripts/generate_keywords.py`"


def test_every_public_option_is_a_typed_keyword():
    for keywords, tree in ((SearchKeywords, SearchOptions), (SimulateKeywords, SimulateOptions)):
        assert set(keywords.__annotations__) == set(public_names(tree))
        assert not keywords.__required_keys__   # every keyword may be left out


def test_the_api_signatures_name_the_keywords():
    for function, keywords in ((provisioner.search, "SearchKeywords"),
                               (provisioner.simulate, "SimulateKeywords")):
        options = inspect.signature(function).parameters["options"]
        assert options.kind is inspect.Parameter.VAR_KEYWORD
        assert f"Unpack[{keywords}]" in str(options.annotation)


def test_choices_are_literals():
    hints = typing.get_type_hints(SearchKeywords)
    assert set(typing.get_args(hints["engine"])) == {"vllm", "sglang", "trtllm",
                                                     "splitwise-2023"}
