"""The race finder (issue 19): planted races are reported, correct atomic kernels pass."""
import numpy as np
import pytest
import cuda.tile as ct

from spak import sim

C = ct.Constant[int]
MO = ct.MemoryOrder


@ct.kernel
def racy_accumulate(X, ACC, T: C):
    """Planted race: every block read-modify-writes ACC with plain loads and stores."""
    a = ct.load(ACC, (0,), (T,))
    ct.store(ACC, (0,), a + ct.load(X, (ct.bid(0),), (T,)))


@ct.kernel
def atomic_accumulate(X, ACC, T: C):
    ct.atomic_add(ACC, ct.arange(T, dtype=ct.int32), ct.load(X, (ct.bid(0),), (T,)))


@ct.kernel
def locked_accumulate(X, ACC, LOCK, T: C, ORDER: C):
    """The layer-norm backward's pattern: spin on a CAS lock, plain RMW, release."""
    acq = (MO.ACQUIRE, MO.RELAXED)[ORDER]
    rel = (MO.RELEASE, MO.RELAXED)[ORDER]
    x = ct.load(X, (ct.bid(0),), (T,))
    while ct.atomic_cas(LOCK, 0, 0, 1, memory_order=acq) == 1:
        pass
    ct.store(ACC, (0,), ct.load(ACC, (0,), (T,)) + x)
    ct.atomic_xchg(LOCK, 0, 0, memory_order=rel)


def _inputs(rng, nb=6, t=16):
    return rng.integers(-100, 100, nb * t).astype(np.int32), np.zeros(t, np.int32), nb, t


def test_planted_race_is_reported_with_differing_outputs(rng):
    x, acc, nb, t = _inputs(rng)
    rep = sim.find_races(racy_accumulate, (nb,), (x, acc, t), orders=4, seed=3)
    assert not rep.clean
    assert any("race on 'ACC'" in r and "test_sim_races.py" in r for r in rep.races)
    assert any("output 'ACC'" in d and "differ between order" in d for d in rep.differences)
    assert (acc == 0).all()                        # the caller's arrays are left alone


def test_correct_atomic_kernel_passes(rng):
    x, acc, nb, t = _inputs(rng)
    rep = sim.find_races(atomic_accumulate, (nb,), (x, acc, t), orders=4, seed=3)
    assert rep.clean, str(rep)
    sim.launch(atomic_accumulate, (nb,), (x, acc, t), check_unwritten=False)
    np.testing.assert_array_equal(acc, x.reshape(nb, t).sum(0))


def test_lock_with_acquire_release_passes_and_relaxed_lock_is_a_race(rng):
    x, acc, nb, t = _inputs(rng)
    good = sim.find_races(locked_accumulate, (nb,), (x, acc, np.zeros(1, np.int32), t, 0),
                          orders=3, seed=1)
    assert good.clean, str(good)
    bad = sim.find_races(locked_accumulate, (nb,), (x, acc, np.zeros(1, np.int32), t, 1),
                         orders=2, seed=1)
    # the runs agree (the simulator's memory is sequentially consistent), but without
    # acquire/release nothing orders the plain accesses: a race under the GPU's model
    assert bad.races and not bad.differences


@ct.kernel
def last_writer_wins(OUT, T: C):
    ct.store(OUT, (0,), ct.full((T,), ct.bid(0), ct.int32))


def test_lockstep_race_finder_reports_double_writes_and_order_dependence():
    out = np.zeros(8, np.int32)
    rep = sim.find_races(last_writer_wins, (5,), (out, 8), orders=3, seed=0, mode="lockstep")
    assert any("double write" in r for r in rep.races)
    assert rep.differences
    with pytest.raises(sim.SimulationError, match="double write"):
        sim.launch(last_writer_wins, (5,), (out, 8))


def test_find_races_checks_its_arguments():
    with pytest.raises(ValueError, match="orders"):
        sim.find_races(last_writer_wins, (1,), (np.zeros(8, np.int32), 8), orders=0)


def test_launch_mode_and_order_are_checked():
    args = (np.zeros(8, np.int32), 8)
    with pytest.raises(ValueError, match=r"mode must be one of \('auto', 'lockstep', 'cooperative'\), got 'fast'"):
        sim.launch(last_writer_wins, (1,), args, mode="fast")
    with pytest.raises(TypeError, match="order must be None or an int seed, got 1.5"):
        sim.launch(last_writer_wins, (1,), args, order=1.5)
