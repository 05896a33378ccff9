"""torch's EmbeddingBag through importers/fx_embedding_bag.py with nothing on torch,
against eager: sum, mean and max; empty bags, padding_idx, include_last_offset, 2-d
input (fixed-size bags), per_sample_weights, the nn.EmbeddingBag module; an index out of
the table raises; a graph reading the op's backward outputs keeps it on torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.importers import fx_compare
from tests.importers.fx_compare import close, compiled

seeded = fx_compare.seeded  # autouse: a fixed seed for every test here

W = torch.randn(50, 8)
OFFSETS = torch.tensor([0, 3, 3, 10, 17])  # a bag of 0 at 3


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 7}, {"include_last_offset": True}],
                         ids=["plain", "padding", "last_offset"])
def test_bags_match_eager(mode, kw):
    idx = torch.randint(0, 50, (20,))
    idx[4] = idx[12] = 7
    offsets = torch.tensor([0, 3, 3, 10, 20]) if kw.get("include_last_offset") else OFFSETS
    fn = lambda i, o: F.embedding_bag(i, W, o, mode=mode, **kw)  # noqa: E731
    close(compiled(fn)(idx, offsets), fn(idx, offsets), rtol=1e-6, atol=1e-6)


def test_fixed_bags_weights_and_module():
    two_d = torch.randint(0, 50, (4, 6))
    fn = lambda i: F.embedding_bag(i, W, mode="mean")  # noqa: E731
    close(compiled(fn)(two_d), fn(two_d), rtol=1e-6, atol=1e-6)
    idx, psw = torch.randint(0, 50, (20,)), torch.rand(20)
    fn = lambda i, o, p: F.embedding_bag(i, W, o, mode="sum", per_sample_weights=p)  # noqa: E731
    close(compiled(fn)(idx, OFFSETS, psw), fn(idx, OFFSETS, psw), rtol=1e-6, atol=1e-6)
    bag = torch.nn.EmbeddingBag(50, 8, mode="max").eval()
    with torch.no_grad():
        close(compiled(bag)(idx, OFFSETS), bag(idx, OFFSETS), rtol=0, atol=0)


def test_index_out_of_the_table_raises():
    idx = torch.randint(0, 50, (20,))
    idx[5] = 50
    with pytest.raises(Exception, match="index out of range"):
        compiled(lambda i, o: F.embedding_bag(i, W, o))(idx, OFFSETS)


def test_backward_outputs_read_keep_it_on_torch():
    idx = torch.randint(0, 50, (20,))
    fn = lambda i, o: torch.ops.aten._embedding_bag_forward_only(W, i, o)[2]  # noqa: E731
    with pytest.raises(Exception, match="bag_size or max_indices"):
        compiled(fn)(idx, OFFSETS)
    close(compiled(fn, {"strict": True})(idx, OFFSETS), fn(idx, OFFSETS), rtol=0, atol=0)
