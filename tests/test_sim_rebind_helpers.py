"""A helper tile function first reached through another module's kernel keeps its rebound
copy for kernels of its own module (issue 37: TileGym's gelu kernel after its geglu kernel
stopped with "Device functions can only be called from device code")."""
import sys
import textwrap

import numpy as np

from spak import sim


def _module(tmp_path, name, text):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))


def test_helper_rebound_for_its_own_modules_kernel(tmp_path, monkeypatch):
    _module(tmp_path, "helpers_i37", """
        import cuda.tile as ct

        def twice(x):
            return ct.exp(x) + ct.exp(x)       # a ct op: the real one refuses host calls

        @ct.kernel
        def own(X, Y, T: ct.Constant[int]):
            ct.store(Y, (ct.bid(0),), twice(ct.load(X, (ct.bid(0),), (T,))))
    """)
    _module(tmp_path, "user_i37", """
        import cuda.tile as ct
        from helpers_i37 import twice

        @ct.kernel
        def other(X, Y, T: ct.Constant[int]):
            ct.store(Y, (ct.bid(0),), twice(ct.load(X, (ct.bid(0),), (T,))) + 1.0)
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    import helpers_i37
    import user_i37
    x = np.random.default_rng().standard_normal(32).astype(np.float32)
    y = np.zeros_like(x)
    sim.launch(user_i37.other, (4,), (x, y, 8))          # reaches `twice` first
    first = y.copy()
    np.testing.assert_allclose(first, 2 * np.exp(x.astype(np.float64)) + 1.0, rtol=1e-6)
    sim.launch(helpers_i37.own, (4,), (x, y, 8))         # then the helper's own module
    np.testing.assert_array_equal(y + np.float32(1.0), first)
    for m in ("helpers_i37", "user_i37"):
        sys.modules.pop(m, None)
