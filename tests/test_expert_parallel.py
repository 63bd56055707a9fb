"""Expert-parallel layouts (issue 36): the layout record, memory, the all-to-all model, pricing
from the measured MoE tables, and both simulators on an expert-parallel instance."""
from __future__ import annotations

import numpy as np
import pytest

from hardware_catalog import InputError, Layout, load_catalog
from simcore import kernels
from simcore import layout as layouts

CATALOG = load_catalog()
R1 = CATALOG.models["deepseek-r1"]
B200 = CATALOG.machines["b200"]
NVL72 = CATALOG.machines["gb200-nvl72"]
FP8_R1 = R1.__class__(**{**R1.__dict__, "bytes_per_value": 1})


def test_layout_names_attention_then_experts():
    assert Layout(8, ep=8).label == "TP8/EP8"
    assert Layout(1, ep=32, dp=32).label == "DP32/EP32"
    assert Layout(2, ep=16, dp=8).label == "TP2xDP8/EP16"
    assert Layout(8).as_dict() == {"tp": 8, "pp": 1}      # dense records unchanged
    with pytest.raises(InputError, match="TP x DP"):
        Layout(2, ep=16, dp=4)
    with pytest.raises(InputError, match="needs expert parallelism"):
        Layout(1, dp=4)


def test_groups_span_machines_or_share_one():
    dep32 = Layout(1, ep=32, dp=32)
    assert (dep32.span(B200), dep32.instances_per_span(B200)) == (4, 32)
    assert dep32.instances(B200, 9) == 64            # two groups of 4 machines, one idle
    assert (dep32.span(NVL72), dep32.instances_per_span(NVL72)) == (1, 64)   # 8 GPUs idle
    assert Layout(1, ep=12, dp=12).problem(B200)     # not a whole number of machines


def test_larger_ep_holds_fewer_experts_per_gpu():
    """Expert weights are divided by EP; the rest is held by every attention rank."""
    per_gpu = {ep: layouts.instance_weight_bytes(FP8_R1, Layout(1, ep=ep, dp=ep))
               for ep in (8, 16, 32, 64)}
    assert per_gpu[8] > per_gpu[16] > per_gpu[32] > per_gpu[64]
    rest = FP8_R1.weight_bytes - FP8_R1.expert_weight_bytes
    assert per_gpu[32] == pytest.approx(rest + FP8_R1.expert_weight_bytes / 32)
    # TEP holds the whole model over its GPUs, as TP does
    assert layouts.instance_weight_bytes(FP8_R1, Layout(8, ep=8)) == pytest.approx(
        FP8_R1.weight_bytes)
    # and a rank's KV room grows with EP
    rooms = [layouts.kv_capacity(FP8_R1, B200, Layout(1, ep=ep, dp=ep), 0.1)
             for ep in (16, 32, 64)]
    assert rooms[0] < rooms[1] < rooms[2]


def test_dense_model_refuses_expert_parallelism():
    llama = CATALOG.models["llama2-70b"]
    assert "no experts" in layouts.fit_problem(llama, B200, Layout(1, ep=8, dp=8), 0.1)
    assert layouts.expert_parallel_candidates(llama, B200) == []


def _tables(gpu="b200_sxm", engine="vllm", dtype="fp8"):
    if (gpu, engine, dtype) not in kernels.available_tables():
        pytest.skip(f"no {gpu}-{engine}-{dtype} kernel tables")
    tables = kernels.load_tables(gpu, engine, dtype)
    if not tables.moe_ep_sizes(FP8_R1):
        pytest.fail("the fp8 tables have no expert-parallel MoE rows for DeepSeek-R1")
    return tables


def test_alltoall_across_machines_pays_the_link():
    """A group spanning machines sends the tokens of other machines' experts over each GPU's
    link: dearer than the same group inside one NVLink domain, and growing with EP."""
    tables = _tables()
    tokens = np.array([256.0, 1024.0, 4096.0])    # the bandwidth regime
    inside = kernels.expert_placement(NVL72, Layout(1, ep=32, dp=32))
    across = kernels.expert_placement(B200, Layout(1, ep=32, dp=32))
    node = kernels.expert_placement(B200, Layout(1, ep=8, dp=8))
    for phase in ("context", "generation"):
        t_node = tables.alltoall(tokens, FP8_R1, node, phase)
        t_in = tables.alltoall(tokens, FP8_R1, inside, phase)
        t_across = tables.alltoall(tokens, FP8_R1, across, phase)
        assert np.all(t_across > t_in) and np.all(t_across > t_node)
    # a larger group across machines sends more of every GPU's tokens over its link
    by_ep = [float(tables.alltoall(512.0, FP8_R1, kernels.expert_placement(
        B200, Layout(1, ep=ep, dp=ep)), "generation")) for ep in (16, 32, 64)]
    assert by_ep[0] < by_ep[1] < by_ep[2]
    # the link model against DeepEP's published low-latency figures (H800, 400 Gb/s IB,
    # 128 tokens per GPU): EP 16 dispatch + combine 118 + 195 us, EP 64 173 + 314 us
    h800 = kernels.ExpertParallel(64, 64, 8, 400e9 / 8, False)
    sent = 128 * 8 * (1 - 8 / 64) * 7168
    model = (2 * kernels.RDMA_LATENCY_S
             + sent * (kernels.DISPATCH_BYTES + kernels.BF16_BYTES)
             / (kernels.RDMA_EFFICIENCY * h800.link_bytes_per_s))
    assert model * 1e6 == pytest.approx(173 + 314, rel=0.05)


def test_moe_layer_falls_with_ep_and_refuses_unmeasured():
    tables = _tables()
    sizes = tables.moe_ep_sizes(FP8_R1)
    assert 8 in sizes and 32 in sizes
    tokens = 8 * 512.0
    assert tables.moe_layer_ep(tokens, FP8_R1, 32) < tables.moe_layer_ep(tokens, FP8_R1, 8)
    with pytest.raises(InputError, match="EP 3 "):
        tables.moe_layer_ep(tokens, FP8_R1, 3)


def test_expert_parallel_curves_price_a_rank():
    _tables()
    perf = kernels.KernelPerformanceModel("vllm", "fp8")
    dep = layouts.curves(perf, FP8_R1, B200, Layout(1, ep=32, dp=32))
    tep = layouts.curves(perf, FP8_R1, B200, Layout(8, ep=8))
    # one-GPU ranks: a decode iteration of a rank is not faster than TEP8's (each rank
    # carries the dense layers alone), and both curves rise with the batch
    assert np.all(np.diff(dep.decode_seconds) >= 0) and np.all(np.diff(tep.decode_seconds) >= 0)
    assert dep.decode_seconds[0] > 0 and tep.prompt_seconds[-1] > 0
    # a performance model without kernel tables says so instead of guessing
    from simcore.perfmodel import default_performance_model
    assert not default_performance_model().prices_expert_parallelism(FP8_R1, B200)
    assert "cannot price expert" in layouts.latency_problem(
        default_performance_model(), FP8_R1, B200, Layout(1, ep=8, dp=8))


def test_both_simulators_agree_on_expert_parallel_instances():
    """A Splitwise design whose prompt pool runs TEP8 and whose token pool runs DEP16 ranks
    across two machines: the fast core and the reference simulator give the same requests'
    times, and every rank of the group serves."""
    from simcore import Cluster, Workload, simulate
    from simcore.kernels import EnginePerformanceModel, KernelPerformanceModel
    from simcore.perfmodel import default_performance_model
    _tables()
    perf = EnginePerformanceModel(KernelPerformanceModel("vllm", "fp8"),
                                  default_performance_model())
    design = CATALOG.design("splitwise-hh")
    design = design.__class__(**{**design.__dict__, "prompt": B200, "token": B200})
    design = design.with_layouts(Layout(8, ep=8), Layout(1, ep=16, dp=16))
    rng = np.random.default_rng(5)
    n = 96
    workload = Workload("w", np.sort(rng.uniform(0, 4, n)), rng.integers(200, 3000, n),
                        rng.integers(20, 200, n))
    cluster = Cluster(design, 1, 2)
    fast = simulate(cluster, workload, FP8_R1, perf, B200)
    ref = simulate(cluster, workload, FP8_R1, perf, B200, engine="reference")
    assert fast.feasible and ref.feasible
    assert len(fast.machine_stats["role"]) == 1 + 16        # one TEP8 instance, 16 ranks
    np.testing.assert_allclose(fast.ttft_s, ref.ttft_s, rtol=1e-9)
    np.testing.assert_allclose(fast.e2e_s, ref.e2e_s, rtol=1e-9)
    assert len(set(fast.token_instance)) > 8               # the ranks share the decodes


# ------------------------------------------------------------------ pinned from the command line
def test_simulate_pins_an_expert_parallel_token_pool(cli):
    _tables()
    run = cli(["simulate", "--design", "b200/b200", "--prompt", "1", "--token", "2",
               "--model", "deepseek-r1", "--dtype", "fp8", "--ep-token", "16", "--rate", "2",
               "--duration", "5", "--json"])
    assert run.returncode == 0, run.stderr
    assert '"ep": 16' in run.stdout or '"ep":16' in run.stdout, run.stdout[-800:]


def test_pinned_expert_parallelism_refusals(cli, bad_input):
    base = ["simulate", "--design", "b200/b200", "--prompt", "1", "--token", "4",
            "--rate", "2", "--duration", "5"]
    bad_input(cli(base + ["--model", "llama2-70b", "--ep-token", "32"]), "no experts")
    two = [a if a != "4" else "2" for a in base]      # a DEP32 group spans 4 machines
    bad_input(cli(two + ["--model", "deepseek-r1", "--dtype", "fp8", "--ep-token", "32"]),
              "--token")
    bad_input(cli(["search", "--model", "deepseek-r1", "--dtype", "fp8", "--ep", "16",
                   "--pp", "2", "--hardware", "b200"]), "--ep", "--pp")
    # simulate refuses them too, naming the option, instead of dropping --pp for the pool
    two_prompt = [a if a != "1" else "2" for a in base]
    bad_input(cli(two_prompt + ["--model", "deepseek-r1", "--dtype", "fp8", "--ep-token", "16",
                                "--pp", "2"]), "--ep-token", "--pp")
    bad_input(cli(base + ["--model", "deepseek-r1", "--dtype", "fp8", "--ep-token", "12",
                          "--tp", "8"]), "--ep-token")
    bad_input(cli(["search", "--model", "deepseek-r1", "--dtype", "fp8", "--ep", "12",
                   "--tp", "8", "--hardware", "b200"]), "--ep")


def test_search_keeps_a_pinned_ep_and_names_it(cli, tmp_path):
    _tables()
    out = tmp_path / "out"
    run = cli(["search", "--model", "deepseek-r1", "--dtype", "fp8",
               "--designs", "b200/b200", "--ep-token", "8", "--tp-prompt", "8", "--ep-prompt",
               "1", "--duration", "10", "--verify-seeds", "2", "--no-cache", "--quiet",
               "--out", out])
    assert run.returncode == 0, run.stderr
    import json
    (design,) = json.loads((out / "report.json").read_text())["designs"]
    layout = design["optimum"]["layout"]
    assert layout["token"]["ep"] == 8 and layout["token"]["label"] == "DP8/EP8"
    assert "ep" not in layout["prompt"] and layout["prompt"]["tp"] == 8
