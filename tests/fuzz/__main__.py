"""`python -m tests.fuzz [--count N] [--seed S] [--jobs J] [--timeout T] [--show CLASS...]`:
build N mutants of the seed models, classify each (tests/fuzz/run.py) and print the
table of counts per class, then the mutants of the failing classes."""

from __future__ import annotations

import argparse
import sys

from tests.fuzz.mutants import mutants
from tests.fuzz.run import BAD, CLASSES, TIMEOUT, run_all, table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=TIMEOUT)
    p.add_argument("--show", nargs="*", default=list(BAD), choices=CLASSES,
                   help="classes whose mutants are listed (default: the failing ones)")
    args = p.parse_args(argv)
    results = run_all(mutants(args.count, args.seed), args.jobs, args.timeout)
    print(table(results))
    for r in results:
        if r.cls in args.show:
            print(f"  {r.cls}: {r.name}: {r.detail}")
    return 1 if any(r.cls in BAD for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
