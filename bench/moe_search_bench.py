"""The models of 2026 searched with their expert-parallel layouts (issue 36): CPU seconds of
one search each (this process, jobs=1, no cache, so the machine's load does not move them)
and the answer, each optimum's pool layouts named.

    python bench/moe_search_bench.py                 # the issue's command for four models
    python bench/moe_search_bench.py deepseek-r1     # that model only

The issue's command: `provision search --model M --hardware b200,gb200-nvl72,h200 --dtype
fp8` (target: DeepSeek-R1 in at most 60 CPU seconds); DeepSeek-R1 also in fp4 on the
Blackwell machines and at 300 req/s, where more layouts are searched before one wins.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import provisioner  # noqa: E402

MODELS = ("deepseek-r1", "kimi-k2", "qwen3-235b-a22b", "gpt-oss-120b")
HARDWARE = "b200,gb200-nvl72,h200"


def cases(models):
    for model in models:
        yield model, dict(model=model, hardware=HARDWARE, dtype="fp8")
    if "deepseek-r1" in models:
        yield "deepseek-r1 fp4", dict(model="deepseek-r1", hardware="b200,gb200-nvl72",
                                      dtype="fp4")
        yield "deepseek-r1 300/s", dict(model="deepseek-r1", hardware=HARDWARE, dtype="fp8",
                                        rate=300)


def answer(result) -> str:
    best = result.best
    if best is None:
        return "no feasible design"
    o = best.optimum
    entry = next(d for d in result.to_dict()["designs"] if d["design"] == best.design.name)
    layout = " / ".join(pool.get("label") or f"TP{pool['tp']}" + (
        f"xPP{pool['pp']}" if pool["pp"] > 1 else "")
        for pool in entry["optimum"]["layout"].values())
    pools = best.design.pools_text(o.prompt_machines, o.token_machines)
    return f"{best.design.name} {pools} {layout} ${o.cost_per_hour:,.0f}/h"


def main(models) -> None:
    print(f"{'case':<22} {'CPU s':>7}  answer")
    for name, options in cases(models):
        start = time.process_time()
        result = provisioner.search(jobs=1, no_cache=True, quiet=True, **options)
        print(f"{name:<22} {time.process_time() - start:>7.1f}  {answer(result)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
