"""Atomics (issue 19): each op against a sequential numpy reference, dtype and memory-order
rules, and the cooperative execution model (progress, deadlock report)."""
import numpy as np
import pytest
import cuda.tile as ct

from spak import sim
from spak.sim import coop

C = ct.Constant[int]
MO, MS = ct.MemoryOrder, ct.MemoryScope
OPS = ["add", "xchg", "max", "min", "and", "or", "xor"]


@ct.kernel
def rmw(A, IDX, U, OLD, N: C, OP: C):
    i, u = ct.load(IDX, (0,), (N,)), ct.load(U, (0,), (N,))
    fn = (ct.atomic_add, ct.atomic_xchg, ct.atomic_max, ct.atomic_min, ct.atomic_and,
          ct.atomic_or, ct.atomic_xor)[OP]
    ct.store(OLD, (0,), fn(A, i, u))


def _sequential(op, a, idx, u):
    a, old = a.copy(), np.zeros_like(u)
    f = {"add": lambda x, y: x + y, "xchg": lambda x, y: y, "max": max, "min": min,
         "and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y}[op]
    for k, (i, v) in enumerate(zip(idx, u)):
        old[k] = a[i]
        a[i] = f(a[i], v)
    return a, old


@pytest.mark.parametrize("op", OPS)
def test_each_rmw_op_matches_element_by_element_semantics(rng, op):
    n = 32
    a = rng.integers(-1000, 1000, 16).astype(np.int32)
    idx = rng.integers(0, 16, n).astype(np.int32)          # repeated indices compose
    u = rng.integers(-1000, 1000, n).astype(np.int32)
    ref_a, ref_old = _sequential(op, a, idx, u)
    old = np.zeros(n, np.int32)
    rep = sim.launch(rmw, (1,), (a, idx, u, old, n, OPS.index(op)), check_unwritten=False)
    assert rep.mode == "cooperative"                       # picked because it names atomics
    np.testing.assert_array_equal(a, ref_a)
    np.testing.assert_array_equal(old, ref_old)


@ct.kernel
def histogram(X, H, T: C):
    ct.atomic_add(H, ct.load(X, (ct.bid(0),), (T,)), 1)


def test_histogram_over_many_blocks_is_exact(rng):
    x = rng.integers(0, 64, 16 * 32).astype(np.int32)
    h = np.zeros(64, np.int32)
    sim.launch(histogram, (32,), (x, h, 16), check_unwritten=False)
    np.testing.assert_array_equal(h, np.bincount(x, minlength=64))


@ct.kernel
def cas(A, E, D, OLD, N: C):
    i = ct.arange(N, dtype=ct.int32)
    ct.store(OLD, (0,), ct.atomic_cas(A, i, ct.load(E, (0,), (N,)), ct.load(D, (0,), (N,))))


def test_cas_swaps_only_matching_elements(rng):
    n = 16
    a = rng.integers(0, 3, n).astype(np.int64)
    e, d = rng.integers(0, 3, n).astype(np.int64), rng.integers(10, 99, n).astype(np.int64)
    a0, old = a.copy(), np.zeros(n, np.int64)
    sim.launch(cas, (1,), (a, e, d, old, n), check_unwritten=False)
    np.testing.assert_array_equal(old, a0)
    np.testing.assert_array_equal(a, np.where(a0 == e, d, a0))


@ct.kernel
def fadd(A, U, N: C):
    ct.atomic_add(A, ct.arange(N, dtype=ct.int32), ct.load(U, (0,), (N,)))


def test_float32_atomic_add_rounds_and_flushes_subnormals(rng):
    n = 16
    a, u = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a[0], u[0] = 0.0, np.float32(2.0 ** -140)             # subnormal update: flushed
    ref = a + u
    ref[0] = 0.0
    sim.launch(fadd, (1,), (a, u, n), check_unwritten=False)
    np.testing.assert_array_equal(a, ref)


@ct.kernel
def bad_order(A, N: C):
    ct.atomic_add(A, ct.arange(N, dtype=ct.int32), 1, memory_order=MO.WEAK)


@ct.kernel
def float_max(A, N: C):
    ct.atomic_max(A, ct.arange(N, dtype=ct.int32), 1.0)


def test_cutiles_atomic_rules_are_enforced():
    with pytest.raises(sim.SimTypeError, match="memory_order"):
        sim.launch(bad_order, (1,), (np.zeros(4, np.int32), 4))
    with pytest.raises(sim.SimTypeError, match="unsupported array dtype float32"):
        sim.launch(float_max, (1,), (np.zeros(4, np.float32), 4))


def test_atomics_refuse_the_lockstep_executor():
    with pytest.raises(sim.SimulationError, match="mode='cooperative'"):
        sim.launch(histogram, (2,), (np.zeros(8, np.int32), np.zeros(4, np.int32), 4),
                   mode="lockstep")


@ct.kernel
def views_atomic(A, B, N: C):
    tv = A.tiled_view((N,))
    tv.atomic_store_add((0,), ct.full((N,), 3, ct.int32))
    old = B.get_raw_memory().atomic_xchg_offset(ct.arange(N, dtype=ct.int32), 5)
    ct.atomic_add(A, ct.arange(N, dtype=ct.int32), old)


def test_tiled_view_and_raw_memory_atomics(rng):
    a, b = rng.integers(0, 9, 8).astype(np.int32), rng.integers(0, 9, 8).astype(np.int32)
    a0, b0 = a.copy(), b.copy()
    sim.launch(views_atomic, (1,), (a, b, 8), check_unwritten=False)
    np.testing.assert_array_equal(a, a0 + 3 + b0)
    assert (b == 5).all()


@ct.kernel
def chained_prefix(X, PREFIX, FLAG, TICKET, T: C):
    """Each block adds its sum to its predecessor's prefix: waits on the predecessor's flag
    (acquire), publishes its own (release); the ticket gives ids in start order."""
    vb = ct.atomic_add(TICKET, 0, 1)
    s = ct.sum(ct.load(X, (vb,), (T,)))
    prev = ct.zeros((), ct.int32)
    if vb > 0:
        while ct.load(FLAG, (vb - 1,), (), memory_order=MO.ACQUIRE, memory_scope=MS.DEVICE) == 0:
            pass
        prev = ct.load(PREFIX, (vb - 1,), ())
    ct.store(PREFIX, (vb,), prev + s)
    ct.store(FLAG, (vb,), 1, memory_order=MO.RELEASE, memory_scope=MS.DEVICE)


def test_blocks_make_progress_through_acquire_release_chains(rng):
    nb, t, spins = 12, 8, []
    x = rng.integers(-50, 50, nb * t).astype(np.int32)
    for order, resident in ((None, 3), (7, 2)):
        prefix, flag, ticket = np.zeros(nb, np.int32), np.zeros(nb, np.int32), np.zeros(1, np.int32)
        rep = sim.launch(chained_prefix, (nb,), (x, prefix, flag, ticket, t), order=order,
                         resident=resident, check_unwritten=False)
        assert rep.clean, rep.findings
        np.testing.assert_array_equal(prefix, np.cumsum(x.reshape(nb, t).sum(1)))
        spins.append(any("spin-wait on an acquire ct.load of 'FLAG'" in f for f in rep.oob))
    # some block found its predecessor's flag unset and read it again: the finding that
    # this poll may never see the store on a GPU (tileiras 13.4 -> LDGSTS.E, an H200 hang)
    assert any(spins)


@ct.kernel
def chained_prefix_atomic_poll(X, PREFIX, FLAG, TICKET, T: C):
    """chained_prefix, the flag polled with an atomic add of 0 (the safe form)."""
    vb = ct.atomic_add(TICKET, 0, 1)
    s = ct.sum(ct.load(X, (vb,), (T,)))
    prev = ct.zeros((), ct.int32)
    if vb > 0:
        while ct.atomic_add(FLAG, vb - 1, 0, memory_order=MO.ACQUIRE) == 0:
            pass
        prev = ct.load(PREFIX, (vb - 1,), ())
    ct.store(PREFIX, (vb,), prev + s)
    ct.store(FLAG, (vb,), 1, memory_order=MO.RELEASE, memory_scope=MS.DEVICE)


def test_an_atomic_poll_is_not_reported_as_a_spin_on_a_plain_load(rng):
    nb, t = 12, 8
    x = rng.integers(-50, 50, nb * t).astype(np.int32)
    prefix, flag, ticket = np.zeros(nb, np.int32), np.zeros(nb, np.int32), np.zeros(1, np.int32)
    rep = sim.launch(chained_prefix_atomic_poll, (nb,), (x, prefix, flag, ticket, t),
                     resident=3, check_unwritten=False)
    assert rep.clean, rep.findings
    assert not [f for f in rep.oob if "spin-wait" in f], rep.oob
    np.testing.assert_array_equal(prefix, np.cumsum(x.reshape(nb, t).sum(1)))


@ct.kernel
def waits_forever(FLAG, OUT):
    while ct.atomic_add(FLAG, 0, 0) == 0:
        pass
    ct.store(OUT, (ct.bid(0),), 1)


def test_a_spin_nobody_ends_is_reported_as_deadlock(monkeypatch):
    monkeypatch.setattr(coop, "IDLE_LIMIT", 300)
    with pytest.raises(sim.SimulationError, match=r"deadlock.*block \(0, 0, 0\) at .*test_sim_atomics"):
        sim.launch(waits_forever, (2,), (np.zeros(1, np.int32), np.zeros(2, np.int32)))
