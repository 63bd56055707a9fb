"""--survive-failures auto (issue 29): k spare machines from MTBF and repair time."""
from __future__ import annotations

import math

import pytest

import provisioner
from provisioner.sparing import FLEET_MTBF_HOURS, down_fraction, more_than, spares_for


@pytest.mark.parametrize("n", [1, 2, 7, 40])
@pytest.mark.parametrize("q", [1e-4, 0.01, 0.3])
def test_more_than_is_the_binomial_tail(n, q):
    for k in range(n + 1):
        exact = sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1, n + 1))
        assert more_than(k, n, q) == pytest.approx(exact, abs=1e-12)


def test_spares_grow_with_the_pool_and_the_repair_time():
    q = down_fraction(FLEET_MTBF_HOURS, 0.5)          # 30 minutes to repair
    assert spares_for([1], q) == 0                     # one machine: down 8e-5 of the time
    assert spares_for([20], q) == 1
    assert spares_for([3000], q) == 4                  # 0.25 down on average
    slow = down_fraction(FLEET_MTBF_HOURS, 24.0)       # a day to repair
    assert spares_for([3000], slow) > spares_for([3000], q)
    for pools in ([5], [50], [500]):                   # the chosen k meets the target
        k = spares_for(pools, q)
        assert more_than(k, pools[0], q) < 1e-4 and (k == 0 or more_than(k - 1, pools[0], q)
                                                    >= 1e-4)


def test_auto_sizes_n_plus_k_and_says_why():
    # 12 req/s: pools large enough for one spare (at 10, vLLM's first-token term lets 1 P +
    # 1 T pass, and two machines need none)
    result = provisioner.search(designs="splitwise-hh", model="llama2-70b", rate=12,
                                duration=30, verify_seeds=2, survive_failures="auto")
    document = result.to_dict()
    chosen = document["summary"]["survive_failures_auto"]
    assert chosen["k"] == 1 and chosen["mtbf_hours"] == FLEET_MTBF_HOURS
    assert chosen["p_more_than_k_down"] < chosen["target"]
    assert result.study.survive_failures == 1
    assert document["designs"][0]["resilience"]["survive_failures"] == 1


def test_auto_takes_a_repair_time_without_an_mtbf(run_cli, tmp_path):
    run = run_cli("search", "--designs", "splitwise-hh", "--model", "llama2-70b", "--rate", "10",
                  "--duration", "30", "--verify-seeds", "2", "--survive-failures", "auto",
                  "--repair-minutes", "120", "--no-cache", "--out", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    assert "Spares (--survive-failures auto): k = 1" in run.stdout
    assert "N+1" in run.stdout
