"""Sizing for a load curve (issue 29, first part): the static cluster and the autoscaling plan
for the example day and, when ../shared is there, the shared week of the Azure 2024 coding and
conversation services. CPU seconds of this process (jobs=1, no cache), the windows and the
distinct window rates searched, the simulations, and what the plan saves.

    python bench/load_curve_bench.py [DESIGN]     # default splitwise-hh
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import provisioner  # noqa: E402

CURVES = [ROOT / "examples" / "load-curves" / "azure-coding-2024-05-13.csv",
          ROOT.parent / "shared" / "traces" / "azure_coding_2024_week_rate.csv",
          ROOT.parent / "shared" / "traces" / "azure_conversation_2024_week_rate.csv"]


def main(design: str) -> None:
    provisioner.search(designs=design, rate=5, duration=10, verify_seeds=1, jobs=1)  # warm
    for path in CURVES:
        if not path.exists():
            print(f"{path.name}: not here, skipped")
            continue
        workload = "conversation" if "conversation" in path.name else "coding"
        start = time.process_time()
        result = provisioner.search(load_curve=str(path), designs=design, workload=workload,
                                    jobs=1)
        cpu = time.process_time() - start
        curve = result.to_dict()["load_curve"]
        entry = curve["designs"][design]
        rates = len({w["rate_rps"] for w in curve["windows"]})
        figures = "no plan: " + entry.get("reason", "") if not entry["feasible"] else (
            f"static {entry['static']} ${entry['cost_usd']['static']:,.0f}, plan "
            f"${entry['cost_usd']['plan']:,.0f} ({entry['saves']:.0%} less; "
            f"${entry['cost_usd']['plan_without_delay']:,.0f} without delay), "
            f"{entry['machine_hours']['plan']:,.0f} vs {entry['machine_hours']['static']:,.0f} "
            "machine-hours")
        print(f"{path.name} ({workload}): {len(curve['windows'])} windows, {rates} rates "
              f"searched, {result.stats.simulated} simulations, {cpu:.1f} CPU s; {figures}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "splitwise-hh")
