"""The work behind each `braze` command (bridge/cli.py parses the arguments)."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import numpy as np

from compiler import dtypes
from compiler.errors import BrazeError, InputError

# Models whose weights exceed this many bytes are written with external data:
# protobuf cannot serialize a single message over 2 GiB.
EXTERNAL_DATA_BYTES = 1_800_000_000


def concrete_shapes(model, given: dict) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every real input: from the model, or from --shape."""
    initializers = {t.name for t in model.graph.initializer}
    shapes = {}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        if inp.name in given:
            shapes[inp.name] = given.pop(inp.name)
            continue
        dims = inp.type.tensor_type.shape.dim
        if not inp.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value")
                                                              for d in dims):
            shown = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in dims]
            raise InputError(f"input {inp.name!r} has symbolic shape {shown}; "
                             f"give it with --shape {inp.name}=D1,D2,...")
        shapes[inp.name] = tuple(d.dim_value for d in dims)
    if given:
        raise InputError(f"--shape names no input of the model: {', '.join(sorted(given))}")
    return shapes


def random_inputs(model, shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random data for each input, by its ONNX element type."""
    import onnx.helper

    np_dtypes = {}
    for inp in model.graph.input:
        if inp.name in shapes:
            elem = inp.type.tensor_type.elem_type
            try:
                np_dtypes[inp.name] = onnx.helper.tensor_dtype_to_np_dtype(elem)
            except (KeyError, TypeError, ValueError):
                raise InputError(f"input {inp.name!r} has element type {elem}, for which "
                                 f"--random makes no data") from None
    return random_arrays(np_dtypes, shapes, seed)


def random_arrays(np_dtypes: dict, shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random data for each named input (name -> numpy dtype, in input order)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, np_dtype in np_dtypes.items():
        np_dtype, shape = np.dtype(np_dtype), shapes[name]
        if np_dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(np_dtype)
        elif np_dtype.kind == "b":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[name] = rng.integers(0, 2, shape).astype(np_dtype)
    return out


def _op_counts(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _ort_session(model_or_path, threads: int = 2):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # its failures raise; its own log lines would only repeat them
    src = str(model_or_path) if isinstance(model_or_path, (str, Path)) else \
        model_or_path.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _max_diffs(ref: list, got: list) -> tuple[float, float]:
    abs_d, rel_d = 0.0, 0.0
    for a, b in zip(ref, got):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.size == 0:
            continue
        d = float(np.max(np.abs(a64 - b64)))
        abs_d = max(abs_d, d)
        rel_d = max(rel_d, d / max(float(np.max(np.abs(a64))), 1e-30))
    return abs_d, rel_d


def _save_model(model, path: Path, external: bool) -> None:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def _weight_bytes(model) -> int:
    return sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer)


def cmd_optimize(args) -> int:
    from bridge.cli import parse_shapes
    from bridge.onnx_optimize import optimize_model
    from importers.onnx import load_model

    src = Path(args.input)
    t0 = time.perf_counter()
    model = load_model(src)
    shapes = concrete_shapes(model, parse_shapes(args.shape))
    optimized = optimize_model(model, shapes)
    external = _weight_bytes(optimized) > EXTERNAL_DATA_BYTES or _uses_external_data(model)
    out = Path(args.output)
    _save_model(optimized, out, external)
    before, after = _op_counts(model), _op_counts(optimized)
    print(f"{src} -> {out} ({time.perf_counter() - t0:.1f} s)")
    print(f"nodes: {sum(before.values())} -> {sum(after.values())}")
    for op in sorted(set(before) | set(after)):
        if before[op] != after[op]:
            print(f"  {op:<24} {before[op]:>5} -> {after[op]}")
    if args.no_check:
        return 0
    feeds = random_inputs(model, shapes)
    ref = _ort_session(src).run(None, feeds)
    got = _ort_session(out).run(None, feeds)
    abs_d, rel_d = _max_diffs(ref, got)
    print(f"check vs onnxruntime on random inputs: max abs diff {abs_d:.3g}, "
          f"max rel diff {rel_d:.3g} (tolerance {args.rtol:g})")
    if not rel_d <= args.rtol:
        raise BrazeError(f"optimized model differs from the original: max rel diff {rel_d:.3g} "
                         f"> {args.rtol:g}; the output was written to {out} for inspection")
    return 0


def _uses_external_data(model) -> bool:
    import onnx

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def cmd_explain(args) -> int:
    from bridge.cli import parse_shapes
    from bridge.onnx_api import explain_onnx
    from importers.onnx import load_model

    model = load_model(Path(args.input))
    shapes = concrete_shapes(model, parse_shapes(args.shape))
    print(explain_onnx(model, shapes, target=args.target, kernels=args.kernels), end="")
    return 0


def _load_inputs(items: list[str]) -> dict[str, np.ndarray]:
    out = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InputError(f"bad --input {item!r}: expected NAME=FILE.npy")
        try:
            out[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read input {name!r} from {file}: {e}") from None
    return out


def _summary(a: np.ndarray) -> str:
    if a.size == 0:
        return "empty"
    if a.dtype.kind in "fiub":
        x = a.astype(np.float64)
        return f"min {x.min():.4g}  max {x.max():.4g}  mean {x.mean():.4g}"
    return f"{a.reshape(-1)[:3].tolist()}..."


def cmd_compile(args) -> int:
    import bridge
    from bridge.cli import parse_shapes
    from compiler.target import parse as parse_target
    from compiler.target import spec_of
    from importers.onnx import load_model

    emit = args.emit or ("ptx" if args.target == "cuda" else "artifact")
    if args.dynamic and emit != "artifact":
        raise BrazeError("--dynamic is for .braze artifacts (--emit artifact)")
    if emit == "c" and args.target == "cpu":
        return _compile_c(args)
    if args.name is not None:
        raise BrazeError("--name is for --emit c")
    args.threads = 2 if args.threads is None else args.threads
    if (emit == "ptx") != (args.target == "cuda"):
        raise BrazeError(f"--target {args.target} writes " +
                         ("PTX (--emit ptx)" if args.target == "cuda" else
                          "an artifact (--emit artifact)") +
                         f", not --emit {emit}")
    if args.arch is not None and args.target != "cuda":
        raise BrazeError("--arch is for --target cuda")
    if (args.cpu or args.triple) and args.target != "cpu":
        raise BrazeError("--cpu and --triple are for --target cpu")
    if emit == "ptx":
        return _compile_ptx(args)
    src, out = Path(args.input), Path(args.output)
    t0 = time.perf_counter()
    model = load_model(src)
    shapes = concrete_shapes(model, parse_shapes(args.shape))
    target = spec_of(args.cpu, args.triple)
    compiled = bridge.compile_onnx(model, target=target, allow_fallback=not args.no_fallback,
                                   threads=args.threads)
    if args.dynamic:
        buckets = compiled.compile_lengths(args.dynamic, shapes)
        compiled.save(out)
    else:
        compiled.save(out, input_shapes=shapes)
    clusters = [c for s in compiled.saved_specializations() for c in s.clusters]
    host = sum(not c.compiled for c in clusters)
    print(f"{src} -> {out} ({out.stat().st_size / 1e6:.2f} MB, "
          f"{time.perf_counter() - t0:.1f} s)")
    print(f"input shapes: {', '.join(f'{k}={list(v)}' for k, v in shapes.items())}")
    if args.dynamic:
        print(f"{args.dynamic}: buckets {', '.join(map(str, buckets))} (every length from 1 "
              f"to {buckets[-1]}, padded)")
    print(f"clusters: {len(clusters) - host} compiled by braze, {host} on onnxruntime")
    print(f"target: {parse_target(target).describe()}")
    return 0


def _compile_c(args) -> int:
    """`braze compile --emit c`: a C header and library (bridge/export_c.py)."""
    import bridge
    from bridge.cli import parse_shapes
    from compiler.target import spec_of
    from importers.onnx import load_model

    t0 = time.perf_counter()
    model = load_model(Path(args.input))
    shapes = concrete_shapes(model, parse_shapes(args.shape))
    compiled = bridge.compile_onnx(model, target=spec_of(args.cpu, args.triple),
                                   allow_fallback=False)
    name = args.name or Path(args.input).stem
    files = compiled.export_c(args.output, name=name, input_shapes=shapes,
                              threads=1 if args.threads is None else args.threads)
    print(f"{args.input} -> {args.output} ({time.perf_counter() - t0:.1f} s)")
    for path in files.values():
        print(f"  {path} ({path.stat().st_size / 1e6:.3f} MB)")
    return 0


def _compile_ptx(args) -> int:
    """`braze compile --target cuda --emit ptx`: one .ptx file per compiled cluster, each
    headed by comments naming its kernels, their arguments and launch sizes."""
    from bridge.cli import parse_shapes
    from bridge.onnx_api import compile_onnx_ptx
    from compiler.codegen import nvptx
    from importers.onnx import load_model

    src, out = Path(args.input), Path(args.output)
    arch = nvptx.check_arch(args.arch or nvptx.DEFAULT_ARCH)
    t0 = time.perf_counter()
    model = load_model(src)
    shapes = concrete_shapes(model, parse_shapes(args.shape))
    parts = compile_onnx_ptx(model, shapes, arch=arch, allow_fallback=not args.no_fallback)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for cluster, program in parts:
        if program is None:
            continue
        path = out / f"cluster{cluster.id}.ptx"
        path.write_text(program.describe() + program.ptx)
        written += 1
        print(f"  {path.name}: {len(program.launches)} kernel(s)")
    print(f"{src} -> {out}/ ({written} PTX file(s) for {arch}, "
          f"{time.perf_counter() - t0:.1f} s)")
    print(f"input shapes: {', '.join(f'{k}={list(v)}' for k, v in shapes.items())}")
    print(f"clusters: {written} compiled by braze, {len(parts) - written} on the host "
          "(no PTX; `braze explain --target cuda` says why)")
    return 0


def cmd_run(args) -> int:
    import bridge
    from runtime.artifact import looks_like_artifact

    path = Path(args.input)
    feeds = _load_inputs(args.inputs)
    t0 = time.perf_counter()
    if looks_like_artifact(path):
        compiled = _load_artifact(path, args, feeds)
        note = f"loaded in {(time.perf_counter() - t0) * 1e3:.1f} ms"
    else:
        compiled = bridge.compile_onnx(path, allow_fallback=not args.no_fallback,
                                       threads=2 if args.threads is None else args.threads)
        note = "compile included"
        if args.random:
            from importers.onnx import load_model

            model = load_model(path)
            missing = {k: v for k, v in _declared_shapes(model).items() if k not in feeds}
            feeds.update(random_inputs(model, missing))
    t0 = time.perf_counter()
    outputs = compiled(**feeds)
    ms = (time.perf_counter() - t0) * 1e3
    for name, a in zip(compiled.output_names, outputs):
        print(f"{name}: {dtypes.from_numpy(a.dtype)}{list(a.shape)}  {_summary(a)}")
    print(f"({ms:.1f} ms, {note})")
    if args.output_dir:
        d = Path(args.output_dir)
        d.mkdir(parents=True, exist_ok=True)
        for i, (name, a) in enumerate(zip(compiled.output_names, outputs)):
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or f"output{i}"
            np.save(d / f"{safe}.npy", a)
        print(f"outputs saved in {d}")
    return 0


def _load_artifact(path: Path, args, feeds: dict):
    """bridge.load, honouring --no-fallback, and --random at the first saved shapes."""
    import bridge
    from compiler.errors import CompileError

    compiled = bridge.load(path, threads=args.threads)
    if args.no_fallback and compiled.host_steps:
        raise CompileError(f"{path} runs {compiled.host_steps} step(s) on onnxruntime; "
                           "compile it with --no-fallback")
    if args.random:
        shapes = compiled.saved_shapes[0]
        np_dtypes = {s.name: s.dtype for s in compiled.input_specs
                     if s.name in shapes and s.name not in feeds and s.dtype is not None}
        feeds.update(random_arrays(np_dtypes, shapes))
    return compiled


def _declared_shapes(model) -> dict:
    """Static input shapes declared by the model (symbolic dims -> 1)."""
    initializers = {t.name for t in model.graph.initializer}
    return {i.name: tuple(d.dim_value if d.HasField("dim_value") else 1
                          for d in i.type.tensor_type.shape.dim)
            for i in model.graph.input if i.name not in initializers}


def cmd_bench(args) -> int:
    from bridge.bench import bench
    from bridge.cli import parse_shapes
    from importers.onnx import load_model

    model = load_model(args.input)
    shapes = concrete_shapes(model, parse_shapes(args.shape))
    feeds = random_inputs(model, shapes)
    print(bench(str(args.input), feeds, args.threads, args.rounds, args.budget, args.warmup))
    return 0
