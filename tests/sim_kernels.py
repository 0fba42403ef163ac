"""Small cuTile kernels the simulator tests run (each exercises one semantic or one fault)."""
import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def copy2d(X, Y, TM: ConstInt, TN: ConstInt):
    i, j = ct.bid(0), ct.bid(1)
    t = ct.load(X, (i, j), (TM, TN), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (i, j), t)


@ct.kernel
def copy2d_transposed(X, Y, TM: ConstInt, TN: ConstInt):
    """Y[j-tile, i-tile] = X^T via order=(1, 0)."""
    i, j = ct.bid(0), ct.bid(1)
    t = ct.load(X, (j, i), (TN, TM), order=(1, 0), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (j, i), t, order=(1, 0))


@ct.kernel
def load_with_padding(X, Y, T: ConstInt, MODE: ct.Constant[int]):
    """Loads the last, partial tile of X with a chosen padding into a full-size Y."""
    i = ct.bid(0)
    if MODE == 0:
        t = ct.load(X, (i,), (T,), padding_mode=ct.PaddingMode.ZERO)
    elif MODE == 1:
        t = ct.load(X, (i,), (T,), padding_mode=ct.PaddingMode.NEG_INF)
    else:
        t = ct.load(X, (i,), (T,))          # undetermined padding: the simulator poisons it
    ct.store(Y, (i,), t)


@ct.kernel
def planted_oob_store(X, Y, T: ConstInt):
    """Block 1 stores one tile past the end of Y: entirely out of bounds."""
    i = ct.bid(0)
    t = ct.load(X, (i,), (T,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (i + 4 * (i == 1),), t)


@ct.kernel
def planted_unwritten(X, Y, T: ConstInt):
    """Block 2 forgets to store its tile."""
    i = ct.bid(0)
    t = ct.load(X, (i,), (T,), padding_mode=ct.PaddingMode.ZERO)
    if i != 2:
        ct.store(Y, (i,), t)


@ct.kernel
def planted_double_write(X, Y, T: ConstInt):
    """Blocks 0 and 1 both store tile 0 (and nobody stores tile 1)."""
    i = ct.bid(0)
    t = ct.load(X, (i,), (T,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (i - (i == 1),), t)


@ct.kernel
def planted_oob_load(X, Y, T: ConstInt):
    i = ct.bid(0)
    t = ct.load(X, (i + 8,), (T,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (i,), t)


@ct.kernel
def divergent_loop(X, Y, T: ConstInt):
    """Block i sums its first i+1 tiles of a row: block-dependent trip counts."""
    i = ct.bid(0)
    acc = ct.zeros((T,), ct.float32)
    for j in range(i + 1):
        acc = acc + ct.load(X, (i, j), (1, T)).reshape((T,)).astype(ct.float32)
    ct.store(Y, (i, 0), acc.reshape((1, T)))


@ct.kernel
def promote_ops(A, B, OUT16, OUT32, s: float, T: ConstInt):
    """f16 tile * python float stays f16; f16 tile * float32 scalar becomes f32."""
    a = ct.load(A, (0,), (T,))
    b = ct.load(B, (0,), (T,))
    ct.store(OUT16, (0,), a * 1.5 + b)
    ct.store(OUT32, (0,), a * s)


@ct.kernel
def bad_narrowing_store(A, OUT16, s: float, T: ConstInt):
    a = ct.load(A, (0,), (T,))
    ct.store(OUT16, (0,), a * s)


@ct.kernel
def reductions(X, SUM, MAX, T: ConstInt):
    x = ct.load(X, (0, 0), (T, T))
    ct.store(SUM, (0,), ct.sum(x, axis=1))
    ct.store(MAX, (0, 0), ct.max(x, axis=0, keepdims=True))


@ct.kernel
def mma_kernel(A, B, C, M: ConstInt, N: ConstInt, K: ConstInt):
    a = ct.load(A, (0, 0), (M, K))
    b = ct.load(B, (0, 0), (K, N))
    acc = ct.full((M, N), 0.0, dtype=ct.float32)
    ct.store(C, (0, 0), ct.mma(a, b, acc))


@ct.kernel
def exp2_kernel(X, Y, T: ConstInt):
    i = ct.bid(0)
    x = ct.load(X, (i,), (T,))
    ct.store(Y, (i,), ct.exp2(x, flush_to_zero=True))


@ct.kernel
def uses_unsupported(X, Y, T: ConstInt):
    x = ct.load(X, (0,), (T,))
    ct.store(Y, (0,), ct.mma_scaled(x, x, x, x, x))   # still unsupported (issue 19)


@ct.kernel
def to_bf16(X, Y, T: ConstInt):
    x = ct.load(X, (0,), (T,))
    ct.store(Y, (0,), x.astype(ct.bfloat16))
