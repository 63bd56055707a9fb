"""Fast simulator core: the reference semantics (`simcore.refsim`) compiled with numba.

    simulate_fast(workload, machines)    one run, every request's record kept
    run_streamed(machines, chunks, ...)  a long run in bounded memory (simcore.longrun)

The parts, each a module that says what it owns and which reference step it compiles:

    records      REQUEST and MACHINE records, the named tuples, `State` (all of a run's arrays)
    compiler     which build runs (install-time, JIT, plain Python); the JIT cache's key
    latency      iteration times, KV transfer times, the ITL bin
    structures   heaps, intrusive queues, the running decodes' pairing heap
    pools        routing pools: tournament trees with the reference's tie rule
    routing      (3) arrivals routed; the mixed pool
    decode_runs  a machine's decode-only iterations as one event; decode iterations' ends
    chunks       chunked prefill; a prompt's full-budget pieces as one event (chunk runs)
    failures     (2a-c) repairs, failures, lost requests recovered
    resizes      (2r) pools resized mid-run
    steps        (1) iterations end, (2) KV caches arrive, (4) iterations start
    loop         _run(state, until): the instants, the steps in the reference's order
    setup        a State from a cluster's arrays; the entry points Python calls

The state is one record per request and one per machine, so a helper takes a machine and reads
`machine.pending`, as the reference simulator does; the steps that touch several structures take
the one `State` (`_run(state, until)`, `_fail(state, m, now)`). Queues are intrusive linked
lists threaded through the request records, so every queue operation is O(1). No step scans all
machines, so a run costs O(events x log machines): iteration ends come from a heap keyed (time,
machine); step (4) visits only the machines something touched at this instant, by index; routing
reads the winner of tournament trees, one per pool, so the tie rule is the reference's.

Two transformations the reference does not have make most iterations free of events: decode
runs (`decode_runs`) and chunk runs (`chunks`); each has its own equivalence test against the
reference (tests/test_fast_runs.py).

Requests are numbered in arrival order and request g lives in slot g % slots of the record
array: one slot per request in a plain run; in a long run (`run_streamed`) fewer, each reused
once its request has finished and been handed over, the loop pausing before the first arrival
not yet filled in. Every order between requests (the KV-arrival and lost-request heaps) is by
number, never by slot, so a streamed run is the same run.
"""
from .compiler import CORE, CORE_SOURCES, ENTRY_POINTS, installed_builds, source_digest
from .records import MACHINE, REQUEST, State
from .setup import TooManyInFlight, new_state, run_streamed, simulate_fast


__all__ = ["CORE", "CORE_SOURCES", "ENTRY_POINTS", "MACHINE", "REQUEST", "State",
           "TooManyInFlight", "installed_builds", "new_state", "run_streamed", "simulate_fast",
           "source_digest"]
