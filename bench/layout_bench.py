"""What searching instance layouts costs (issue 25): the default search's 8 designs at 70 req/s,
per model, with every layout that fits searched against every pool pinned to the whole
machine (--tp 8: the one layout before layouts existed). CPU seconds of this process (jobs=1,
no cache), so the machine's load does not move them; each pair is run alternately.

    python bench/layout_bench.py            # bloom-176b (the default), llama2-70b, llama-3-8b,
                                            # llama-3.1-70b
    python bench/layout_bench.py MODEL ...  # those models only
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import provisioner  # noqa: E402
from provisioner.tables import layout_label  # noqa: E402

MODELS = ("bloom-176b", "llama2-70b", "llama-3-8b", "llama-3.1-70b")


def timed(**options):
    start = time.process_time()
    result = provisioner.search(jobs=1, **options)
    return time.process_time() - start, result


def best_line(result) -> str:
    best = result.best
    if best is None:
        return "no feasible design"
    o, document = best.optimum, result.to_dict()
    entry = next(d for d in document["designs"] if d["design"] == best.design.name)
    pools = (f"{o.prompt_machines}" if best.design.is_baseline
             else f"{o.prompt_machines}P+{o.token_machines}T")
    return (f"{best.design.name} {pools} {layout_label(entry['optimum'].get('layout'))} "
            f"${o.cost_per_hour:,.0f}/h {o.gpus} GPUs")


def main(models) -> None:
    timed(model="llama-3-8b", designs="baseline-h100", rate=5)   # compile and load once
    print(f"{'model':<15} {'layouts CPU s':>13} {'TP8 CPU s':>10} {'ratio':>6}  "
          "best with layouts | best at TP8")
    for model in models:
        searched, pinned = timed(model=model), None
        pinned = timed(model=model, tp=8)
        print(f"{model:<15} {searched[0]:>13.2f} {pinned[0]:>10.2f} "
              f"{searched[0] / pinned[0]:>6.2f}  {best_line(searched[1])} | "
              f"{best_line(pinned[1])}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
