"""The float32 sequences the sm_90 compiler emits for cuTile's transcendental ops, step by
step, so the simulator gives the GPU's bits instead of the correctly rounded value.

Read from the SASS of cuTile kernels compiled for sm_90 on the CPU (tileiras + nvdisasm:
tools/sim_ops_gpu.py's `unary` kernel; docs/sim-coverage.md names the probe): ct.log and
ct.log2 are libdevice's logf/log2f (an integer range reduction and an FFMA polynomial),
ct.exp is libdevice's expf (FFMA.SAT/FFMA.RM range reduction, MUFU.EX2 of the remainder, a
scale by a power of two), ct.exp2 without flush_to_zero is ex2.approx.f32 (MUFU.EX2, with
the argument halved and the result squared below -126), ct.tanh is libdevice's tanhf (an
odd polynomial below 0.6, else 1 - 2 / (1 + MUFU.EX2(2|x| log2 e)) through MUFU.RCP), ct.sin
and ct.cos are libdevice's sinf/cosf (below). Each is 100% bit-identical to an H100 on the
values of results/sim-ops-h100-2026-11-24 (tests/test_sim_ops_gpu_agreement.py).
MUFU.EX2 and MUFU.RCP come from the model (its measured tables); every FFMA is one
rounding (sim.fma), every other step a float32 operation in round-to-nearest-even.
fp16 inputs run the float32 sequence and round the result to fp16 (the SASS converts with
HADD2.F32 and packs with F2FP.F16.F32).
"""
from __future__ import annotations

import numpy as np

from .fma import fma_f32

F = np.float32
_TINY = F(1.1754943508222875e-38)      # smallest normal float32
_INF = F(np.inf)


def _bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _float(b):
    return np.ascontiguousarray(b, np.uint32).view(np.float32)


def _log_reduce(x, magic):
    """x = 2^k * m': subnormals scaled by 2^23 first; the exponent split at `magic`'s
    mantissa (sqrt(1/2) for log2f, 2/3 for logf) so f = m' - 1 is small. Returns
    (scaled x, extra exponent, special (negative/inf/NaN), f, 2^23 k as float)."""
    normal = (x >= _TINY) | np.isnan(x)                     # FSETP.GEU
    m = np.where(normal, x, x * F(8388608.0)).astype(np.float32)
    e0 = np.where(normal, F(0), F(-23))
    mb = _bits(m)
    special = mb > np.uint32(0x7F7FFFFF)
    i = (mb + np.uint32(magic)) & np.uint32(0xFF800000)
    f = (_float(mb - i) - F(1.0)).astype(np.float32)
    return m, e0, special, f, i.view(np.int32).astype(np.float32)


def _log_finish(m, special, res):
    """Negative, inf and NaN inputs: fma(m, inf, inf) (NaN or +inf); zeros: -inf."""
    res = np.where(special, fma_f32(m, _INF, _INF), res)
    return np.where(m != 0, res, -_INF).astype(np.float32)


_LOGF = (0.14084610342979431152, -0.12148627638816833496, 0.13980610668659210205,
         -0.16684235632419586182, 0.20012299716472625732, -0.24999669194221496582,
         0.33333182334899902344, -0.5)


def logf(x):
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        m, e0, special, f, k = _log_reduce(x, 0xC0D55555)
        r = fma_f32(f, -_float(np.uint32(0x3E055027)), F(_LOGF[0]))
        for c in _LOGF[1:]:
            r = fma_f32(f, r, F(c))
        r = (f * r).astype(np.float32)
        k = fma_f32(k, F(2.0 ** -23), e0)
        return _log_finish(m, special, fma_f32(k, F(0.69314718246459960938), fma_f32(f, r, f)))


_LOG2F = (-0.16845393180847167969, 0.1716887056827545166, -0.17900948226451873779,
          0.20512372255325317383, -0.24046532809734344482, 0.28857114911079406738,
          -0.36067417263984680176, 0.48089820146560668945, -0.72134751081466674805)


def log2f(x):
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        m, e0, special, f, k = _log_reduce(x, 0xC0CAFB0D)
        r = fma_f32(f, _float(np.uint32(0x3DC6B27F)), F(_LOG2F[0]))
        for c in _LOG2F[1:]:
            r = fma_f32(f, r, F(c))
        t = (f * (f * r).astype(np.float32)).astype(np.float32)
        s = fma_f32(f, F(1.4426950216293334961), t)
        return _log_finish(m, special, (s + fma_f32(k, F(2.0 ** -23), e0)).astype(np.float32))


def expf(x, ex2):
    """ex2: MUFU.EX2 (a function of a float32 array)."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        t = fma_f32(x, _float(np.uint32(0x3BBB989D)), F(0.5))
        t = np.where(np.isnan(t), F(0), np.clip(t, F(0), F(1))).astype(np.float32)  # .SAT
        # FFMA.RM t * 252 + (1.5 * 2^23 + 1): exact in float64 (t has 24 bits), then floor
        j = np.floor(t.astype(np.float64) * 252.0 + 12582913.0).astype(np.float32)
        scale = _float(_bits(j) << np.uint32(23))             # 2^(j's low bits - 127)
        r = fma_f32(x, F(1.4426950216293334961), -(j - F(12583039.0)).astype(np.float32))
        r = fma_f32(x, F(1.925963033500011079e-08), r)
        return (ex2(r) * scale).astype(np.float32)


def exp2f(x, ex2):
    """ex2.approx.f32 without ftz: below -126 the half argument, squared (no flush)."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        keep = (x >= F(-126)) | np.isnan(x)
        e = ex2(np.where(keep, x, x * F(0.5)).astype(np.float32))
        return np.where(keep, e, e * e).astype(np.float32)


def tanhf(x, ex2, rcp):
    """ex2, rcp: MUFU.EX2 and MUFU.RCP."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        a = np.abs(x)
        e = ex2((a * F(2.8853900432586669922)).astype(np.float32))
        x2 = (x * x).astype(np.float32)
        p = fma_f32(x2, _float(np.uint32(0x3C80F082)), F(-0.052303962409496307373))
        p = fma_f32(x2, p, F(0.1331529766321182251))
        p = fma_f32(x2, p, F(-0.33332768082618713379))
        p = fma_f32(x2, p, F(0.0))
        big = fma_f32(rcp((e + F(1)).astype(np.float32)), F(-2), F(1.0))
        big = np.where(a >= F(9.010913848876953125), F(1), big).astype(np.float32)
        big = _float((_bits(big) & np.uint32(0x7FFFFFFF)) | (_bits(x) & np.uint32(0x80000000)))
        return np.where(a >= F(0.60000002384185791016), big, fma_f32(x, p, x)).astype(np.float32)


# sinf / cosf: |x| < 105615 reduce by j = rint(x * 2/pi) and a 3-part pi/2 (FFMAs); larger
# |x| by Payne-Hanek (x's significand times 192 bits of 2/pi, integer arithmetic, then
# the 64-bit fraction to float64 times pi/2^64 and to float32). Then one of two
# polynomials by the quadrant's parity, negated by its second bit.
_I2OPI = (0x3C439041, 0xDB629599, 0xF534DDC0, 0xFC2757D1, 0x4E441529, 0xA2F9836E)
_PIO2_2M64 = np.frombuffer(np.uint64(0x3BF921FB54442D19).tobytes(), np.float64)[0]
_M32 = (1 << 32) - 1


def _payne_hanek(xv: np.float32):
    """(reduced float32 r, quadrant) of one finite |x| >= 105615, as the SASS computes them."""
    bits = int(np.asarray(xv, np.float32).view(np.uint32))
    ia = ((bits << 8) | 0x80000000) & _M32
    res, carry = [], 0
    for w in _I2OPI:
        p = w * ia + carry
        res.append(p & _M32)
        carry = p >> 32
    res.append(carry)
    e = ((bits >> 23) & 0xE0) - 128
    q = e >> 5
    hi, lo, mid = res[6 - q], res[5 - q], res[4 - q]
    sh = (bits >> 23) & 0x1F
    if sh:
        hi = ((hi << sh) | (lo >> (32 - sh))) & _M32
        lo = ((lo << sh) | (mid >> (32 - sh))) & _M32
    quad = hi >> 30
    hi2 = ((hi << 2) | (lo >> 30)) & _M32
    lo2 = (lo << 2) & _M32
    quad += hi2 >> 31
    neg = bits >> 31
    if neg:
        quad = -quad
    mask = _M32 if hi2 >> 31 else 0
    frac = (((hi2 ^ mask) << 32) | (lo2 ^ mask))          # top bit clear: non-negative
    d = np.float64(frac) * _PIO2_2M64                       # I2F.F64.S64 (RN), DMUL
    r = np.float32(d)                                       # F2F.F32.F64 (RN)
    return (r if (hi2 >> 31) == neg else -r), quad


def _trig_reduce(x):
    big = np.abs(x) >= F(105615.0)
    j = np.rint((x * F(0.63661974668502807617)).astype(np.float32))    # F2I (RN)
    j = np.where(np.isfinite(j) & ~big, j, 0).astype(np.int64)
    jf = j.astype(np.float32)
    r = fma_f32(jf, F(-1.5707962512969970703), x)
    r = fma_f32(jf, F(-7.5497894158615963534e-08), r)
    r = fma_f32(jf, F(-5.3903029534742383927e-15), r)
    for i in np.flatnonzero(big.reshape(-1)):
        xi = x.reshape(-1)[i]
        if np.isinf(xi):
            r.reshape(-1)[i], j.reshape(-1)[i] = F(0) * xi, 0
        else:
            r.reshape(-1)[i], j.reshape(-1)[i] = _payne_hanek(xi)
    return r, j


def _trig_poly(r, odd, negate, c_odd, c_even, s1, s2):
    """odd: the cosine polynomial 1 + r^2 p(r^2); else the sine r + r^3 p(r^2). c_odd,
    c_even, s1, s2: the coefficients the two functions' SASS select per parity."""
    r2 = (r * r).astype(np.float32)
    t = fma_f32(r2, _float(np.uint32(0x37CBAC00)), F(-0.0013887860113754868507))
    p = np.where(odd, t, F(-0.00019574658654164522886)).astype(np.float32)
    p = fma_f32(r2, p, np.where(odd, c_odd, c_even).astype(np.float32))
    p = fma_f32(r2, p, np.where(odd, s1, s2).astype(np.float32))
    m = np.where(odd, F(1), r).astype(np.float32)
    p = fma_f32(fma_f32(r2, m, F(0)), p, m)
    return np.where(negate, (F(0) - p).astype(np.float32), p).astype(np.float32)


def sinf(x):
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        r, q = _trig_reduce(x)
        return _trig_poly(r, (q & 1) == 1, (q & 2) == 2, _float(np.uint32(0x3D2AAABB)),
                          F(0.0083327032625675201416), -_float(np.uint32(0x3EFFFFFF)),
                          F(-0.16666662693023681641))


def cosf(x):
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        r, q = _trig_reduce(x)
        # cosine of r is the even polynomial where q is even: the parity is inverted
        return _trig_poly(r, (q & 1) == 0, ((q + 1) & 2) == 2, F(0.041666727513074874878),
                          _float(np.uint32(0x3C0885E4)), F(-0.4999999701976776123),
                          -_float(np.uint32(0x3E2AAAA8)))
