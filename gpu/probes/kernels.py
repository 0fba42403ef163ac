"""One op per kernel; each block handles one case (mma) or one tile of elements."""
import cuda.tile as ct

ConstInt = ct.Constant[int]


@ct.kernel
def mma_probe(A, B, C, D, M: ConstInt, N: ConstInt, K: ConstInt):
    """D[c] = mma(A[c], B[c], C[c]) for case c = bid(0): one tensor-core product per case."""
    c = ct.bid(0)
    a = ct.load(A, (c, 0, 0), (1, M, K)).reshape((M, K))
    b = ct.load(B, (c, 0, 0), (1, K, N)).reshape((K, N))
    acc = ct.load(C, (c, 0, 0), (1, M, N)).reshape((M, N))
    ct.store(D, (c, 0, 0), ct.mma(a, b, acc).reshape((1, M, N)))


@ct.kernel
def exp2_probe(X, Y, T: ConstInt):
    i = ct.bid(0)
    ct.store(Y, (i,), ct.exp2(ct.load(X, (i,), (T,)), flush_to_zero=True))


@ct.kernel
def div_approx_probe(X, Z, Y, T: ConstInt):
    i = ct.bid(0)
    x = ct.load(X, (i,), (T,))
    z = ct.load(Z, (i,), (T,))
    ct.store(Y, (i,), ct.truediv(x, z, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX))


@ct.kernel
def cast_probe(X, Y16, YB16, T: ConstInt):
    i = ct.bid(0)
    x = ct.load(X, (i,), (T,))
    ct.store(Y16, (i,), x.astype(ct.float16))
    ct.store(YB16, (i,), x.astype(ct.bfloat16))


@ct.kernel
def rowsum_probe(X, Y, M: ConstInt, N: ConstInt):
    """ct.sum over the last axis of an [M, N] float32 tile: the reduction order matters."""
    i = ct.bid(0)
    x = ct.load(X, (i, 0, 0), (1, M, N)).reshape((M, N))
    ct.store(Y, (i, 0), ct.sum(x, axis=1).reshape((1, M)))
