"""NVIDIA GPUs as an LLVM target: the NVPTX target machine, libdevice, LLVM IR -> PTX.

The counterpart of llvm_cpu.py for compiler/codegen/cuda.py. `compile_ptx` parses a
module, links CUDA's libdevice when the module calls it (`__nv_sinf`, ...: NVPTX has no
C math library; ops_llvm.py names those calls), internalizes libdevice so only what is
used stays, optimizes at -O3 for the chosen compute capability and prints PTX. No GPU and
no CUDA toolkit are needed for that; `ptxas` (from the toolkit) only checks the result.

Also the few NVVM intrinsics the GPU kernels use: special registers (thread and block
ids), the block barrier and warp shuffles.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from compiler.codegen.symbols import declare
from compiler.errors import CompileError

TRIPLE = "nvptx64-nvidia-cuda"
DEFAULT_ARCH = "sm_80"
# PTX ISA 8.0 (CUDA 12.0): every CUDA 12 driver loads it; newer architectures need newer
# ISAs, which LLVM refuses to emit below their minimum (MIN_PTX).
DEFAULT_PTX = "8.0"
MIN_PTX = {"sm_100": "8.6", "sm_101": "8.6", "sm_103": "8.8", "sm_120": "8.7",
           "sm_121": "8.8"}
# compute capabilities braze emits PTX for (LLVM 22 knows them); a newer GPU runs the
# newest of these through the driver's PTX JIT
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_101",
         "sm_103", "sm_120", "sm_121")
WARP = 32
FULL_MASK = -1  # every lane of the warp takes part in a shuffle

I32, I64 = ir.IntType(32), ir.IntType(64)


@functools.cache
def _init() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def check_arch(arch: str) -> str:
    """`arch` if braze emits PTX for it, else CompileError listing those it does."""
    if arch not in ARCHS:
        raise CompileError(f"unknown CUDA architecture {arch!r}; braze emits PTX for "
                           f"{', '.join(ARCHS)}")
    return arch


def ptx_version(arch: str, requested: str | None = None) -> str:
    """The PTX ISA version to emit for `arch` (`requested`, else the default, never below
    the architecture's minimum)."""
    version = requested or DEFAULT_PTX
    if not re.fullmatch(r"\d\.\d", version):
        raise CompileError(f"bad PTX ISA version {version!r}: expected MAJOR.MINOR, e.g. 8.0")
    low = MIN_PTX.get(arch, "0.0")
    if requested is None:
        return max(version, low, key=lambda v: tuple(map(int, v.split("."))))
    if tuple(map(int, version.split("."))) < tuple(map(int, low.split("."))):
        raise CompileError(f"{arch} needs PTX ISA {low} or newer, got {version}")
    return version


def best_arch(major: int, minor: int) -> str:
    """The newest architecture in ARCHS that a GPU of compute capability major.minor runs."""
    cap = major * 10 + minor
    usable = [a for a in ARCHS if int(a[3:]) <= cap]
    if not usable:
        raise CompileError(f"compute capability {major}.{minor} is older than braze's "
                           f"oldest CUDA target {ARCHS[0]}")
    return max(usable, key=lambda a: int(a[3:]))


@functools.cache
def target_machine(arch: str, ptx: str) -> llvm.TargetMachine:
    _init()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=arch, features="+ptx" + ptx.replace(".", ""),
                                        opt=3)


@functools.cache
def libdevice() -> Path | None:
    """CUDA's libdevice bitcode: from CUDA_HOME / CUDA_PATH, the toolkit around nvcc or
    ptxas, /usr/local/cuda, or the copy Triton (a torch dependency) ships; None if none."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for tool in ("nvcc", "ptxas"):
        found = shutil.which(tool)
        if found:
            roots.append(str(Path(found).resolve().parent.parent))
    candidates = [Path(r) / "nvvm" / "libdevice" / "libdevice.10.bc" for r in roots if r]
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "backends" / "nvidia" / "lib" /
                          "libdevice.10.bc")
    return next((p for p in candidates if p.is_file()), None)


def libdevice_refusal() -> str | None:
    """None if libdevice is available, else why calls into it cannot be compiled."""
    if libdevice() is None:
        return ("needs CUDA's libdevice (libdevice.10.bc), which was not found: "
                "set CUDA_HOME to a CUDA toolkit")
    return None


def compile_ptx(llvm_ir: str, arch: str = DEFAULT_ARCH, ptx: str | None = None) -> str:
    """PTX text for an NVPTX module in LLVM IR (its kernels keep their names)."""
    version = ptx_version(check_arch(arch), ptx)
    tm = target_machine(arch, version)
    try:
        mod = llvm.parse_assembly(llvm_ir)
        mod.triple = TRIPLE
        mod.data_layout = str(tm.target_data)
        if any(f.is_declaration and f.name.startswith("__nv_") for f in mod.functions):
            _link_libdevice(mod)
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"LLVM rejected braze's NVPTX IR: {e}") from None
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = False  # GPU threads are the vector lanes
    pto.slp_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


def _link_libdevice(mod: llvm.ModuleRef) -> None:
    path = libdevice()
    if path is None:
        raise CompileError(f"the module calls libdevice: {libdevice_refusal()}")
    kernels = {f.name for f in mod.functions if not f.is_declaration}
    lib = llvm.parse_bitcode(path.read_bytes())
    lib.triple, lib.data_layout = mod.triple, mod.data_layout
    mod.link_in(lib)
    # internal: the optimizer drops every libdevice function the kernels do not call
    for f in mod.functions:
        if not f.is_declaration and f.name not in kernels:
            f.linkage = "internal"


def run_ptxas(ptx: str, arch: str) -> str:
    """Assemble PTX with the toolkit's ptxas for `arch` (a check where no GPU is); its
    report (-v: registers, shared memory per kernel). CompileError with ptxas's message if
    it refuses, or if ptxas is not installed."""
    exe = shutil.which("ptxas")
    if exe is None:
        raise CompileError("ptxas (CUDA toolkit) is not on PATH")
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "braze.ptx"
        src.write_text(ptx)
        proc = subprocess.run([exe, "-v", f"-arch={arch}", str(src), "-o", str(Path(d) / "o")],
                              capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise CompileError(f"ptxas -arch={arch} refused braze's PTX: {proc.stderr.strip()}")
    return proc.stderr + proc.stdout


# -- NVVM intrinsics --------------------------------------------------------------

def sreg(b: ir.IRBuilder, name: str):
    """A special register as i64: 'tid.x', 'ntid.x', 'ctaid.x' or 'nctaid.x'."""
    fn = declare(b.module, f"llvm.nvvm.read.ptx.sreg.{name}", I32, [])
    return b.zext(b.call(fn, []), I64)


def barrier(b: ir.IRBuilder) -> None:
    """__syncthreads(): every thread of the block reaches it before any goes on."""
    b.call(declare(b.module, "llvm.nvvm.barrier.cta.sync.aligned.all", ir.VoidType(), [I32]),
           [ir.Constant(I32, 0)])


def shfl_xor(b: ir.IRBuilder, x, lane_mask: int):
    """x of lane (this lane ^ lane_mask), for any scalar type up to 64 bits (sent as one
    or two 32-bit words; every lane of the warp must take part)."""
    fn = declare(b.module, "llvm.nvvm.shfl.sync.bfly.i32", I32, [I32, I32, I32, I32])
    args = [ir.Constant(I32, lane_mask), ir.Constant(I32, WARP - 1)]
    t = x.type
    width = t.width if isinstance(t, ir.IntType) else (32 if t == ir.FloatType() else 64)
    bits = x if isinstance(t, ir.IntType) else b.bitcast(x, ir.IntType(width))
    if width <= 32:
        word = bits if width == 32 else b.zext(bits, I32)
        got = b.call(fn, [ir.Constant(I32, FULL_MASK), word] + args)
        got = got if width == 32 else b.trunc(got, ir.IntType(width))
    else:
        lo = b.call(fn, [ir.Constant(I32, FULL_MASK), b.trunc(bits, I32)] + args)
        hi = b.call(fn, [ir.Constant(I32, FULL_MASK),
                         b.trunc(b.lshr(bits, ir.Constant(I64, 32)), I32)] + args)
        got = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
    return got if isinstance(t, ir.IntType) else b.bitcast(got, t)
