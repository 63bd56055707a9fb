"""Serving-benchmark result files at the input edge: `vllm bench serve` and GuideLLM (issue 37).

Each reader turns a file into `BenchRun`s, one per measured run (a `vllm bench serve` result,
a GuideLLM benchmark), validated once: a bad file raises a one-line `InputError` naming the file
and the field. Everything later (`provisioner.servefit`) takes the records, never the files.

Schemas, read from the tools' own code (not guessed):

- `vllm bench serve --save-result` (vllm/benchmarks/serve.py, github.com/vllm-project/vllm at
  commit 009e6d4a): one JSON object per run (`--append-result` appends one per line): backend,
  model_id, num_prompts, request_rate (a number, or "inf"), burstiness, max_concurrency (null
  without a limit), duration (s), completed, failed, total_input_tokens, total_output_tokens,
  request_throughput, mean/median/std/pNN of ttft_ms, tpot_ms (excluding the first token),
  itl_ms and e2el_ms; `latencies` (s, per request) always; with `--save-detailed` per request
  input_lens, output_lens, ttfts (s), itls (lists of s), errors ("" for a success).
- GuideLLM's report (guidellm 0.8.1, guidellm/benchmark/schemas/report.py
  GenerativeBenchmarksReport; `guidellm benchmark --output-path x.json|x.yaml`): metadata
  (version 2), config, benchmarks: each a GenerativeBenchmark with config.strategy (type_
  synchronous, concurrent with streams, throughput with max_concurrency, constant or poisson
  with rate), duration (s), metrics (StatusDistributionSummary per metric: successful /
  incomplete / errored / total DistributionSummary with mean, median, percentiles, count) of
  time_to_first_token_ms, inter_token_latency_ms (excluding the first token: vLLM's TPOT),
  time_per_output_token_ms (GuideLLM's includes the first token: not used),
  request_concurrency, prompt_token_count, output_token_count, request_latency (s),
  requests_per_second; and requests.successful, sampled per-request records with
  prompt_tokens, output_tokens, time_to_first_token_ms, inter_token_latency_ms,
  request_latency.

Concurrency of a run: a closed loop's (vLLM --max-concurrency with an infinite rate; GuideLLM
synchronous 1, concurrent its streams); otherwise Little's law from the measured throughput
and latencies, completed / duration x mean end-to-end latency.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hardware_catalog import InputError, read_text

FORMATS = ("vllm-bench-serve", "guidellm")


@dataclass(frozen=True)
class BenchRun:
    """One measured serving run, in seconds and tokens (means over its successful requests)."""
    file: str
    label: str              # where in the file: "run 1", "benchmark 3 (concurrent@16)"
    format: str             # FORMATS
    concurrency: float      # requests in the system, mean
    concurrency_from: str   # "closed loop" or "Little's law"
    input_tokens: float     # mean prompt length
    output_tokens: float    # mean output length
    ttft_s: float           # mean time to first token
    tpot_s: float           # mean time per output token after the first
    requests: int           # successful requests the means are over
    rate_rps: float | None  # measured completions per second
    per_request: bool       # the means come from per-request records
    model_id: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def read_bench_files(paths: list[str | Path]) -> list[BenchRun]:
    """Every run of every file (in order); each file's format from its content."""
    runs: list[BenchRun] = []
    for path in paths:
        runs.extend(read_bench_file(path))
    return runs


def bench_format(path: str | Path) -> str | None:
    """'vllm-bench-serve', 'guidellm' or None (not a benchmark result: a profile CSV, say),
    from the content of a JSON or YAML file; the CSV path is never read here."""
    if Path(path).suffix.lower() == ".csv":
        return None
    try:
        documents = _documents(Path(path))
    except InputError:
        return None
    return _format_of(documents[0])


def read_bench_file(path: str | Path) -> list[BenchRun]:
    source = str(path)
    documents = _documents(Path(path))
    kind = _format_of(documents[0])
    if kind is None:
        raise InputError("not a serving-benchmark result: expected a `vllm bench serve "
                         "--save-result` JSON (keys completed, duration, mean_ttft_ms) or a "
                         "GuideLLM report (key benchmarks)", source=source)
    if kind == "guidellm":
        if len(documents) != 1:
            raise InputError("a GuideLLM report is one document, found several", source=source)
        return _guidellm_runs(documents[0], source)
    runs = []
    for i, document in enumerate(documents):
        if _format_of(document) != "vllm-bench-serve":
            raise InputError(f"line {i + 1} is not a `vllm bench serve` result", source=source)
        runs.append(_vllm_run(document, source, f"run {i + 1}" if len(documents) > 1 else "run"))
    return runs


# ---------------------------------------------------------------------------------- parsing
def _documents(path: Path) -> list[Any]:
    """The file's JSON object, its JSON lines (--append-result), or its YAML document."""
    text = read_text(path)
    source = str(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        from hardware_catalog import read_yaml
        return [read_yaml(path)]
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as err:
        if err.msg != "Extra data":
            raise InputError(f"broken JSON at line {err.lineno}: {err.msg}; fix the file",
                             source=source) from None
    documents = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                documents.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(f"broken JSON at line {number}: {err.msg}; fix the file",
                                 source=source) from None
    return documents


def _format_of(document: Any) -> str | None:
    if not isinstance(document, dict):
        return None
    if "benchmarks" in document:
        return "guidellm"
    if "completed" in document and "duration" in document and (
            "mean_ttft_ms" in document or "ttfts" in document):
        return "vllm-bench-serve"
    return None


def _number(mapping: dict, key: str, source: str, where: str = "", *, positive: bool = False,
            optional: bool = False) -> float | None:
    field = f"{where}{key}"
    if key not in mapping or mapping[key] is None:
        if optional:
            return None
        raise InputError("missing", source=source, field=field)
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"must be a finite number, got {value!r}"[:100], source=source,
                         field=field)
    if value < 0 or (positive and value == 0):
        raise InputError(f"must be {'> 0' if positive else '>= 0'}, got {value!r}",
                         source=source, field=field)
    return float(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _vllm_run(d: dict, source: str, label: str) -> BenchRun:
    completed = _number(d, "completed", source, positive=True)
    duration = _number(d, "duration", source, positive=True)
    rate = d.get("request_rate", "inf")
    if not (rate == "inf" or (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                              and rate > 0)):
        raise InputError(f"must be a positive number or \"inf\", got {rate!r}"[:100],
                         source=source, field="request_rate")
    limit = _number(d, "max_concurrency", source, positive=True, optional=True)
    detailed = all(isinstance(d.get(k), list) for k in ("input_lens", "output_lens", "ttfts",
                                                        "itls"))
    if detailed:
        isl, osl, ttft, tpot, e2e = _vllm_requests(d, source)
        requests = len(ttft)
        isl, osl, ttft, tpot, e2e = (_mean(v) for v in (isl, osl, ttft, tpot, e2e))
    else:
        requests = int(completed)
        isl = _number(d, "total_input_tokens", source, positive=True) / completed
        osl = _number(d, "total_output_tokens", source, positive=True) / completed
        ttft = _number(d, "mean_ttft_ms", source, positive=True) / 1e3
        tpot = _number(d, "mean_tpot_ms", source, positive=True) / 1e3
        e2e_ms = _number(d, "mean_e2el_ms", source, positive=True, optional=True)
        e2e = e2e_ms / 1e3 if e2e_ms is not None else ttft + max(osl - 1.0, 0.0) * tpot
    if osl < 2:
        raise InputError(f"mean output length {osl:.3g} tokens: TPOT needs outputs of 2 tokens "
                         "or more", source=source, field="total_output_tokens")
    throughput = completed / duration
    if rate == "inf" and limit is not None:
        concurrency, how = limit, "closed loop"
    else:
        concurrency, how = throughput * e2e, "Little's law"
        if limit is not None:
            concurrency = min(concurrency, limit)
    model_id = d.get("model_id")
    return BenchRun(source, label, "vllm-bench-serve", concurrency, how, isl, osl, ttft, tpot,
                    requests, throughput, detailed,
                    model_id if isinstance(model_id, str) else None)


def _vllm_requests(d: dict, source: str):
    """Per-request (isl, osl, ttft, tpot, e2e) of the successful requests of a --save-detailed
    result (errors "" or absent; TPOT = the request's inter-token gaps' mean, as vLLM's)."""
    n = len(d["ttfts"])
    for key in ("input_lens", "output_lens", "itls") + (("errors",) if "errors" in d else ()):
        if not isinstance(d[key], list) or len(d[key]) != n:
            raise InputError(f"must be a list of {n} entries (one per request, as ttfts)",
                             source=source, field=key)
    errors = d.get("errors") or [""] * n
    out: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for i in range(n):
        if errors[i]:
            continue
        gaps = d["itls"][i]
        if not isinstance(gaps, list):
            raise InputError(f"request {i + 1}: must be a list of seconds", source=source,
                             field="itls")
        where = f"request {i + 1} "
        values = {"input_lens": d["input_lens"][i], "output_lens": d["output_lens"][i],
                  "ttfts": d["ttfts"][i]}
        for key, value in values.items():
            _number({key: value}, key, source, where, positive=key != "output_lens")
        for gap in gaps:
            _number({"itls": gap}, "itls", source, where)
        if values["output_lens"] < 2 or not gaps:
            continue
        tpot = sum(gaps) / len(gaps)
        for got, key in ((values["input_lens"], 0), (values["output_lens"], 1),
                         (values["ttfts"], 2), (tpot, 3), (values["ttfts"] + sum(gaps), 4)):
            out[key].append(float(got))
    if not out[0]:
        raise InputError("no successful request with 2 or more output tokens", source=source,
                         field="ttfts")
    return out


def _strategy(benchmark: dict, source: str, where: str) -> tuple[str, float | None]:
    config = benchmark.get("config")
    strategy = config.get("strategy") if isinstance(config, dict) else None
    if not isinstance(strategy, dict) or not isinstance(strategy.get("type_"), str):
        raise InputError("missing (a mapping with type_)", source=source,
                         field=f"{where}config.strategy")
    kind = strategy["type_"]
    field = f"{where}config.strategy."
    if kind == "synchronous":
        return kind, 1.0
    if kind == "concurrent":
        return f"concurrent@{int(_number(strategy, 'streams', source, field, positive=True))}", \
            _number(strategy, "streams", source, field, positive=True)
    if kind in ("constant", "poisson"):
        return f"{kind}@{_number(strategy, 'rate', source, field, positive=True):g}", None
    if kind == "throughput":
        return kind, None
    raise InputError(f"strategy {kind!r} is not a serving load this fit reads (synchronous, "
                     "concurrent, throughput, constant, poisson)", source=source,
                     field=f"{field}type_")


def _summary_mean(metrics: dict, key: str, source: str, where: str) -> tuple[float, int]:
    """The successful requests' mean of a StatusDistributionSummary metric, and its count."""
    block = metrics.get(key)
    successful = block.get("successful") if isinstance(block, dict) else None
    field = f"{where}metrics.{key}.successful"
    if not isinstance(successful, dict):
        raise InputError("missing (a distribution summary)", source=source, field=field)
    mean = _number(successful, "mean", source, field + ".")
    count = successful.get("count", 0)
    return mean, int(count) if isinstance(count, (int, float)) else 0


def _guidellm_runs(document: dict, source: str) -> list[BenchRun]:
    benchmarks = document["benchmarks"]
    if not isinstance(benchmarks, list) or not benchmarks:
        raise InputError("must be a non-empty list of benchmarks", source=source,
                         field="benchmarks")
    runs = []
    for i, benchmark in enumerate(benchmarks):
        where = f"benchmarks[{i}]."
        if not isinstance(benchmark, dict):
            raise InputError("must be a mapping", source=source, field=where[:-1])
        kind, closed = _strategy(benchmark, source, where)
        metrics = benchmark.get("metrics")
        if not isinstance(metrics, dict):
            raise InputError("missing (a mapping)", source=source, field=f"{where}metrics")
        records = _guidellm_requests(benchmark, source, where)
        if records:
            isl, osl, ttft, tpot, e2e = (_mean(v) for v in records)
            requests = len(records[0])
        else:
            isl, requests = _summary_mean(metrics, "prompt_token_count", source, where)
            osl = _summary_mean(metrics, "output_token_count", source, where)[0]
            ttft = _summary_mean(metrics, "time_to_first_token_ms", source, where)[0] / 1e3
            tpot = _summary_mean(metrics, "inter_token_latency_ms", source, where)[0] / 1e3
            e2e = _summary_mean(metrics, "request_latency", source, where)[0]
        if osl < 2 or tpot <= 0:
            raise InputError("needs outputs of 2 tokens or more (an inter-token latency)",
                             source=source, field=f"{where}metrics.output_token_count")
        duration = _number(benchmark, "duration", source, where, positive=True, optional=True)
        totals = metrics.get("request_totals")
        completed = (totals.get("successful") if isinstance(totals, dict) else None)
        rate = (completed / duration if isinstance(completed, (int, float)) and duration
                and completed > 0 else None)
        if rate is None:
            try:
                rate = _summary_mean(metrics, "requests_per_second", source, where)[0]
            except InputError:
                rate = None
        if closed is not None:
            concurrency, how = closed, "closed loop"
        elif rate:
            concurrency, how = rate * e2e, "Little's law"
        else:
            raise InputError("a rate or throughput benchmark needs its duration and "
                             "request_totals.successful (or requests_per_second) for its "
                             "concurrency", source=source, field=f"{where}duration")
        runs.append(BenchRun(source, f"benchmark {i + 1} ({kind})", "guidellm", concurrency,
                             how, isl, osl, ttft, tpot, requests, rate, bool(records),
                             _guidellm_model(document)))
    return runs


def _guidellm_requests(benchmark: dict, source: str, where: str):
    """Per-request (isl, osl, ttft, itl, e2e) of requests.successful, when recorded."""
    requests = benchmark.get("requests")
    successful = requests.get("successful") if isinstance(requests, dict) else None
    if not successful:
        return None
    if not isinstance(successful, list):
        raise InputError("must be a list of request records", source=source,
                         field=f"{where}requests.successful")
    out: tuple[list, list, list, list, list] = ([], [], [], [], [])
    keys = ("prompt_tokens", "output_tokens", "time_to_first_token_ms",
            "inter_token_latency_ms", "request_latency")
    for j, record in enumerate(successful):
        field = f"{where}requests.successful[{j}]."
        if not isinstance(record, dict):
            raise InputError("must be a mapping", source=source, field=field[:-1])
        if record.get("inter_token_latency_ms") is None:
            continue     # one output token: no gap
        values = [_number(record, k, source, field, positive=k != "output_tokens")
                  for k in keys]
        out[0].append(values[0])
        out[1].append(values[1])
        out[2].append(values[2] / 1e3)
        out[3].append(values[3] / 1e3)
        out[4].append(values[4])
    return out if out[0] else None


def _guidellm_model(document: dict) -> str | None:
    """The served model's name where the report's config holds one (config.spec.backend)."""
    node: Any = document
    for key in ("config", "spec", "backend", "model"):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, str) else None


# ------------------------------------------------------------------ a result file as a workload
@dataclass(frozen=True)
class BenchLengths:
    """The per-request prompt and output lengths of a result file's successful requests (every
    run or benchmark in it), for `--workload FILE`: sizes to draw from, not arrivals."""
    file: str
    format: str
    prompt_tokens: list[int]
    output_tokens: list[int]
    runs: int
    # each request's send time (s), where the file records them: vLLM's start_times, one run
    start_times: list[float] | None = None


def read_bench_lengths(path: str | Path) -> BenchLengths:
    """Every successful request's (input, output) tokens: `vllm bench serve --save-detailed`'s
    input_lens / output_lens (errors "" or absent), GuideLLM's requests.successful
    prompt_tokens / output_tokens; and their send times where the file records them (vLLM's
    start_times, in a file of one run; GuideLLM's sampled records are not all requests). A file without per-request lengths is refused in one line
    (its means alone would make every request the mean request)."""
    source = str(path)
    documents = _documents(Path(path))
    kind = _format_of(documents[0])
    if kind is None:
        raise InputError("not a serving-benchmark result: expected a `vllm bench serve "
                         "--save-result` JSON or a GuideLLM report", source=source)
    prompt: list[int] = []
    output: list[int] = []
    times: list[float] = []
    if kind == "guidellm":
        benchmarks = documents[0].get("benchmarks")
        if not isinstance(benchmarks, list) or not benchmarks:
            raise InputError("must be a non-empty list of benchmarks", source=source,
                             field="benchmarks")
        for i, benchmark in enumerate(benchmarks):
            where = f"benchmarks[{i}].requests.successful"
            requests = benchmark.get("requests") if isinstance(benchmark, dict) else None
            successful = requests.get("successful") if isinstance(requests, dict) else None
            if not successful:
                continue
            if not isinstance(successful, list):
                raise InputError("must be a list of request records", source=source, field=where)
            for j, record in enumerate(successful):
                if not isinstance(record, dict):
                    raise InputError("must be a mapping", source=source, field=f"{where}[{j}]")
                prompt.append(_length(record, "prompt_tokens", source, f"{where}[{j}]."))
                output.append(_length(record, "output_tokens", source, f"{where}[{j}]."))
        runs = len(benchmarks)
    else:
        for number, d in enumerate(documents, 1):
            if _format_of(d) != "vllm-bench-serve":
                raise InputError(f"line {number} is not a `vllm bench serve` result",
                                 source=source)
            if not (isinstance(d.get("input_lens"), list) and isinstance(d.get("output_lens"),
                                                                          list)):
                continue
            n = len(d["input_lens"])
            errors = d.get("errors") if isinstance(d.get("errors"), list) else [""] * n
            starts = d.get("start_times") if len(documents) == 1 else None
            if starts is not None and (not isinstance(starts, list) or len(starts) != n):
                raise InputError(f"must be a list of {n} entries (one per request, as "
                                 "input_lens)", source=source, field="start_times")
            if len(d["output_lens"]) != n or len(errors) != n:
                raise InputError(f"must be a list of {n} entries (one per request, as "
                                 "input_lens)", source=source, field="output_lens")
            for i in range(n):
                if errors[i]:
                    continue
                where = f"request {i + 1} "
                prompt.append(_length({"input_lens": d["input_lens"][i]}, "input_lens", source,
                                      where))
                output.append(_length({"output_lens": d["output_lens"][i]}, "output_lens",
                                      source, where))
                if starts is not None:
                    times.append(_number({"start_times": starts[i]}, "start_times", source,
                                         where))
        runs = len(documents)
    if not prompt:
        what = ("requests.successful records (prompt_tokens, output_tokens)"
                if kind == "guidellm" else
                "input_lens / output_lens (run `vllm bench serve --save-result --save-detailed`)")
        raise InputError(f"no per-request lengths to use as a workload: the file holds no "
                         f"{what}", source=source)
    return BenchLengths(source, kind, prompt, output, runs,
                        times if times and len(times) == len(prompt) else None)


def _length(mapping: dict, key: str, source: str, where: str) -> int:
    value = _number(mapping, key, source, where, positive=True)
    if value != int(value):
        raise InputError(f"must be a whole number of tokens, got {value!r}", source=source,
                         field=f"{where}{key}")
    return int(value)
