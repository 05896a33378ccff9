"""An incrementally maintained DAG that refuses merges which would close a cycle.

After XLA's GraphCycles (Pearce and Kelly's dynamic topological order): every
live node has a `rank`, and every edge x -> y has rank[x] < rank[y]. So:

- y is reachable from x only through nodes ranked between them: the search in
  `reachable` is bounded to that window instead of walking the whole graph.
- Inserting x -> y with rank[x] > rank[y] searches forward from y (ranks up to
  rank[x]) and backward from x (ranks down to rank[y]); if the forward search
  meets x the edge would close a cycle, else the two visited sets swap their
  ranks among themselves (backward set first) and the order holds again.

`merge(a, b)` contracts b into a when no path a ~> b or b ~> a exists other than
a direct edge (a path through a third node would become a cycle through the
merged node). It serves both edge contraction and merging unconnected siblings.
"""

from __future__ import annotations


class GraphCycles:
    """Nodes 0..n-1 with edges kept acyclic; ranks start as the node numbers."""

    def __init__(self, n: int):
        self.rank = list(range(n))
        self.succ: list[set[int]] = [set() for _ in range(n)]
        self.pred: list[set[int]] = [set() for _ in range(n)]
        self.alive = [True] * n

    def insert_edge(self, x: int, y: int) -> bool:
        """Add x -> y; False (and no change) if that would close a cycle."""
        if x == y:
            return False
        if y in self.succ[x]:
            return True
        if self.rank[x] > self.rank[y]:
            forward = self._search(y, self.succ, lambda r: r <= self.rank[x])
            if x in forward:
                return False
            backward = self._search(x, self.pred, lambda r: r >= self.rank[y])
            self._reorder(backward, forward)
        self.succ[x].add(y)
        self.pred[y].add(x)
        return True

    def remove_edge(self, x: int, y: int) -> None:
        self.succ[x].discard(y)
        self.pred[y].discard(x)

    def reachable(self, x: int, y: int) -> bool:
        """Is there a path x ~> y (of length >= 0)?"""
        if x == y:
            return True
        if self.rank[x] > self.rank[y]:
            return False
        return y in self._search(x, self.succ, lambda r: r <= self.rank[y])

    def merge(self, a: int, b: int) -> bool:
        """Fold node b into a unless that closes a cycle; True if merged."""
        direct = [(u, v) for u, v in ((a, b), (b, a)) if v in self.succ[u]]
        for u, v in direct:
            self.remove_edge(u, v)
        if self.reachable(a, b) or self.reachable(b, a):
            for u, v in direct:
                self.insert_edge(u, v)
            return False
        for y in list(self.succ[b]):
            self.remove_edge(b, y)
            self._must_insert(a, y)
        for x in list(self.pred[b]):
            self.remove_edge(x, b)
            self._must_insert(x, a)
        self.alive[b] = False
        return True

    def _must_insert(self, x: int, y: int) -> None:
        if not self.insert_edge(x, y):
            raise AssertionError(f"GraphCycles: merge created a cycle through {x} -> {y}")

    def _search(self, start: int, edges: list[set[int]], within) -> set[int]:
        """Nodes reachable from start along `edges` whose rank satisfies `within`."""
        seen, stack = {start}, [start]
        while stack:
            for m in edges[stack.pop()]:
                if m not in seen and within(self.rank[m]):
                    seen.add(m)
                    stack.append(m)
        return seen

    def _reorder(self, backward: set[int], forward: set[int]) -> None:
        """Give the backward set the lowest of the combined ranks, then the forward set."""
        order = sorted(backward, key=self.rank.__getitem__) + sorted(
            forward, key=self.rank.__getitem__)
        ranks = sorted(self.rank[n] for n in order)
        for n, r in zip(order, ranks):
            self.rank[n] = r
