"""Validation of provision's expert-parallel latencies (issue 36).

    python bench/ep_validation.py            # all three comparisons (~1 minute of CPU)
    python bench/ep_validation.py --quick    # B200 only in part 1

1. Against aiconfigurator's own estimator (aiconfigurator-core, `sdk.engine.EngineHandle`: the
   compiled op-level model the kernel tables come from) on the same configurations: TP8 (the
   experts split like dense columns, moe_tp 8), TEP8 (tp 8, moe_ep 8), DEP8/16/32 (attention_dp
   = moe_ep, one-GPU ranks), vLLM, fp8 weights (DeepSeek block-scaled), bf16 KV cache:
   (a) a prefill iteration of one 4096-token prompt per attention rank (TTFT-like),
   (b) a decode iteration of 32/64/128 requests per rank at 4096 tokens of context (TPOT-like),
   with the components of both (attention, MoE experts, dispatch+combine, all-reduce, rest).
2. Our all-to-all model (`KernelTables.alltoall`, one-node vLLM data + a link model) against
   the measured multi-node DeepEP dispatch+combine in aiconfigurator's data (SGLang 0.5.6.post2,
   H200, 400 Gb/s per GPU, node_num 1/2/4/8 = EP 8/16/32/64), at the same tokens per rank.
3. Against published figures: DeepEP's README low-latency table (H800, CX7 400 Gb/s, 128 tokens
   per GPU, hidden 7168, top-8), and the per-node throughputs of DeepSeek's inference-system
   post and of the LMSYS/SGLang 96-H100 deployment (sources in PUBLISHED below).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import hardware_catalog  # noqa: E402
from hardware_catalog import Layout  # noqa: E402
from provisioner.study import model_in_dtype  # noqa: E402
from simcore import kernels  # noqa: E402
from simcore.kernels import (BF16_BYTES, DISPATCH_BYTES, RDMA_EFFICIENCY,  # noqa: E402
                             RDMA_LATENCY_S, ExpertParallel, ModelShapes, _loglog)

PROMPT = 4096
CONTEXT = 4096
DECODE_BATCHES = (32, 64, 128)
# aiconfigurator checkpoints and quantization matching provision's "fp8" tables
AIC_MODELS = {
    "deepseek-r1": ("deepseek-ai/DeepSeek-R1", "fp8_block", "fp8_block"),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B", "fp8", "fp8"),
}
SYSTEM = {"b200": "b200_sxm", "h200": "h200_sxm", "gb200-nvl72": "gb200"}
LAYOUTS = {"TP8": (Layout(8), dict(tp_size=8, moe_tp_size=8, moe_ep_size=1)),
           "TEP8": (Layout(8, ep=8), dict(tp_size=8, moe_tp_size=1, moe_ep_size=8)),
           "DEP8": (Layout(1, ep=8, dp=8), dict(tp_size=1, attention_dp_size=8, moe_tp_size=1,
                                                moe_ep_size=8)),
           "DEP16": (Layout(1, ep=16, dp=16), dict(tp_size=1, attention_dp_size=16,
                                                   moe_tp_size=1, moe_ep_size=16)),
           "DEP32": (Layout(1, ep=32, dp=32), dict(tp_size=1, attention_dp_size=32,
                                                   moe_tp_size=1, moe_ep_size=32))}
COMPONENTS = ("attn", "moe", "a2a", "ar", "rest")

# Published figures, with the passages the search tool returned (quoted figures only).
DEEPEP_LL = {  # github.com/deepseek-ai/DeepEP README, low-latency kernels (the brief's figures)
    8: (77, 114), 16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369),
    256: (194, 360)}
PUBLISHED = {
    "deepseek": ("https://aiposthub.cc/5152 (summary of DeepSeek's Open-Source-Week day-6 "
                 "post, 'DeepSeek-V3/R1 Inference System')",
                 "Throughput per H800 node: 73.7k input tokens per second (prefill), 14.8k "
                 "output tokens per second (decode); Total input tokens: 608B (56.3% cache hit "
                 "rate); Average output speed: 20-22 tokens per second"),
    "lmsys": ("https://vuink.com/post/yzflf-d-dbet/blog/2025-05-05-large-scale-ep (copy of "
              "https://lmsys.org/blog/2025-05-05-large-scale-ep/)",
              "12 nodes ... each equipped with 8 H100 GPUs ... 52.3k input tokens per second "
              "and 22.3k output tokens per second per node for 2000-token input sequences"),
    "lmsys_prefill": ("https://ucalyptus-sglang-prefill-decoded-aggregation.static.hf.space/"
                      "index.html (summary of the LMSYS post)",
                      "On 4 nodes (32 H100s, EP32) ... Example: 50,302 tokens/s per node for "
                      "4K prompts"),
    "lmsys_layout": ("https://t6page.pages.dev/interconnect/... (page on the LMSYS 96-H100 "
                     "case)", "Prefill 4 nodes EP32 DP32, decode 9 nodes EP72 DP72"),
    "lmsys_itl": ("https://hb.int2inf.com/en/s/item/AsvKZ1PYivCbWkqva1N24C-deploying-deepseek-"
                  "with-sglang (summary of the LMSYS post)",
                  "Limitations include high TTFT (2-5s) and ITL (~100ms)"),
}


def table(title: str, header: list[str], rows: list[list]) -> str:
    out = [f"\n### {title}\n", "| " + " | ".join(header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(x) for x in row) + " |")
    text = "\n".join(out)
    print(text, flush=True)
    return text


# --- ours -----------------------------------------------------------------------------------
def ours_breakdown(model, tables, layout: Layout, machine, prompts=(), decodes=(),
                   balanced: bool = False):
    """(total seconds, {component: seconds}) of one attention rank's iteration."""
    placement = (kernels.expert_placement(machine, layout, balanced) if layout.ep > 1
                 else None)
    total = kernels.iteration_time(model, tables, layout.tp, prompts=list(prompts),
                                   decode_contexts=list(decodes), experts=placement)
    shapes = ModelShapes(model, layout.tp, placement)
    tokens = float(sum(prompts) + len(decodes))
    graph = tokens <= kernels.CUDA_GRAPH_TOKENS
    phase = "context" if prompts else "generation"
    moe_layers = (model.moe_layers if (model.is_mla or model.shared_experts or model.dense_layers)
                  else model.layers)
    if prompts:
        s = float(np.sqrt(np.mean(np.square(prompts))))
        attn = model.layers * float(kernels._context_attention(tables, shapes, len(prompts), s))
    else:
        attn = model.layers * float(kernels._generation_attention(
            tables, shapes, len(decodes), float(np.mean(decodes)))[0])
    if placement is None:
        moe = moe_layers * float(tables.moe_layer(tokens, model, layout.tp))
        a2a = 0.0
    else:
        moe = moe_layers * float(tables.moe_layer_ep(tokens * placement.dp, model,
                                                     placement.ep, placement.balanced))
        a2a = (moe_layers * float(tables.alltoall(tokens / layout.tp, model, placement, phase))
               if placement.dp > 1 else 0.0)
    ar = (2 * model.layers + 1) * float(tables.all_reduce(tokens * model.hidden, layout.tp, graph))
    parts = dict(attn=attn, moe=moe, a2a=a2a, ar=ar)
    parts["rest"] = total - sum(parts.values())
    return total, parts


def alltoall_split(tables, model, placement: ExpertParallel, tokens: float, phase: str):
    """(dispatch, combine) seconds of `KernelTables.alltoall`, computed kind by kind as it does
    (checked against its sum, so a change to the model shows up here)."""
    entry, _, factor = tables._alltoall_entry(model)
    measured_ep = sorted(int(e) for e in entry)[-1]
    rows = entry[str(measured_ep)].get(phase) or next(iter(entry[str(measured_ep)].values()))
    inside = min(placement.ep, placement.machine_gpus)
    share = ((inside - 1.0) / placement.ep) / ((measured_ep - 1.0) / measured_ep)
    remote = max(0.0, 1.0 - placement.machine_gpus / placement.ep)
    out = []
    for kind, value_bytes in (("dispatch", DISPATCH_BYTES), ("combine", BF16_BYTES)):
        xs = np.array(rows[kind]["tokens"], float)
        ys = np.array(rows[kind]["us"], float) * 1e-6
        measured = float(_loglog(np.maximum(tokens, xs[0]), xs, ys, 1.0))
        local = ys[0] + max(measured * factor - ys[0], 0.0) * share
        if remote:
            sent = tokens * model.experts_per_token * remote * model.hidden * value_bytes
            local = max(local, RDMA_LATENCY_S + sent / (RDMA_EFFICIENCY * placement.link_bytes_per_s))
        out.append(local)
    whole = float(tables.alltoall(tokens, model, placement, phase))
    assert abs(sum(out) - whole) <= 1e-9 + 1e-6 * whole, (out, whole)
    return out[0], out[1]


# --- aiconfigurator -------------------------------------------------------------------------
def aic_handle(model_name: str, system: str, kwargs: dict):
    """(compiled engine, its Python op lists' generation MoE overlap op or None)."""
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.engine import EngineHandle
    from aiconfigurator_core.sdk.models import get_model
    path, gemm, moe = AIC_MODELS[model_name]
    quant = dict(gemm_quant_mode=gemm, moe_quant_mode=moe, kvcache_quant_mode="bfloat16",
                 fmha_quant_mode="bfloat16", comm_quant_mode="half")
    handle = EngineHandle.compile(path, system, "vllm", **quant, **kwargs)
    config = dict(kwargs)
    config.setdefault("attention_dp_size", 1)
    ops = get_model(path, build_model_config(pp_size=1, **quant, **config), "vllm").generation_ops
    overlap = next((o for o in ops if "overlap" in getattr(o, "_name", "")), None)
    return handle, overlap


def aic_overlap_split(handle, overlap, batch: int) -> str:
    """The two streams of aiconfigurator's decode MoE overlap op (latency = the slower)."""
    from aiconfigurator_core.sdk.engine import build_ops_json
    out = {}
    for group in ("_group_a", "_group_b"):
        res = handle.evaluate_ops_json(build_ops_json(getattr(overlap, group)), is_context=False,
                                       batch_size=batch, s=CONTEXT)
        out[group] = {name: ms for name, ms, *_ in res}
    routed, shared = out["_group_a"], out["_group_b"]
    a2a = sum(v for k, v in routed.items() if "dispatch" in k)
    experts = sum(v for k, v in routed.items() if k.endswith("_moe"))
    return (f" [routed {sum(routed.values()):.1f} = experts {experts:.1f} + a2a {a2a:.1f} + "
            f"router; shared-expert stream {sum(shared.values()):.1f}]")


def aic_parts(per_op) -> tuple[float, dict, bool]:
    """(total seconds, components, whether MoE and all-to-all are one overlapped op)."""
    parts = dict.fromkeys(COMPONENTS, 0.0)
    merged = False
    for name, ms, *_ in per_op:
        s = ms * 1e-3
        if "moe_overlap" in name:
            parts["moe"] += s
            merged = True
        elif "dispatch" in name:
            parts["a2a"] += s
        elif name.endswith("_moe") or "moe_expert" in name:
            parts["moe"] += s
        elif "mla" in name or "attention" in name and "allreduce" not in name:
            parts["attn"] += s
        elif "allreduce" in name:
            parts["ar"] += s
        else:
            parts["rest"] += s
    return sum(parts.values()), parts, merged


def fmt_parts(parts: dict, merged: bool = False) -> str:
    keys = [k for k in COMPONENTS if parts.get(k)]
    text = " ".join(f"{k} {parts[k] * 1e3:.1f}" for k in keys)
    return text + (" (moe = max(routed, shared))" if merged else "")


def part1(catalog, quick: bool) -> tuple[str, list]:
    rows, ratios = [], []
    cases = [("deepseek-r1", m) for m in (["b200"] if quick else ["b200", "h200", "gb200-nvl72"])]
    cases.append(("qwen3-235b-a22b", "b200"))
    for model_name, machine_name in cases:
        machine = catalog.machines[machine_name]
        model = model_in_dtype(catalog.models[model_name], "fp8")
        tables = kernels.load_tables(SYSTEM[machine_name], "vllm", "fp8")
        for label, (layout, kwargs) in LAYOUTS.items():
            if model_name != "deepseek-r1" and label == "DEP32":
                continue
            try:
                handle, overlap = aic_handle(model_name, SYSTEM[machine_name], kwargs)
            except Exception as err:  # noqa: BLE001 - report what aiconfigurator refuses
                rows.append([model_name, machine_name, label, "all", "-", "-", "-",
                             f"aiconfigurator refuses: {str(err).splitlines()[0][:90]}"])
                continue
            cases_here = [("prefill 1x4096", [PROMPT], [], None)]
            cases_here += [(f"decode b{b}", [], [float(CONTEXT)] * b, b)
                           for b in DECODE_BATCHES]
            for case, prompts, decodes, b in cases_here:
                try:
                    ours, op = ours_breakdown(model, tables, layout, machine, prompts, decodes)
                except Exception as err:  # noqa: BLE001
                    rows.append([model_name, machine_name, label, case, "-", "-", "-",
                                 f"provision refuses: {str(err)[:90]}"])
                    continue
                if b is None:
                    ctx, _ = handle.run_static_per_op(batch_size=1, isl=PROMPT, osl=2)
                    theirs, tp_, merged = aic_parts(ctx)
                else:   # one step at s = isl + osl // 2 + 1 = 4096
                    theirs, tp_, merged = aic_parts(handle.decode_step_per_op(b, CONTEXT - 2, 2))
                split = aic_overlap_split(handle, overlap, b) if merged and overlap else ""
                ratio = ours / theirs
                ratios.append((model_name, machine_name, label, case, ratio, op, tp_, merged))
                rows.append([model_name, machine_name, label, case, f"{ours * 1e3:.1f}",
                             f"{theirs * 1e3:.1f}", f"**{ratio:.2f}**",
                             f"ours: {fmt_parts(op)}; aic: {fmt_parts(tp_, merged)}{split}"])
    text = table("1. provision vs aiconfigurator's estimator (vLLM, fp8, iteration ms per "
                 "attention rank)",
                 ["model", "machine", "layout", "case", "ours ms", "aic ms", "ours/aic",
                  "components ms (attn, moe experts, a2a dispatch+combine, ar all-reduce, rest)"],
                 rows)
    return text, ratios


def _aic_systems() -> Path:
    import aiconfigurator_core
    return Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "data"


def part2(catalog) -> tuple[str, list]:
    import pandas as pd
    base = _aic_systems() / "h200_sxm" / "comm" / "sglang" / "0.5.6.post2"
    normal = pd.read_parquet(base / "wideep_deepep_normal_perf.parquet")
    normal = normal[(normal.device == "NVIDIA H200") & (normal.dispatch_sms == 20)
                    & (normal.combine_sms == 20) & (normal.num_experts == 256)]
    ll = pd.read_parquet(base / "wideep_deepep_ll_perf.parquet")
    ll = ll[(ll.device == "NVIDIA H200") & (ll.num_experts == 256)]
    machine = catalog.machines["h200"]
    tables = kernels.load_tables("h200_sxm", "vllm", "fp8")
    model = model_in_dtype(catalog.models["deepseek-r1"], "fp8")
    link = machine.kv_link_gbps * 1e9 / 8
    rows, ratios = [], []
    for phase, data, tokens_list in (("context", normal, (256, 1024, 4096, 16384)),
                                     ("generation", ll, (16, 64, 128, 256))):
        kind = "normal (prefill)" if phase == "context" else "low-latency (decode)"
        for nodes in (1, 2, 4, 8):
            ep = 8 * nodes
            placement = ExpertParallel(ep, ep, machine.gpus, link, False)
            for tokens in tokens_list:
                sel = data[(data.node_num == nodes) & (data.num_token == tokens)]
                if sel.empty:
                    continue
                r = sel.iloc[0]
                if phase == "context":
                    md = (r.dispatch_transmit_us + r.dispatch_notify_us) * 1e-6
                    mc = (r.combine_transmit_us + r.combine_notify_us) * 1e-6
                else:
                    md, mc = r.dispatch_avg_t_us * 1e-6, r.combine_avg_t_us * 1e-6
                od, oc = alltoall_split(tables, model, placement, float(tokens), phase)
                ratio = (od + oc) / (md + mc)
                ratios.append((phase, ep, tokens, ratio, od / md, oc / mc))
                rows.append([kind, ep, nodes, tokens, f"{od * 1e6:.0f} / {oc * 1e6:.0f}",
                             f"{md * 1e6:.0f} / {mc * 1e6:.0f}", f"{od / md:.2f} / {oc / mc:.2f}",
                             f"**{ratio:.2f}**"])
    text = table("2. all-to-all: our model vs measured multi-node DeepEP (SGLang 0.5.6.post2, "
                 "H200, hidden 7168, top-8, 256 experts; normal kernels at 20 SMs)",
                 ["kernels", "EP", "nodes", "tokens/rank", "ours dispatch / combine us",
                  "measured dispatch / combine us", "ratio d / c", "ratio sum"], rows)
    return text, ratios


def part3(catalog) -> tuple[str, list]:
    texts, notes = [], []
    machine = catalog.machines["dgx-h100"]
    tables = kernels.load_tables("h100_sxm", "vllm", "fp8")
    model = model_in_dtype(catalog.models["deepseek-r1"], "fp8")
    link = machine.kv_link_gbps * 1e9 / 8
    rows = []
    for ep, (pd_, pc) in DEEPEP_LL.items():
        placement = ExpertParallel(ep, ep, machine.gpus, link, False)
        od, oc = alltoall_split(tables, model, placement, 128.0, "generation")
        rows.append([ep, f"{od * 1e6:.0f}", pd_, f"{od * 1e6 / pd_:.2f}", f"{oc * 1e6:.0f}", pc,
                     f"{oc * 1e6 / pc:.2f}"])
        notes.append(("deepep", ep, od * 1e6 / pd_, oc * 1e6 / pc))
    texts.append(table("3a. DeepEP README low-latency kernels (H800, CX7 400 Gb/s, 128 tokens "
                       "per GPU, hidden 7168, top-8) vs our model on dgx-h100 (H100 one-node "
                       "data, 400 Gb/s per GPU)",
                       ["EP", "ours dispatch us", "DeepEP dispatch us", "ratio",
                        "ours combine us", "DeepEP combine us", "ratio"], rows))

    rows = []

    def prefill(ep, prompts, balanced):
        layout = Layout(1, ep=ep, dp=ep)
        t, parts = ours_breakdown(model, tables, layout, machine, prompts=prompts,
                                  balanced=balanced)
        return t, 8 * sum(prompts) / t, parts

    def decode(ep, batch, ctx, balanced):
        layout = Layout(1, ep=ep, dp=ep)
        t, parts = ours_breakdown(model, tables, layout, machine, decodes=[float(ctx)] * batch,
                                  balanced=balanced)
        return t, 8 * batch / t, parts

    for ep, prompts, ref, what in (
            (32, [4096], 73.7e3, "deepseek"),
            (32, [4096], 50.302e3, "lmsys_prefill"), (32, [2000] * 2, 52.3e3, "lmsys")):
        for balanced in (False, True):
            t, thr, parts = prefill(ep, prompts, balanced)
            rows.append([PUBLISHED[what][0].split(" ")[0], "prefill",
                         f"DEP{ep} dgx-h100, {len(prompts)} x {prompts[0]}-token prompts per rank"
                         + (", balanced experts (EPLB)" if balanced else ", skewed routing"),
                         f"{t * 1e3:.0f} ms", f"{thr / 1e3:.1f}k", f"{ref / 1e3:.1f}k",
                         f"**{thr / ref:.2f}**", fmt_parts(parts)])
            notes.append(("prefill", what, ep, len(prompts), prompts[0], balanced, thr / ref))
    for ep, batch, ctx, ref, what in (
            (128, 64, 4096, 14.8e3, "deepseek"), (128, 128, 4096, 14.8e3, "deepseek"),
            (64, 128, 2048, 22.3e3, "lmsys"), (64, 256, 2048, 22.3e3, "lmsys"),
            (128, 256, 2048, 22.3e3, "lmsys")):
        for balanced in (False, True):
            t, thr, parts = decode(ep, batch, ctx, balanced)
            rows.append([PUBLISHED[what][0].split(" ")[0], "decode",
                         f"DEP{ep} dgx-h100, {batch} decodes per rank at {ctx} context"
                         + (", balanced experts (EPLB)" if balanced else ", skewed routing"),
                         f"{t * 1e3:.0f} ms ({1 / t:.0f} tok/s/user)", f"{thr / 1e3:.1f}k",
                         f"{ref / 1e3:.1f}k", f"**{thr / ref:.2f}**", fmt_parts(parts)])
            notes.append(("decode", what, ep, batch, ctx, balanced, thr / ref, t))
    texts.append(table("3b. per-node throughput (8 GPUs) vs published deployments (tokens/s per "
                       "node; ours: one iteration, ranks equally loaded, no MTP, no two-batch "
                       "overlap)",
                       ["source", "phase", "our closest configuration", "our iteration",
                        "ours /node", "published /node", "ours/published",
                        "our components ms"], rows))
    quoted = "\n".join(f"- {url}: \"{passage}\"" for url, passage in PUBLISHED.values())
    print("\nPublished passages (as returned by the search tool):\n" + quoted)
    texts.append("\nPublished passages (as returned by the search tool):\n\n" + quoted + "\n")
    return "\n".join(texts), notes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B200 only in part 1")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("AIC_LOG_LEVEL", "ERROR")
    started, cpu = time.perf_counter(), time.process_time()
    catalog = hardware_catalog.load_catalog()
    _, r1 = part1(catalog, args.quick)
    _, r2 = part2(catalog)
    _, r3 = part3(catalog)
    print("\n### Summary")
    for group in ("prefill", "decode"):
        vals = [r[4] for r in r1 if r[3].startswith(group)]
        for label in LAYOUTS:
            sel = [r[4] for r in r1 if r[3].startswith(group) and r[2] == label]
            if sel:
                print(f"- part 1 {group} {label}: ours/aic {min(sel):.2f}-{max(sel):.2f} "
                      f"(n={len(sel)})")
        if vals:
            print(f"- part 1 {group} all: median {np.median(vals):.2f}")
    for phase in ("context", "generation"):
        for ep in (8, 16, 32, 64):
            sel = [r[3] for r in r2 if r[0] == phase and r[1] == ep]
            if sel:
                print(f"- part 2 {phase} EP{ep}: ours/measured {min(sel):.2f}-{max(sel):.2f}")
    print(f"\n{time.perf_counter() - started:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
