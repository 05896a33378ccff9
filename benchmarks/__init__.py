"""Side-by-side benchmarks of braze against stock runtimes (docs/DESIGN.md, "Benchmarks").

`python -m benchmarks.resnet50` (what `make bench` runs) and `python -m benchmarks.fusion`.
The method (threads, warm-up, interleaved rounds, statistics) lives in benchmarks/common.py.
"""
