"""Elementwise formulas written as Python arithmetic that builds IR nodes.

The special functions (importers/special_*.py) are long compositions of IR elementwise
ops: rational approximations, Chebyshev series, recurrences, selects between regions.
`Ex` wraps one IR Value so that they read as maths: `a * b + 1.0` adds a mul, a
constant and an add to the graph, named after the aten node being converted; Python
numbers become constants of the other operand's dtype (each made once per converter).
Every region is computed and the right one selected (`where`): IR kernels have no
branches, so a function costs the sum of its regions.

Evaluation schemes (coefficient lists are highest degree first, as Cephes prints them):
  horner(x, c)  = c[0] x^n + c[1] x^(n-1) + ... + c[n]
  chebyshev(x, c) = sum' c[n-k] T_k(x/2) by Clenshaw's recurrence
                  b_k = x b_(k+1) - b_(k+2) + c_k,   result (b_0 - b_2) / 2
  (Cephes' `chbevl` convention: x already mapped to [-2, 2], the first term halved).
"""

from __future__ import annotations

from compiler.ir import Value
from importers.fx_context import Ctx


class Builder:
    """One converter's formulas: its Ctx and the constants it has made."""

    def __init__(self, cx: Ctx):
        self.cx = cx
        self._consts: dict = {}

    def const(self, x: float, dtype: str) -> Value:
        key = (float(x), dtype)
        if key not in self._consts:
            self._consts[key] = self.cx.scalar(float(x), dtype)
        return self._consts[key]

    def wrap(self, v: Value) -> "Ex":
        return Ex(self, v)


class Ex:
    """An IR value in a formula; see the module docstring."""

    __slots__ = ("b", "v")

    def __init__(self, b: Builder, v: Value):
        self.b = b
        self.v = v

    @property
    def dtype(self) -> str:
        return self.v.dtype

    def _val(self, o) -> Value:
        return o.v if isinstance(o, Ex) else self.b.const(o, self.dtype)

    def _op(self, op: str, *vals) -> "Ex":
        return Ex(self.b, self.b.cx.op(op, *vals))

    def _bin(self, op: str, o, flip: bool = False) -> "Ex":
        a, c = self.v, self._val(o)
        return self._op(op, c, a) if flip else self._op(op, a, c)

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __neg__(self): return self._op("neg", self.v)
    def __lt__(self, o): return self._bin("lt", o)
    def __le__(self, o): return self._bin("le", o)
    def __gt__(self, o): return self._bin("gt", o)
    def __ge__(self, o): return self._bin("ge", o)
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def __invert__(self): return self._op("not", self.v)

    def eq(self, o) -> "Ex":
        return self._bin("eq", o)

    def pow(self, o) -> "Ex":
        return self._bin("pow", o)

    def fn(self, op: str) -> "Ex":
        """The unary IR op `op` (exp, log, sqrt, sin, floor, erf, isnan...)."""
        return self._op(op, self.v)

    def __getattr__(self, name):
        if name in _UNARY:
            return lambda: self.fn(name)
        raise AttributeError(name)

    def lit(self, c: float) -> "Ex":
        """The constant c, of this value's dtype (0-d: it broadcasts)."""
        return Ex(self.b, self.b.const(c, self.dtype))

    def to(self, dtype: str) -> "Ex":
        return Ex(self.b, self.b.cx.cast(self.v, dtype))


_UNARY = {"exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tan", "abs", "floor",
          "ceil", "round", "erf", "isnan", "isinf", "reciprocal"}


def where(cond: Ex, a, b) -> Ex:
    """a where cond holds, else b (numbers become constants of the other's dtype)."""
    ref = a if isinstance(a, Ex) else b
    return ref._op("select", cond.v, ref._val(a), ref._val(b))


def horner(x: Ex, coeffs) -> Ex:
    """coeffs[0] x^n + ... + coeffs[n] (Cephes' polevl)."""
    r = x.lit(coeffs[0]) if len(coeffs) == 1 else x * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        r = r * x + c
    return r


def monic(x: Ex, coeffs) -> Ex:
    """x^(n+1) + coeffs[0] x^n + ... + coeffs[n] (Cephes' p1evl: leading 1 implied)."""
    r = x + coeffs[0]
    for c in coeffs[1:]:
        r = r * x + c
    return r


def chebyshev(x: Ex, coeffs) -> Ex:
    """Clenshaw's sum of a Chebyshev series on x in [-2, 2] (Cephes' chbevl)."""
    b0, b1, b2 = None, None, None
    for c in coeffs:
        b2, b1 = b1, b0
        if b1 is None:
            b0 = x.lit(c)
        elif b2 is None:
            b0 = x * b1 + c
        else:
            b0 = x * b1 - b2 + c
    return (b0 - b2) * 0.5 if b2 is not None else b0 * 0.5
