"""What replication buys over a week of load (issue 29): the coding week's static Splitwise-HH
cluster (19P+4T, BLOOM-176B) with machines failing at the fleet MTBF (6,000 h per server,
the Llama 3 paper) and at 100x that rate, under restart (recompute), restart (regenerate) and
replicate; each a whole-week streamed run (`provision simulate --load-curve`).

    python bench/week_failures_bench.py [--days 7]
Prints per case: failures drawn, requests affected, tokens recomputed, mean / max recovery,
windows met, and the whole week's TTFT, TBT and E2E P99 (slowdowns). Needs ../shared.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CURVE = ROOT.parent / "shared" / "traces" / "azure_coding_2024_week_rate.csv"
CASES = (("restart", "recompute"), ("restart", "regenerate"), ("replicate", "recompute"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=7.0)
    args = parser.parse_args()
    if not CURVE.exists():
        sys.exit(f"{CURVE} not found")
    with tempfile.TemporaryDirectory() as tmp:
        curve = Path(tmp) / "curve.csv"
        rows = CURVE.read_text().splitlines()
        keep = [rows[0]] + [r for r in rows[1:] if float(r.split(",")[0]) - float(
            rows[1].split(",")[0]) < args.days * 86400]
        curve.write_text("\n".join(keep) + "\n")
        for mtbf in (6000.0, 60.0):
            for recovery, restart in CASES:
                command = [sys.executable, "-m", "provisioner.cli", "simulate", "--design",
                           "splitwise-hh", "--prompt", "19", "--token", "4", "--load-curve",
                           str(curve), "--mtbf-hours", f"{mtbf:g}", "--repair-minutes", "30",
                           "--recovery", recovery, "--json"]
                if recovery == "restart":
                    command += ["--restart", restart]
                run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
                doc = json.loads(run.stdout)
                f, slo = doc.get("failures", {}), doc["slo"]
                met = sum(w["passed"] for w in doc["windows"])
                label = recovery if recovery == "replicate" else f"restart ({restart})"
                print(f"MTBF {mtbf:>6g} h, {label:22}: {f.get('failures', 0)} failures, "
                      f"{f.get('requests_affected', 0):,} requests affected, "
                      f"{f.get('tokens_recomputed', 0):,} tokens recomputed, recovery "
                      f"{f.get('recovery_s_mean', 0):.2f} s mean / "
                      f"{f.get('recovery_s_max', 0):.2f} s max; {met} of {len(doc['windows'])} "
                      f"windows met; P99 TTFT {slo['ttft_p99']['value']:.3f}x, "
                      f"TBT {slo['tbt_p99']['value']:.3f}x, E2E {slo['e2e_p99']['value']:.3f}x")


if __name__ == "__main__":
    main()
