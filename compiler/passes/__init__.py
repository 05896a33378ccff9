"""Graph passes: each `fn(graph) -> bool` in place; pipeline.py lists them in order.

simplify.py (constant folding, dead code, CSE), identities.py (algebraic
identity rules), fold.py (batch norm and scale/bias into conv/matmul), rules.py
(the rule driver they share), cluster.py with cycles.py (mark-for-compilation),
fuse.py (kernels inside a compiled cluster).
"""
