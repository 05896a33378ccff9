"""torch front end edge cases that were silently wrong or failed to compile (issue 16,
item 10): avg_pool with ceil_mode divides a clipped last window by what lies inside
the (declared) padding, as torch does; cat / stack of empty tensors compile."""

import pytest
import torch
import torch.nn.functional as F

from compiler.text import print_graph


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiled(fn):
    return torch.compile(fn, backend="braze", options={"strict": True,
                                                         "allow_fallback": False})


POOLS = [
    (lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), (1, 2, 8, 8)),
    (lambda x: F.avg_pool2d(x, 2, 3, ceil_mode=True), (1, 1, 7, 7)),
    (lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True), (1, 2, 8, 8)),
    (lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
     (1, 2, 8, 8)),
    (lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), (2, 3, 112, 112)),
    (lambda x: F.avg_pool1d(x, 3, 2, ceil_mode=True), (1, 2, 8)),
    (lambda x: F.avg_pool1d(x, 2, 2, padding=1, ceil_mode=True), (1, 2, 7)),
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_avg_pool_ceil_mode_matches_eager(case):
    fn, shape = POOLS[case]
    x = torch.randn(shape)
    torch.testing.assert_close(_compiled(fn)(x), fn(x), rtol=1e-5, atol=1e-6)


def test_avg_pool_ceil_mode_counts_only_the_inside(monkeypatch):
    """Structural: the compiled avg_pool divides by the count inside the input."""
    from compiler.codegen import compiled as compiled_mod

    graphs, orig = [], compiled_mod.compile_cpu

    def spy(graph, *a, **k):
        graphs.append(print_graph(graph))
        return orig(graph, *a, **k)

    monkeypatch.setattr(compiled_mod, "compile_cpu", spy)
    _compiled(POOLS[0][0])(torch.randn(POOLS[0][1]))
    pools = [line for text in graphs for line in text.splitlines() if "avg_pool(" in line]
    assert len(pools) == 1 and "count_include_pad=false" in pools[0], graphs


CATS = [
    (lambda x: torch.cat([x, x.new_zeros(0)]), (0,)),
    (lambda x: torch.cat([x[:0], x[:0]]) + 1, (3, 4)),
    (lambda x: torch.stack([x[:0], x[:0]]), (3, 4)),
    (lambda x: torch.cat([x, x[:, :0]], 1) * 2, (3, 4)),
    (lambda x: torch.cat([x[:0], x]) * 2, (3, 4)),
]


@pytest.mark.parametrize("case", range(len(CATS)))
def test_cat_and_stack_of_empty_tensors(case):
    fn, shape = CATS[case]
    x = torch.randn(shape)
    got, want = _compiled(fn)(x), fn(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
