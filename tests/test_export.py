"""`provision export` (issue 40): every target's files for a colocated and a disaggregated
design of small search reports (BLOOM-176B, the default model, and Llama-3.1-70B), checked
against the Kubernetes object models of the `kubernetes` Python client and against the
engines' documented argument names (tests/data/engine_args.json names each version and its
source); a load-curve report's plan as a schedule with one replica patch per change; bad input
is one line, exit 2, nothing written."""
from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

kubernetes = pytest.importorskip("kubernetes", reason="the test extra: pip install kubernetes")
from kubernetes import client as k8s   # noqa: E402

ARGS = json.loads((Path(__file__).parent / "data" / "engine_args.json").read_text())
TARGETS = ("vllm", "sglang", "trtllm", "dynamo", "llm-d", "k8s")
TINY = ["--duration", "1", "--rate", "5",
        "--verify-seeds", "1", "--no-cache", "--jobs", "1", "--quiet"]
MOE = ["--model", "qwen3-30b-a3b", "--tp", "8", "--ep", "8", "--kv-dtype", "fp8"]
CURVE = "time_s,rate_rps\n0,2\n600,10\n1200,2\n"
CURVE_SEARCH = ["--window", "600", "--designs", "splitwise-hh", "--model", "llama2-70b",
                "--duration", "10", "--jobs", "1", "--no-cache", "--quiet"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory, cli) -> dict[str, Path]:
    """Small search reports: the default model and Llama-3.1-70B, each with a disaggregated
    and a chunked colocated design; and a load-curve report."""
    folder = tmp_path_factory.mktemp("reports")
    made = {}
    for name, model in (("bloom", ["--designs", "splitwise-hh,sarathi-h100,splitwise-hhcap"]),
                        ("llama70b", ["--designs", "splitwise-hh,sarathi-h100", "--model",
                                      "llama-3.1-70b"])):
        outcome = cli(["search", *TINY, *model, "--out", folder / name])
        assert outcome.code == 0, outcome.stderr
        made[name] = folder / name / "report.json"
    outcome = cli(["search", *TINY, "--designs", "splitwise-hh", *MOE,
                   "--out", folder / "moe"])
    assert outcome.code == 0, outcome.stderr
    made["moe"] = folder / "moe" / "report.json"
    for engine in ("sglang", "trtllm"):   # the engine the search's latencies are of
        outcome = cli(["search", *TINY, "--designs", "splitwise-hh", "--model",
                       "llama-3.1-70b", "--engine", engine, "--out", folder / engine])
        assert outcome.code == 0, outcome.stderr
        made[engine] = folder / engine / "report.json"
    for engine in ("vllm", "sglang"):   # Llama-3.1-405B at TP8 x PP2: servers over 2 machines
        outcome = cli(["search", *TINY[4:], "--duration", "5", "--rate", "1", "--designs",
                       "splitwise-hh", "--model", "llama-3.1-405b", "--tp", "8", "--pp", "2",
                       "--engine", engine, "--out", folder / f"pp-{engine}"])
        assert outcome.code == 0, outcome.stderr
        made[f"pp-{engine}"] = folder / f"pp-{engine}" / "report.json"
    (folder / "curve.csv").write_text(CURVE)
    outcome = cli(["search", "--load-curve", folder / "curve.csv", *CURVE_SEARCH,
                   "--out", folder / "curve"])
    assert outcome.code == 0, outcome.stderr
    made["curve"] = folder / "curve" / "report.json"
    return made


def _export(cli, report: Path, target: str, out: Path, *extra) -> dict[str, str]:
    outcome = cli(["export", report, "--target", target, "--out", out, *extra])
    assert outcome.code == 0, outcome.stderr
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def _optimum(report: Path, design: str) -> tuple[dict, dict]:
    document = json.loads(report.read_text())
    entry = next(e for e in document["designs"] if e["design"] == design)
    return document, entry


# ------------------------------------------------------------- Kubernetes object validation
_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object,
               "datetime": str, "date": str}


def _check_model(value, type_name: str, path: str) -> None:
    """`value` fits the client's model `type_name`: every key is one of the model's JSON
    attribute names, recursively (the client's own deserializer silently drops unknown keys)."""
    if type_name.startswith(("list[", "List[")):
        assert isinstance(value, list), path
        for k, item in enumerate(value):
            _check_model(item, type_name[5:-1], f"{path}[{k}]")
        return
    if type_name.startswith(("dict(", "Dict[")):
        inner = type_name[5:-1].split(", ", 1)[1]
        assert isinstance(value, dict), path
        for key, item in value.items():
            _check_model(item, inner, f"{path}.{key}")
        return
    if type_name in _PRIMITIVES:
        assert isinstance(value, _PRIMITIVES[type_name]), (path, type_name, value)
        return
    model = getattr(k8s, type_name)
    assert isinstance(value, dict), (path, type_name)
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        assert key in by_json, f"{path}.{key}: not a field of {type_name}"
        _check_model(item, model.openapi_types[by_json[key]], f"{path}.{key}")


class _Response:   # what older clients' ApiClient.deserialize reads
    def __init__(self, document: dict):
        self.data = json.dumps(document)


def _deserialize(document: dict, kind: str):
    api = k8s.ApiClient()
    try:   # kubernetes >= 35: deserialize(response_text, response_type, content_type)
        return api.deserialize(json.dumps(document), kind, "application/json")
    except TypeError:
        return api.deserialize(_Response(document), kind)


def k8s_object(document: dict):
    """The document checked against its kind's model and deserialized by the client."""
    kind = {"Deployment": "V1Deployment", "Service": "V1Service",
            "ConfigMap": "V1ConfigMap"}[document["kind"]]
    _check_model(document, kind, document["kind"])
    return _deserialize(document, kind)


# ---------------------------------------------------------------------- engine flag checks
def _flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--")]


def check_flags(args: list[str], *engines: str) -> dict[str, str]:
    """Every flag is a documented argument of `engines` (names and, where listed, choices);
    returns flag -> value (flags without a value: "")."""
    known = set().union(*(ARGS[e]["args"] for e in engines))
    choices = {k: v for e in engines for k, v in ARGS[e].get("choices", {}).items()}
    values = {}
    for k, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        assert arg in known, f"{arg}: not a documented {' / '.join(engines)} argument"
        value = args[k + 1] if k + 1 < len(args) and not args[k + 1].startswith("--") else ""
        if arg in choices:
            assert value in choices[arg], (arg, value)
        values[arg] = value
    assert len(values) == len(_flags(args)), "a flag given twice"
    return values


def _script_args(text: str, command: list[str]) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("exec "))
    assert line.endswith(' "$@"'), line   # a server's own --port etc. go last
    words = shlex.split(line[:-len(' "$@"')])[1:]
    assert words[:len(command)] == command, words
    return words[len(command):]


def _servers(pool_layout: dict, gpus: int, machines: int) -> int:
    group = pool_layout.get("ep", 1) if pool_layout.get("ep", 1) > 1 else (
        pool_layout["tp"] * pool_layout["pp"])
    return machines * (gpus // group) if group <= gpus else machines // (group // gpus)


CONTEXT = {"bloom": 2048, "llama70b": 131072}   # models.yaml context_tokens
CASES = [(report, design) for report in ("bloom", "llama70b")
         for design in ("splitwise-hh", "sarathi-h100")]


@pytest.mark.parametrize("report,design", CASES, ids=[f"{r}-{d}" for r, d in CASES])
@pytest.mark.parametrize("target", TARGETS)
def test_every_target_writes_the_assumed_settings(cli, reports, tmp_path, target, report,
                                                  design):
    path = reports[report]
    document, entry = _optimum(path, design)
    files = _export(cli, path, target, tmp_path / "out", "--design", design)
    optimum, layout = entry["optimum"], entry["optimum"]["layout"]
    gpus = document["inputs"]["catalog"]["machines"]["dgx-h100"]["gpus"]
    pd = "prompt_machines" in optimum
    roles = ("prompt", "token") if pd else ("pool",)
    model = {"bloom": "bigscience/bloom", "llama70b": "meta-llama/Llama-3.1-70B"}[report]
    servers = {role: _servers(layout[role], gpus,
                              optimum[f"{role}_machines" if pd else "machines"])
               for role in roles}
    chunk = entry.get("chunk_tokens")
    assert "README.txt" in files and design in files["README.txt"]
    assert "GPU memory fraction 0.90" in files["README.txt"]
    for name in files:
        if name.endswith(".yaml"):
            yaml.safe_load_all(files[name])   # every YAML file parses
    if target in ("vllm", "sglang", "trtllm"):
        command = {"vllm": ["vllm", "serve"], "sglang": ["python3", "-m", "sglang.launch_server"],
                   "trtllm": ["trtllm-serve"]}[target]
        for role in roles:
            args = _script_args(files[f"{role}.sh"], command)
            flags = check_flags(args, target)
            tp = layout[role]["tp"]
            kv, context = layout[role]["kv_tokens_per_instance"], CONTEXT[report]
            max_len = {"vllm": "--max-model-len", "sglang": "--context-length",
                       "trtllm": "--max_seq_len"}[target]
            # a server whose KV room is below the model's context is capped to it
            assert flags.get(max_len) == (str(kv) if kv < context else None), (max_len, kv)
            if target == "vllm":
                assert args[0] == model
                assert flags["--tensor-parallel-size"] == str(tp)
                assert flags["--gpu-memory-utilization"] == "0.90"
                if chunk:
                    assert flags["--max-num-batched-tokens"] == str(chunk)
                    assert "--enable-chunked-prefill" in flags
                else:
                    assert "--no-enable-chunked-prefill" in flags
                if pd:
                    wiring = json.loads(flags["--kv-transfer-config"])
                    assert wiring == {"kv_connector": "NixlConnector", "kv_role":
                                      "kv_producer" if role == "prompt" else "kv_consumer"}
                else:
                    assert "--kv-transfer-config" not in flags
            elif target == "sglang":
                assert flags["--model-path"] == model and flags["--tp-size"] == str(tp)
                assert flags["--mem-fraction-static"] == "0.90"
                assert flags["--chunked-prefill-size"] == (str(chunk) if chunk else "-1")
                if pd:
                    assert flags["--disaggregation-mode"] == ("prefill" if role == "prompt"
                                                              else "decode")
                    assert flags["--disaggregation-transfer-backend"] in ("nixl", "mooncake")
                else:
                    assert "--disaggregation-mode" not in flags
            else:
                assert args[0] == model and flags["--tp_size"] == str(tp)
                options = yaml.safe_load(files[f"{role}-config.yaml"])
                assert set(options) <= set(ARGS["trtllm"]["llm_api_options"])
                assert set(options["kv_cache_config"]) <= set(ARGS["trtllm"]["kv_cache_config"])
                assert options["enable_chunked_prefill"] is bool(chunk)
                # TensorRT-LLM's fraction is of the memory left after the weights: the
                # simulation's KV room over it, KV / (KV + reserve x HBM), rounded down
                fraction = options["kv_cache_config"]["free_gpu_memory_fraction"]
                assert flags["--kv_cache_free_gpu_memory_fraction"] == f"{fraction:.2f}"
                model_echo = document["inputs"]["model"]
                hbm = (tp * layout[role]["pp"] * 2**30
                       * document["inputs"]["catalog"]["machines"]["dgx-h100"]["hbm_gib"])
                kv_room = kv * model_echo["kv_bytes_per_token"] * max(1, tp /
                                                                      model_echo["kv_heads"])
                share = kv_room / (kv_room + 0.1 * hbm)
                assert fraction <= share < fraction + 0.011, (fraction, share)
                assert ("cache_transceiver_config" in options) is pd
        if target == "trtllm":
            assert ("disagg-config.yaml" in files) is pd
            if pd:
                config = yaml.safe_load(files["disagg-config.yaml"])
                assert set(config) <= set(ARGS["trtllm"]["disaggregated"])
                assert config["context_servers"]["num_instances"] == servers["prompt"]
                assert config["generation_servers"]["num_instances"] == servers["token"]
                assert len(config["generation_servers"]["urls"]) == servers["token"]
    elif target == "k8s":
        objects = list(yaml.safe_load_all(files["deployments.yaml"]))
        deployments = {o["metadata"]["name"]: k8s_object(o) for o in objects
                       if o["kind"] == "Deployment"}
        services = [k8s_object(o) for o in objects if o["kind"] == "Service"]
        assert len(deployments) == len(roles) == len(services)
        for role in roles:
            deployment = deployments[f"{design}-{role}"]
            assert isinstance(deployment, k8s.V1Deployment)
            assert deployment.spec.replicas == servers[role]
            container = deployment.spec.template.spec.containers[0]
            per_server = layout[role]["tp"] * layout[role]["pp"]
            assert container.resources.limits["nvidia.com/gpu"] == str(min(per_server, gpus))
            check_flags(container.args, "vllm")   # the search's engine: vLLM
            assert ("--kv-transfer-config" in container.args) is pd
            selector = deployment.spec.selector.match_labels
            assert all(deployment.spec.template.metadata.labels[k] == v
                       for k, v in selector.items())
        for service in services:
            assert service.spec.ports[0].port == 8000
    elif target == "dynamo":
        graph = yaml.safe_load(files["dynamo-graph.yaml"])
        assert (graph["apiVersion"], graph["kind"]) == ("nvidia.com/v1alpha1",
                                                        "DynamoGraphDeployment")
        services = graph["spec"]["services"]
        assert "Frontend" in services
        workers = {"prompt": "VllmPrefillWorker", "token": "VllmDecodeWorker",
                   "pool": "VllmWorker"}
        assert set(services) == {"Frontend", *(workers[r] for r in roles)}
        for role in roles:
            worker = services[workers[role]]
            assert worker["replicas"] == servers[role]
            args = worker["extraPodSpec"]["mainContainer"]["args"]
            check_flags(args, "vllm", "dynamo.vllm")
            assert ("--is-prefill-worker" in args) is (role == "prompt")
            if pd:
                assert worker["subComponentType"] == ("prefill" if role == "prompt"
                                                      else "decode")
    else:
        values = yaml.safe_load(files["llm-d-values.yaml"])
        assert values["modelArtifacts"]["uri"] == f"hf://{model}"
        assert values["prefill"]["create"] is pd and values["decode"]["create"] is True
        for role, key in (("prompt", "prefill"), ("token", "decode"), ("pool", "decode")):
            if role not in roles:
                continue
            section = values[key]
            assert section["replicas"] == servers[role]
            assert section["parallelism"]["tensor"] == layout[role]["tp"]
            flags = check_flags(section["containers"][0]["args"], "vllm")
            if pd:
                assert json.loads(flags["--kv-transfer-config"])["kv_connector"] == \
                    "NixlConnector"


def test_the_default_design_is_the_reports_best_and_export_is_deterministic(cli, reports,
                                                                           tmp_path):
    document = json.loads(reports["llama70b"].read_text())
    best = document["summary"]["best_design"]
    first = _export(cli, reports["llama70b"], "k8s", tmp_path / "a")
    again = _export(cli, reports["llama70b"], "k8s", tmp_path / "b")
    assert first == again
    names = [o["metadata"]["name"] for o in yaml.safe_load_all(first["deployments.yaml"])]
    assert all(name.startswith(f"{best}-") for name in names)


@pytest.mark.parametrize("target", TARGETS)
def test_a_load_curve_plan_is_exported_as_a_schedule(cli, reports, tmp_path, target):
    document = json.loads(reports["curve"].read_text())
    curve = document["load_curve"]
    plan = curve["designs"]["splitwise-hh"]["plan"]
    files = _export(cli, reports["curve"], target, tmp_path / "out")
    rows = list(csv.DictReader(files["schedule.csv"].splitlines()))
    # replaying the rows gives every window's pools
    state: dict[str, int] = {}
    starts = [w["start_s"] for w in curve["windows"]]
    for k, (start, pools) in enumerate(zip(starts, plan)):
        for row in rows:
            if float(row["time_s"]) == start:
                state[row["pool"]] = int(row["machines"])
                grew = k > 0 and int(row["machines"]) > plan[k - 1][("prompt", "token").index(
                    row["pool"])]
                lead = curve["rules"]["scale_up_s"] if grew else 0
                assert float(row["apply_at_s"]) == max(0.0, start - lead)
        assert [state["prompt"], state["token"]] == pools
    patches = sorted(name for name in files if name.startswith("patch-"))
    if target != "k8s":
        assert not patches
        return
    full = {o["metadata"]["name"]: o for o in yaml.safe_load_all(files["deployments.yaml"])
            if o["kind"] == "Deployment"}
    deployments = {name: o["spec"]["replicas"] for name, o in full.items()}
    changes = 0
    for row in rows:
        name = f"splitwise-hh-{row['pool']}"
        if deployments[name] != int(row["replicas"]):
            changes += 1
            deployments[name] = int(row["replicas"])
    # the Deployments start at the first window: a patch per later change of a pool's size
    assert len(patches) == changes == sum(float(r["time_s"]) > 0 for r in rows) > 0
    for name in patches:
        patch = yaml.safe_load(files[name])
        _check_model(patch, "V1Deployment", name)   # a partial Deployment: only its fields
        # merged into its Deployment (a merge patch), the result is a valid Deployment
        target_name = patch["metadata"]["name"]
        merged = {**full[target_name], "spec": {**full[target_name]["spec"], **patch["spec"]}}
        assert k8s_object(merged).spec.replicas == patch["spec"]["replicas"]
        assert re.fullmatch(r"patch-\d{3}-(prompt|token)\.yaml", name)
        assert "kubectl patch deployment" in files[name]


@pytest.mark.parametrize("target", ("vllm", "sglang", "trtllm", "k8s"))
def test_expert_parallel_and_fp8_kv_reach_the_flags(cli, reports, tmp_path, target):
    """Qwen3-30B-A3B at TP8/EP8 with an fp8 KV cache: the expert-parallel group and the KV
    data type are in every server's flags."""
    _, entry = _optimum(reports["moe"], "splitwise-hh")
    assert entry["optimum"]["layout"]["token"]["ep"] == 8
    files = _export(cli, reports["moe"], target, tmp_path / "out")
    if target == "k8s":
        args = [k8s_object(o).spec.template.spec.containers[0].args
                for o in yaml.safe_load_all(files["deployments.yaml"]) if o["kind"] ==
                "Deployment"]
        engine = "vllm"
    else:
        command = {"vllm": ["vllm", "serve"], "sglang": ["python3", "-m",
                                                         "sglang.launch_server"],
                   "trtllm": ["trtllm-serve"]}[target]
        args = [_script_args(files[f"{role}.sh"], command) for role in ("prompt", "token")]
        engine = target
    for server in args:
        flags = check_flags(server, engine)
        if engine == "vllm":
            assert "--enable-expert-parallel" in flags and flags["--kv-cache-dtype"] == "fp8"
            assert flags["--tensor-parallel-size"] == "8"
        elif engine == "sglang":
            assert flags["--ep-size"] == "8" and flags["--kv-cache-dtype"] == "fp8_e4m3"
        else:
            assert flags["--ep_size"] == "8"
    if target == "trtllm":
        for role in ("prompt", "token"):
            assert yaml.safe_load(files[f"{role}-config.yaml"])["kv_cache_config"]["dtype"] == \
                "fp8"


def test_dynamo_and_k8s_use_the_engine_the_search_priced(cli, reports, tmp_path):
    """A search on SGLang's kernels exports SGLang workers to Dynamo and SGLang servers to
    Kubernetes; on TensorRT-LLM's, trtllm-serve servers with their options in a ConfigMap."""
    graph = yaml.safe_load(_export(cli, reports["sglang"], "dynamo", tmp_path / "d")[
        "dynamo-graph.yaml"])
    workers = graph["spec"]["services"]
    assert set(workers) == {"Frontend", "SglangPrefillWorker", "SglangDecodeWorker"}
    for name, mode in (("SglangPrefillWorker", "prefill"), ("SglangDecodeWorker", "decode")):
        container = workers[name]["extraPodSpec"]["mainContainer"]
        assert container["command"] == ["python3", "-m", "dynamo.sglang"]
        assert check_flags(container["args"], "sglang")["--disaggregation-mode"] == mode
    for engine, command in (("sglang", ["python3", "-m", "sglang.launch_server"]),
                            ("trtllm", ["trtllm-serve"])):
        files = _export(cli, reports[engine], "k8s", tmp_path / engine)
        objects = [(o["kind"], k8s_object(o)) for o in yaml.safe_load_all(
            files["deployments.yaml"])]
        kinds = [kind for kind, _ in objects]
        assert kinds.count("Deployment") == kinds.count("Service") == 2
        assert kinds.count("ConfigMap") == (2 if engine == "trtllm" else 0)
        for kind, obj in objects:
            if kind == "ConfigMap":
                (text,) = obj.data.values()
                assert set(yaml.safe_load(text)) <= set(ARGS["trtllm"]["llm_api_options"])
            if kind != "Deployment":
                continue
            pod = obj.spec.template.spec
            container = pod.containers[0]
            assert container.command == command
            check_flags(container.args, engine)
            if engine == "trtllm":   # the options file is mounted where the flag points
                options = container.args[container.args.index("--extra_llm_api_options") + 1]
                mount = container.volume_mounts[0]
                assert options.startswith(mount.mount_path + "/")
                assert pod.volumes[0].config_map.name == f"{obj.metadata.name}-config"
        assert "front end" in files["README.txt"]


def test_a_power_capped_pool_says_so(cli, reports, tmp_path):
    """splitwise-hhcap's token machines run power-capped in the simulation: no engine flag
    sets that, so the script and README.txt say it."""
    files = _export(cli, reports["bloom"], "vllm", tmp_path / "out", "--design",
                    "splitwise-hhcap")
    assert "dgx-h100-cap is power-capped (70% of rated machine power)" in files["token.sh"]
    assert "power-capped" not in files["prompt.sh"]
    assert "token pool: dgx-h100-cap runs power-capped" in files["README.txt"]


@pytest.mark.parametrize("engine", ("vllm", "sglang"))
def test_servers_over_machines_run_as_leader_worker_sets(cli, reports, tmp_path, engine):
    """A TP8 x PP2 server spans two 8-GPU machines: k8s runs each pool as a LeaderWorkerSet
    of groups of 2 pods (vLLM: a Ray cluster per group, as vLLM's multi-node example; SGLang:
    each pod a rank of --nnodes), its pod templates valid V1PodTemplateSpecs, and a Service on
    the leaders."""
    report = reports[f"pp-{engine}"]
    _, entry = _optimum(report, "splitwise-hh")
    files = _export(cli, report, "k8s", tmp_path / "out")
    objects = list(yaml.safe_load_all(files["deployments.yaml"]))
    assert [o["kind"] for o in objects] == ["LeaderWorkerSet", "Service"] * 2
    for lws, service in zip(objects[::2], objects[1::2]):
        role = lws["metadata"]["labels"]["app.kubernetes.io/component"]
        assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        spec = lws["spec"]
        assert spec["replicas"] == entry["optimum"][f"{role}_machines"] // 2
        group = spec["leaderWorkerTemplate"]
        assert group["size"] == 2
        leader, worker = (k8s_object_template(group[key], key)
                          for key in ("leaderTemplate", "workerTemplate"))
        k8s_object(service)
        assert service["spec"]["selector"] == group["leaderTemplate"]["metadata"]["labels"]
        main, other = leader.spec.containers[0], worker.spec.containers[0]
        assert main.resources.limits["nvidia.com/gpu"] == "8"
        if engine == "vllm":
            assert main.command == other.command == ["sh", "-c"]
            ray, serve = main.args[0].split("; exec vllm serve ", 1)
            assert "leader --ray_cluster_size=$(LWS_GROUP_SIZE)" in ray
            assert "worker --ray_address=$(LWS_LEADER_ADDRESS)" in other.args[0]
            flags = check_flags(shlex.split(serve), "vllm")
            assert flags["--pipeline-parallel-size"] == "2"
        else:
            assert main.args == other.args
            flags = check_flags(main.args, "sglang")
            assert flags["--nnodes"] == "$(LWS_GROUP_SIZE)" and flags["--pp-size"] == "2"
            assert flags["--node-rank"] == "$(LWS_WORKER_INDEX)"
    assert "LeaderWorkerSet" in files["README.txt"]


def k8s_object_template(document: dict, where: str):
    _check_model(document, "V1PodTemplateSpec", where)
    return _deserialize(document, "V1PodTemplateSpec")


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_and_writes_nothing(cli, bad_input, reports, tmp_path):
    out = tmp_path / "out"
    not_a_report = tmp_path / "other.json"
    not_a_report.write_text('{"hello": 1}')
    bad_input(cli(["export", not_a_report, "--target", "vllm", "--out", out]),
              "other.json", "not a provision search report")
    bad_input(cli(["export", reports["bloom"], "--target", "vllm", "--design", "nope",
                   "--out", out]), "unknown design 'nope'", "splitwise-hh")
    bad_input(cli(["export", reports["bloom"], "--target", "ray", "--out", out]),
              "unknown target 'ray'", "k8s")
    bad_input(cli(["export", tmp_path / "missing.json", "--target", "k8s", "--out", out]),
              "missing.json")
    document = json.loads(reports["bloom"].read_text())
    entry = next(e for e in document["designs"] if e["design"] == "splitwise-hh")
    broken = tmp_path / "broken.json"
    del document["inputs"]["catalog"]
    broken.write_text(json.dumps(document))
    bad_input(cli(["export", broken, "--target", "vllm", "--design", "splitwise-hh",
                   "--out", out]), "broken.json", "malformed report", "catalog")
    del entry["optimum"]["layout"]["prompt"]["tp"]   # what `check` validates too
    broken.write_text(json.dumps(document))
    bad_input(cli(["export", broken, "--target", "vllm", "--design", "splitwise-hh",
                   "--out", out]), "broken.json", "layout.prompt.tp", "missing")
    entry["optimum"] = None
    entry["status"], entry["reason"] = "infeasible", "every pool size missed an SLO"
    broken.write_text(json.dumps(document))
    bad_input(cli(["export", broken, "--target", "k8s", "--design", "splitwise-hh",
                   "--out", out]), "splitwise-hh", "no optimum", "infeasible")
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    bad_input(cli(["export", reports["bloom"], "--target", "k8s", "--out", out]),
              str(out), "--force")
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_force_replaces_an_earlier_export(cli, reports, tmp_path):
    out = tmp_path / "out"
    _export(cli, reports["bloom"], "vllm", out, "--design", "splitwise-hh")
    (out / "mine.txt").write_text("keep")
    files = _export(cli, reports["bloom"], "vllm", out, "--design", "sarathi-h100", "--force")
    assert sorted(files) == ["README.txt", "mine.txt", "pool.sh"]


def test_the_docs_example_prints_what_export_writes(cli, tmp_path):
    """docs/export.md (the README's "Deploy the answer" until issue 40): its search, then its
    export's prompt.sh line, as shown."""
    section = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text()
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    search = next(line for line in block.splitlines() if line.startswith("$ provision search"))
    args = shlex.split(search)[2:]
    out = tmp_path / "llama70b"
    args[args.index("--out") + 1] = str(out)
    outcome = cli([*args, "--jobs", "1", "--no-cache", "--quiet"])
    assert outcome.code == 0, outcome.stderr
    best = next(line for line in block.splitlines() if line.startswith("Best: "))
    assert best in outcome.stdout
    files = _export(cli, out / "report.json", "vllm", tmp_path / "deploy-vllm")
    shown = block.split("$ tail -1 deploy-vllm/prompt.sh\n", 1)[1].splitlines()[0]
    assert files["prompt.sh"].splitlines()[-1] == shown
    pools = block.split("$ sed -n 7,10p deploy-vllm/README.txt\n", 1)[1].splitlines()[:4]
    assert files["README.txt"].splitlines()[6:10] == pools


# ------------------------------------------------------------------ speculative decoding
@pytest.fixture(scope="module")
def spec_reports(tmp_path_factory, cli) -> dict[str, Path]:
    """Small Llama-3.1-70B searches (Splitwise-HH) under each speculative-decoding method."""
    folder = tmp_path_factory.mktemp("spec")
    made = {}
    for method in ("mtp", "eagle", "draft:llama-3.1-8b"):
        name = method.split(":")[0]
        outcome = cli(["search", *TINY, "--designs", "splitwise-hh", "--model", "llama-3.1-70b",
                       "--spec-decode", method, "--spec-tokens", "2", "--out", folder / name])
        assert outcome.code == 0, outcome.stderr
        made[name] = folder / name / "report.json"
    return made


SPEC_CASES = [("mtp", "vllm"), ("mtp", "sglang"), ("mtp", "trtllm"), ("eagle", "vllm"),
              ("eagle", "sglang"), ("eagle", "trtllm"), ("draft", "vllm")]


@pytest.mark.parametrize("method,target", SPEC_CASES, ids=[f"{m}-{t}" for m, t in SPEC_CASES])
def test_speculative_decoding_reaches_the_decoding_pools_flags(cli, spec_reports, tmp_path,
                                                               method, target):
    """The token pool's server speculates as the simulation did (k = 2 drafted tokens, the
    method's drafter), in documented arguments of the named engine version; the prompt pool,
    a pure prefill, does not."""
    head = "yuhuili/EAGLE-LLaMA3.1-Instruct-70B"
    extra = ["--draft-model", head] if method == "eagle" else []
    files = _export(cli, spec_reports[method], target, tmp_path / "out", *extra)
    drafter = {"mtp": None, "eagle": head, "draft": "meta-llama/Llama-3.1-8B"}[method]
    assert "speculative decoding on the pools that decode: 2 drafted" in files["README.txt"]
    command = {"vllm": ["vllm", "serve"], "sglang": ["python3", "-m", "sglang.launch_server"],
               "trtllm": ["trtllm-serve"]}[target]
    prompt = check_flags(_script_args(files["prompt.sh"], command), target)
    token = check_flags(_script_args(files["token.sh"], command), target)
    if target == "vllm":
        assert "--speculative-config" not in prompt
        config = json.loads(token["--speculative-config"])
        documented = ARGS["vllm"]["speculative_config"]
        assert set(config) <= set(documented["keys"])
        assert config["method"] in documented["method"]
        assert config == {"method": {"mtp": "mtp", "eagle": "eagle", "draft": "draft_model"}[method],
                          **({"model": drafter} if drafter else {}),
                          "num_speculative_tokens": 2}
    elif target == "sglang":
        assert "--speculative-algorithm" not in prompt
        assert token["--speculative-algorithm"] == "EAGLE"
        assert (token["--speculative-num-steps"], token["--speculative-eagle-topk"],
                token["--speculative-num-draft-tokens"]) == ("2", "1", "3")
        assert token.get("--speculative-draft-model-path") == drafter
    else:
        assert "speculative_config" not in yaml.safe_load(files["prompt-config.yaml"])
        config = yaml.safe_load(files["token-config.yaml"])["speculative_config"]
        kind = "MTP" if method == "mtp" else "Eagle"
        assert config["decoding_type"] == kind
        assert set(config) <= set(ARGS["trtllm"]["speculative_config"][kind])
        assert config.get("num_nextn_predict_layers", config.get("max_draft_len")) == 2
        assert config.get("speculative_model_dir") == drafter


def test_speculative_export_input_is_checked_in_one_line(cli, bad_input, spec_reports,
                                                         reports, tmp_path):
    out = tmp_path / "out"
    bad_input(cli(["export", spec_reports["eagle"], "--target", "vllm", "--out", out]),
              "EAGLE", "--draft-model")
    bad_input(cli(["export", spec_reports["draft"], "--target", "sglang", "--out", out]),
              "draft-model speculative decoding", "--target vllm")
    bad_input(cli(["export", spec_reports["mtp"], "--target", "vllm", "--draft-model", "x",
                   "--out", out]), "--draft-model", "MTP")
    bad_input(cli(["export", reports["bloom"], "--target", "vllm", "--draft-model", "x",
                   "--out", out]), "--draft-model", "--spec-decode")
    assert not out.exists()
