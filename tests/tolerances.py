"""Numeric tolerances per dtype, in one place, for comparing braze against its oracles.

(rtol, atol) for comparing two computations of the same float result that may
round differently (another library's kernels, reassociated sums, a carrier
dtype). Integers and booleans must match exactly.
"""

from __future__ import annotations

import numpy as np

TOLERANCES = {
    "f16": (1e-2, 1e-3),  # 11-bit mantissa: a few ulp of libm-level error
    "bf16": (5e-2, 1e-2),  # 8-bit mantissa
    "f32": (1e-5, 1e-6),  # different vectorized libm / summation order
    "f64": (1e-10, 1e-12),
}


def tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for an IR float dtype; (0, 0) (exact) for anything else."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def assert_close(got, want, dtype: str | None = None) -> None:
    """Same dtype and shape, values within `dtype`'s tolerance (default: want's own dtype).

    NaNs must be NaN in both; integers and booleans are compared exactly.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if want.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want)
        return
    from compiler import dtypes

    rtol, atol = tolerance(dtype or dtypes.from_numpy(want.dtype))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
