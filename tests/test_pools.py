"""A design's pools answer for it (issue 35): sizes, counts and words asked of `Design.pools`
rather than branched on `is_baseline`."""
from hardware_catalog import load_catalog

CATALOG = load_catalog()
SPLIT = CATALOG.design("splitwise-ha")
COLOCATED = next(d for d in CATALOG.designs.values() if d.token is None)


def test_pool_lookup_and_lending():
    assert SPLIT.pool("prompt").sku == SPLIT.prompt and SPLIT.pool("token").sku == SPLIT.token
    assert SPLIT.pool("mixed") is None
    assert COLOCATED.pool("mixed").is_mixed and COLOCATED.pool("token") is None
    assert SPLIT.lends_work == SPLIT.mixed_pool and not COLOCATED.lends_work


def test_counts_and_report_keys():
    assert SPLIT.each_pool(2) == (2, 2) and COLOCATED.each_pool(2) == (2, 0)
    assert SPLIT.pool_sizes(3, 9) == {"prompt_machines": 3, "token_machines": 9}
    assert COLOCATED.pool_sizes(12, 0) == {"machines": 12}


def test_pools_in_words():
    prompt, token = SPLIT.prompt.name, SPLIT.token.name
    assert SPLIT.pools_text(3, 9) == "3P+9T" == SPLIT.pools_text(3, 9, "machines")
    assert SPLIT.pools_text(3, 9, "skus") == f"3 {prompt} prompt + 9 {token} token"
    assert COLOCATED.pools_text(12) == "12"
    assert COLOCATED.pools_text(12, 0, "machines") == "12 machines"
    assert COLOCATED.pools_text(12, 0, "skus") == f"12 x {COLOCATED.prompt.name}"
