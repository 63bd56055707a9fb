"""Issue 24 (d), second half: provision's chunked design against Vidur's Sarathi scheduler.

Llama-2-70B, 4 DGX-A100 (32 GPUs), Poisson 12 req/s, chunk 512. Both simulators get the same
requests: `trace` writes one CSV (provision's built-in sizes and Poisson arrivals, seed 0, with
prompt + output clipped to 4,096 tokens the way Vidur's trace replay clips them: the prompt loses
the excess) holding both provision's (arrival_s, prompt_tokens, output_tokens) and Vidur's
(arrived_at, num_prefill_tokens, num_decode_tokens) columns. `compare` runs provision on it
(`--engine vllm` and `--engine splitwise-2023`, `--requests-csv`) and prints the percentiles next
to Vidur's, read from Vidur's output folder (`--vidur-output DIR`, the timestamped folder holding
request_metrics.csv) or given as numbers (`--vidur-ttft-p50`, `--vidur-tbt-p99` in seconds).

TBT is compared as provision defines it: a request's mean gap between output tokens,
(last token - first token) / (output tokens - 1), over requests with at least two output tokens.
From Vidur's request_metrics.csv that is (request_e2e_time - prefill_e2e_time) /
(request_num_decode_tokens - 1) (Vidur's own decode_time_execution_plus_preemption_normalized
divides by all decode tokens, including the first, which came from the prefill). Vidur's per-gap
distribution (plots/decode_token_execution_plus_preemption_time.csv, written with
--metrics_config_store_token_completion_metrics) is printed as information when present.

    python bench/sarathi_vs_vidur.py trace --workload conversation --out /tmp/sv_conv.csv
    python bench/sarathi_vs_vidur.py compare --trace /tmp/sv_conv.csv --vidur-output DIR
    python bench/sarathi_vs_vidur.py compare --trace /tmp/sv_conv.csv --tp 2 --vidur-output DIR
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

MAX_TOKENS = 4096  # Vidur's default max_tokens (and its 2024 attention profile's context range)
LIMIT = 1.5


def write_trace(workload: str, rate: float, duration: float, seed: int, out: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from simcore.workload import synthesize
    w = synthesize(workload, rate, duration, seed)
    prompt = w.prompt_tokens.astype(np.int64).copy()
    output = w.output_tokens.astype(np.int64).copy()
    excess = np.clip(prompt + output - MAX_TOKENS, 0, None)
    prompt = np.clip(prompt - excess, 1, None)
    with open(out, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["arrival_s", "prompt_tokens", "output_tokens",
                     "arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for a, p, o in zip(w.arrival_s, prompt, output):
            wr.writerow([f"{a:.6f}", int(p), int(o), f"{a:.6f}", int(p), int(o)])
    print(f"{out}: {len(prompt)} requests ({w.name}), {int((excess > 0).sum())} clipped to "
          f"{MAX_TOKENS} tokens; prompt P50 {np.median(prompt):.0f}, output P50 "
          f"{np.median(output):.0f}")


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def summarize(ttft, tbt) -> dict:
    return {"n": len(ttft), "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90),
            "tbt_p50": pct(tbt, 50), "tbt_p90": pct(tbt, 90), "tbt_p99": pct(tbt, 99)}


def run_provision(trace: str, engine: str, machines: int, model: str, design: str,
                  tp: int | None = None, extra: tuple = ()) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "requests.csv")
        cmd = [sys.executable, "-m", "provisioner.cli", "simulate", "--design", design,
               "--machines", str(machines), "--model", model, "--workload", trace,
               "--engine", engine, "--json", "--requests-csv", req,
               *(["--tp", str(tp)] if tp else []), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode not in (0, 1):  # 1: an SLO failed, the run is still complete
            raise SystemExit(f"provision failed ({' '.join(cmd)}):\n{proc.stderr}")
        meta = json.loads(proc.stdout)
        ttft, tbt = [], []
        with open(req) as f:
            for row in csv.DictReader(f):
                ttft.append(float(row["ttft_s"]))
                if int(row["output_tokens"]) >= 2:
                    tbt.append(float(row["tbt_s"]))
    out = summarize(ttft, tbt)
    out["utilization"] = meta["pools"]["machines"]["utilization"]
    out["mean_batch"] = meta["pools"]["machines"]["mean_batch"]
    return out


def read_vidur(folder: str) -> dict:
    ttft, tbt = [], []
    with open(os.path.join(folder, "request_metrics.csv")) as f:
        for row in csv.DictReader(f):
            first = float(row["prefill_e2e_time"])
            ttft.append(first)
            n = int(float(row["request_num_decode_tokens"]))
            if n >= 2:
                tbt.append((float(row["request_e2e_time"]) - first) / (n - 1))
    out = summarize(ttft, tbt)
    gaps = os.path.join(folder, "plots", "decode_token_execution_plus_preemption_time.csv")
    if os.path.exists(gaps):  # a CDF: (quantile, value) rows
        with open(gaps) as f:
            rows = list(csv.DictReader(f))
        key = [k for k in rows[0] if k not in ("", "cdf")][0]
        q = np.array([float(r["cdf"]) for r in rows])
        v = np.array([float(r[key]) for r in rows])
        out["gap_p50"] = float(np.interp(0.50, q, v))
        out["gap_p99"] = float(np.interp(0.99, q, v))
    return out


def compare(args) -> None:
    results = {}
    # the 2023 profiles were measured at TP8 only: that engine cannot run another layout
    engines = ("vllm", "splitwise-2023") if args.tp in (None, 8) else ("vllm",)
    for engine in engines:
        extra = tuple(args.provision_arg) if engine != "splitwise-2023" else ()
        results[f"provision {engine}"] = run_provision(args.trace, engine, args.machines,
                                                       args.model, args.design, args.tp, extra)
    if args.vidur_output:
        results["Vidur sarathi"] = read_vidur(args.vidur_output)
    elif args.vidur_ttft_p50 is not None:
        results["Vidur sarathi"] = {"ttft_p50": args.vidur_ttft_p50,
                                    "tbt_p99": args.vidur_tbt_p99}
    cols = ["ttft_p50", "ttft_p90", "tbt_p50", "tbt_p90", "tbt_p99"]
    print("| run | requests | " + " | ".join(c.replace("_", " ").upper() + " s" for c in cols)
          + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, r in results.items():
        cells = [f"{r[c]:.3f}" if r.get(c) is not None else "" for c in cols]
        print(f"| {name} | {r.get('n', '')} | " + " | ".join(cells) + " |")
    vidur = results.get("Vidur sarathi")
    if vidur and vidur.get("gap_p50") is not None:
        print(f"Vidur per-gap TBT (information): P50 {vidur['gap_p50']:.4f} s, "
              f"P99 {vidur['gap_p99']:.4f} s")
    if not vidur:
        return
    for name in [f"provision {engine}" for engine in engines]:
        r = results[name]
        for c in ("ttft_p50", "tbt_p99"):
            ratio = r[c] / vidur[c]
            ok = 1 / LIMIT <= ratio <= LIMIT
            print(f"{name} / Vidur {c.upper()}: {ratio:.2f} ({'within' if ok else 'OUTSIDE'} "
                  f"{LIMIT}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="write the shared request trace")
    t.add_argument("--workload", default="conversation")
    t.add_argument("--rate", type=float, default=12.0)
    t.add_argument("--duration", type=float, default=120.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="run provision on the trace, print the comparison")
    c.add_argument("--trace", required=True)
    c.add_argument("--design", default="sarathi-a100")
    c.add_argument("--machines", type=int, default=4)
    c.add_argument("--model", default="llama2-70b")
    c.add_argument("--tp", type=int, help="provision's tensor parallelism per instance (2: 16 "
                                          "TP2 instances on 4 DGX-A100, like Vidur's replicas)")
    c.add_argument("--provision-arg", action="append", default=[],
                   help="an argument passed on to provision's kernel-engine runs (repeatable), "
                        "e.g. --provision-arg=--first-token-overhead-ms --provision-arg=0")
    c.add_argument("--vidur-output")
    c.add_argument("--vidur-ttft-p50", type=float)
    c.add_argument("--vidur-tbt-p99", type=float)
    args = ap.parse_args()
    if args.cmd == "trace":
        write_trace(args.workload, args.rate, args.duration, args.seed, args.out)
    else:
        compare(args)


if __name__ == "__main__":
    main()
