"""The expert cache against the optimum: a routing trace recorded while a MoE model runs (Model.record_routing),
Belady's loads for the same requests and slots (runtime/weights/routing.py), and the cache's loads beside them."""

from __future__ import annotations

import numpy as np
import pytest

import synth_gguf
from synth_gguf import expert_bytes
from superggml import Model
from superggml.errors import SuperggmlError
from superggml.runtime.memory.arrays import tensor_array
from superggml.runtime.weights.routing import optimal_loads


def test_belady_evicts_what_comes_back_farthest():
    # one layer, requests of one expert each: 1 2 3 1 2 4 1 2; with 3 slots Belady loads 1 2 3, and 4 in place of 3
    # (never used again), where LRU would evict 1 and load it again
    reqs = [(0, (e,)) for e in (1, 2, 3, 1, 2, 4, 1, 2)]
    assert optimal_loads(reqs, 3) == {0: 4}
    assert optimal_loads(reqs, 2) == {0: 6}  # 1 2, 3 (evicts 2), 1, 2 (evicts 3), 4 (evicts 1), 1 (evicts 4), 2
    assert optimal_loads(reqs, 4) == {0: 4}  # only the compulsory loads


def test_belady_keeps_a_requests_experts_together_and_counts_per_layer():
    reqs = [(0, (1, 2, 1, 2)), (1, (1,)), (0, (3, 1)), (1, (1, 2))]  # layer 0 asks {1,2}, then {1,3}
    assert optimal_loads(reqs, 3) == {0: 3, 1: 2}
    with pytest.raises(ValueError, match="2 slots cannot hold"):
        optimal_loads([(0, (1, 2, 3))], 2)


@pytest.mark.parametrize("lookahead", [False, True])
def test_a_recorded_trace_holds_the_caches_loads_against_the_optimum(tmp_path, smollm2_path, lookahead):
    """4 layers x 8 experts, a cache of a quarter of them: every request is in the trace, the per-layer loads
    add up to the cache's own counters, and none is below Belady's for the same slots."""
    path = synth_gguf.synth(
        tmp_path / "m.gguf",
        synth_gguf.vocab_fields(smollm2_path),
        **{**synth_gguf.VARIANTS["qwen3moe-8x2-q8_0"], "n_layer": 4},
    )
    prompt = [int(x) for x in np.random.default_rng(4).integers(0, 49152, 24)]
    with Model(
        path, ctx_size=128, n_threads=2, n_batch=8, expert_cache=expert_bytes(path) // 4, expert_lookahead=lookahead
    ) as m:
        with pytest.raises(ValueError, match="do not page"):
            Model(smollm2_path, ctx_size=64).record_routing()
        m.eval(prompt)
        assert m.routing_trace() is None and m.record_routing() is None
        st0 = m.stats()
        for t in (5, 6, 7, 8, 9, 10):
            m.eval([t])
        st1 = m.stats()
        trace = m.record_routing(False)
        assert trace is not None and m.routing_trace() is None
    k = 2
    assert {il for il, _ in trace.requests} == {0, 1, 2, 3}
    assert [len(ids) for _, ids in trace.requests] == [k] * 4 * 6  # each decoded token, each layer
    loaded = sum(st1[c] - st0[c] for c in ("expert_misses", "expert_prefetches"))
    assert sum(trace.loads.values()) == loaded
    t = trace.table()
    assert t["n_slots"] == trace.n_slots and t["total"]["loads"] == loaded
    assert t["total"]["loads"] >= t["total"]["optimal"]  # a bound in total (per layer, the optimum may trade)
    assert t["total"]["optimal"] >= len({(il, e) for il, ids in trace.requests for e in ids})  # compulsory
    assert trace.table(n_slots=4 * 8)["total"]["optimal"] == len({(il, e) for il, ids in trace.requests for e in ids})


def test_a_request_never_evicts_its_own_held_experts(smollm2_path):
    """Two slots holding experts 0 (older) and 1; a request for 2 and 0 loads 2 alone, in place of 1: the held
    expert 0 is pinned before the load of 2 takes a slot (it was evicted for it, then loaded again)."""
    from superggml import native

    c = native.ExpertCache(smollm2_path, n_slots=2, slot_size=4096, n_workers=1)
    c.set_layer(0, 4, [(0, 4096, 4096, 0)])
    for ids in ([0], [1]):
        c.release(c.map(0, np.array(ids, np.int32))[1])
    before = c.stats()["expert_misses"]
    c.release(c.map(0, np.array([2, 0], np.int32))[1])
    assert c.stats()["expert_misses"] - before == 1
    assert c.holds(0, 0) and c.holds(0, 2) and not c.holds(0, 1)


def one_layer_cache(path, n_slots, n_expert=16, **kw):
    from superggml import native

    c = native.ExpertCache(path, n_slots=n_slots, slot_size=4096, n_workers=1, **kw)
    c.set_layer(0, n_expert, [(0, 4096, 4096, 0)])
    return c


def use(c, *ids):
    c.release(c.map(0, np.array(ids, np.int32))[1])


def test_a_cycle_longer_than_the_cache_keeps_a_fixed_part_of_itself(smollm2_path):
    """Experts 0..4 over and over with 3 slots: least-recently-used would miss all 30 requests; counting uses,
    and evicting the latest among equals, keeps two of them and loads within 1.2x of Belady."""
    c = one_layer_cache(smollm2_path, 3)
    cycle = [0, 1, 2, 3, 4] * 6
    for e in cycle:
        use(c, e)
    loads = c.stats()["expert_misses"]
    best = optimal_loads([(0, (e,)) for e in cycle], 3)[0]
    assert loads <= 1.2 * best < 30, (loads, best)


def test_an_expert_used_often_outlives_a_run_of_experts_used_once(smollm2_path):
    c = one_layer_cache(smollm2_path, 2)
    for _ in range(4):
        use(c, 0)
    for e in range(1, 12):
        use(c, e)
    assert c.holds(0, 0)


def test_an_old_favourite_that_stops_coming_is_evicted_in_the_end(smollm2_path):
    """Expert 0 used 8 times in a row, then a pair (1, 2) in turn with 2 slots: 0's forecast (the next tick) goes
    overdue, it is pushed out as far as it has been away, and the pair takes both slots."""
    c = one_layer_cache(smollm2_path, 2)
    for _ in range(8):
        use(c, 0)
    for _ in range(8):
        use(c, 1)
        use(c, 2)
    assert c.holds(0, 1) and c.holds(0, 2) and not c.holds(0, 0)


def test_a_period_in_the_intervals_is_what_the_eviction_expects(smollm2_path):
    """Each expert's next use is forecast from its own intervals. Expert 1 comes back in a 2-then-6 rhythm (ticks
    1, 3, 9, ... 19: next at 25, where the mean interval says 22.6) and expert 2 every 4 ticks (last at 20: next at
    24); expert 9, in every request, fills the third slot. At tick 21 a new expert evicts 1, due last."""
    c = one_layer_cache(smollm2_path, 3)
    rhythm, every4 = {1, 3, 9, 11, 17, 19}, {4, 8, 12, 16, 20}
    for t in range(1, 21):
        use(c, 9, *([1] if t in rhythm else []), *([2] if t in every4 else []))
    assert all(c.holds(0, e) for e in (1, 2, 9))
    use(c, 9, 10)
    assert c.holds(0, 2) and c.holds(0, 10) and not c.holds(0, 1)


def test_a_prefetch_never_evicts_an_expert_used_more_or_another_prefetch(smollm2_path):
    """A guess (prefetch) takes a free slot, or evicts an expert expected back no sooner than itself (one never
    used is expected after one used once); it never evicts an earlier guess not yet used. A miss may evict
    either."""
    c = one_layer_cache(smollm2_path, 3)
    use(c, 0)
    assert c.prefetch(0, [5, 6]) == 2  # the free slots
    assert c.prefetch(0, [7]) == 0  # 0 was used, 7 never; 5 and 6 wait for their use
    assert all(c.holds(0, e) for e in (0, 5, 6))
    use(c, 5)  # a hit; 6, guessed for this layer and not routed to, loses its protection
    assert c.prefetch(0, [7]) == 1 and c.holds(0, 7) and not c.holds(0, 6)
    assert c.stats()["expert_prefetch_hits"] == 1


def test_slots_set_aside_are_emptied_and_given_back(smollm2_path):
    """set_active(2) of 4 slots: the experts past slot 2 are evicted and no load takes their slots, so a request
    for 3 experts fails until set_active(4) gives them back."""
    c = one_layer_cache(smollm2_path, 4)
    for e in range(4):
        use(c, e)
    c.set_active(2)
    st = c.stats()
    assert st["expert_slots_active"] == 2 and st["expert_slots_used"] == 2 and c.n_active == 2
    assert sum(c.holds(0, e) for e in range(4)) == 2
    for e in range(4, 8):
        use(c, e)
        assert c.stats()["expert_slots_used"] == 2
    with pytest.raises(SuperggmlError, match="2 slots, fewer than"):
        use(c, 1, 2, 3)
    c.set_active(4)
    use(c, 1, 2, 3)
    assert all(c.holds(0, e) for e in (1, 2, 3))
    with pytest.raises(SuperggmlError, match="out of range"):
        c.set_active(5)


def test_zero_slots_are_never_loaded_and_stay_zero(smollm2_path):
    """Zero slots (the positions a split computes off the device) sit past the loadable slots: the views span them,
    no map() or prefetch() ever returns or fills one, and they read back as zeros while the others cycle."""
    from superggml import native

    c = one_layer_cache(smollm2_path, 2, zero_slots=3)
    assert c.n_slots == 2 and c.zero_slots == 3
    ctx = native.Context(max_tensors=2)
    short, view = ctx.new_tensor(native.GGMLType.F32, [1024, 1, 2]), ctx.new_tensor(native.GGMLType.F32, [1024, 1, 5])
    with pytest.raises(Exception, match="n_slots \\+ zero_slots"):
        c.bind_view(short, 0)
    c.bind_view(view, 0)
    for ids in ([0, 1], [2, 3], [4], [5, 6], [7]):
        c.prefetch(0, [9, 10])
        slots, pinned = c.map(0, np.array(ids, np.int32))
        assert set(slots.tolist()) <= {0, 1} and len(set(slots.tolist())) == len(ids)
        c.release(pinned)
    a = tensor_array(view).reshape(5, -1)
    assert a[:2].any() and not a[2:].any()
