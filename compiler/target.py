"""The CPU braze compiles for: one frozen description, chosen once per compile.

A `Target` is what LLVM is given (triple, CPU name, feature string) and what the
kernels derive from it: the vector width in float32 lanes (`vec`), the number of
vector registers (`vector_registers`), whether there is a fused multiply-add (`fma`)
and the data cache sizes. The host is the default (`host()`); `parse(spec)` reads
the forms braze's options and CLI accept:

    "cpu"                          this machine (LLVM's host CPU name and features)
    "cpu:znver3"                   another CPU by its LLVM name (its own features)
    "cpu:znver4,-avx512f"          a CPU with features turned on (+) or off (-)
    "cpu:neoverse-n1@aarch64-linux-gnu"   with the triple spelled out

Without "@triple", a named CPU compiles for this machine's triple when LLVM knows the
CPU there, else for the first other registered architecture that knows it (so
"cpu:neoverse-n1" is AArch64). An unknown CPU or feature is a TargetError (LLVM would
only warn and silently compile for a generic CPU).

The vector features that shape kernels (`isa`: sse4.2, avx, avx2, fma, avx512f on x86;
neon on AArch64), and those LLVM's code may use unasked (AMD's sse4a), are read from the
host's feature string, or, for a named CPU, probed:
LLVM compiles one tiny function per feature for that CPU and the assembly shows
whether it used the feature's instructions (llvmlite cannot list a named CPU's
features). An artifact records `requires` (the features its code may use) and loads
only where the machine has them all (`missing_here`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
from dataclasses import dataclass

import llvmlite.binding as llvm

from compiler.errors import TargetError

KINDS = ("cpu", "cuda")
HOST = "cpu"

# Data cache sizes assumed for a named CPU (the host's are read from the OS): one
# core's L1D and L2 on recent x86 and Arm server cores.
DEFAULT_L1D_BYTES = 32 << 10
DEFAULT_L2_BYTES = 1 << 20

# The vector features kernels care about, each with a function LLVM compiles only with
# that feature's instructions and the assembly pattern those instructions show.
_PROBES = {
    "x86_64": {
        "sse4.2": ("<2 x i64>", "%r = icmp sgt <2 x i64> %a, %b\n"
                   "  %s = sext <2 x i1> %r to <2 x i64>\n  ret <2 x i64> %s", r"pcmpgtq"),
        "avx": ("<8 x float>", "%r = fadd <8 x float> %a, %b\n  ret <8 x float> %r",
                r"%ymm"),
        "avx2": ("<8 x i32>", "%r = add <8 x i32> %a, %b\n  ret <8 x i32> %r",
                 r"vpaddd\s+%ymm"),
        "fma": ("<4 x float>", "%r = call <4 x float> @llvm.fma.v4f32(<4 x float> %a, "
                "<4 x float> %b, <4 x float> %a)\n  ret <4 x float> %r", r"vfmadd"),
        "avx512f": ("<16 x float>", "%r = fadd <16 x float> %a, %b\n  ret <16 x float> %r",
                    r"%zmm"),
        # AMD's SSE4A: LLVM lowers some byte shuffles to extrq/insertq where a CPU has
        # it (znver*), and Intel CPUs have not: a znver3 build of ResNet-50 at batch 8
        # stopped on insertq (SIGILL) on an Intel Xeon before this was required
        "sse4a": ("<16 x i8>", "%r = shufflevector <16 x i8> %a, <16 x i8> zeroinitializer, "
                  "<16 x i32> <i32 1, i32 2, i32 3, i32 16, i32 16, i32 16, i32 16, i32 16, "
                  "i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, i32 undef, "
                  "i32 undef, i32 undef>\n  ret <16 x i8> %r", r"\bextrq\b"),
    },
    "aarch64": {
        "neon": ("<4 x float>", "%r = call <4 x float> @llvm.fma.v4f32(<4 x float> %a, "
                 "<4 x float> %b, <4 x float> %a)\n  ret <4 x float> %r", r"fmla\s+v\d+\.4s"),
    },
}
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
# A triple per architecture, for a named CPU given without one.
_DEFAULT_TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}


@dataclass(frozen=True)
class Target:
    """One CPU to compile for; `spec` is the string it was parsed from ("cpu": the host)."""

    spec: str
    triple: str
    cpu: str
    features: str  # LLVM feature string for the target machine ("" = the CPU's own)
    isa: frozenset  # the vector features kernels derive from (see _PROBES)
    l1d_bytes: int = DEFAULT_L1D_BYTES
    l2_bytes: int = DEFAULT_L2_BYTES

    @property
    def arch(self) -> str:
        return arch_of(self.triple)

    @property
    def is_host(self) -> bool:
        return self.spec == HOST

    @property
    def vector_bits(self) -> int:
        """Width of one vector register braze's kernels use."""
        if "avx512f" in self.isa:
            return 512
        return 256 if "avx" in self.isa else 128

    @property
    def vec(self) -> int:
        """float32 lanes of one vector register."""
        return self.vector_bits // 32

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: 32 with AVX-512 or on AArch64, else 16."""
        return 32 if "avx512f" in self.isa or self.arch == "aarch64" else 16

    @property
    def fma(self) -> bool:
        """Whether a fused multiply-add is one instruction (AArch64 NEON always has it)."""
        return "fma" in self.isa or "neon" in self.isa

    @property
    def requires(self) -> tuple[str, ...]:
        """The CPU features this target's code may use: the host's whole feature set,
        or a named CPU's probed vector features and any it turns on by name."""
        named = {f[1:] for f in self.features.split(",") if f.startswith("+")}
        if self.is_host:
            return tuple(sorted(named))
        return tuple(sorted(named | set(self.isa)))

    def missing_here(self) -> list[str]:
        """What this machine lacks to run this target's code ([] when it runs here)."""
        here = host()
        if self.arch != here.arch:
            return [f"the {self.arch} architecture (this machine is {here.arch})"]
        have = set(here.requires)
        return [f for f in self.requires if f not in have]

    def describe(self) -> str:
        """One line: 'znver3 (x86_64-unknown-linux-gnu): 256-bit vectors x 16, FMA'."""
        fma = "FMA" if self.fma else "no FMA"
        return (f"{self.cpu} ({self.triple}): {self.vector_bits}-bit vectors x "
                f"{self.vector_registers}, {fma}")

    def key(self) -> tuple[str, ...]:
        """What compiled code depends on (the compile cache's key holds it)."""
        return (self.triple, self.cpu, self.features, str(self.l1d_bytes), str(self.l2_bytes))

    def to_json(self) -> dict:
        return {"spec": self.spec, "triple": self.triple, "cpu": self.cpu,
                "features": self.features, "isa": sorted(self.isa),
                "requires": list(self.requires), "l1d_bytes": self.l1d_bytes,
                "l2_bytes": self.l2_bytes}

    @classmethod
    def from_json(cls, d: dict) -> Target:
        """The Target `to_json` wrote (no LLVM runs: an artifact's loader uses it)."""
        return cls(str(d["spec"]), str(d["triple"]), str(d["cpu"]), str(d["features"]),
                   frozenset(map(str, d["isa"])), int(d["l1d_bytes"]), int(d["l2_bytes"]))


def spec_of(cpu: str | None = None, triple: str | None = None) -> str:
    """The spec string for a CPU name (with any ",+f,-f" features) and a triple, as the CLI's
    --cpu and --triple give them; "cpu" (the host) when neither is given."""
    if cpu is None and triple is None:
        return HOST
    return f"cpu:{cpu or 'generic'}" + (f"@{triple}" if triple else "")


def kind(spec) -> str:
    """"cpu" or "cuda": the codegen a target spec (string or Target) selects."""
    if isinstance(spec, Target):
        return "cpu"
    if not isinstance(spec, str):
        raise TargetError(f"a target is a string such as 'cpu' or 'cpu:znver3', got {spec!r}")
    head = spec.split(":", 1)[0]
    if head not in KINDS or (head == "cuda" and spec != "cuda"):
        raise TargetError(f"unknown target {spec!r}; braze compiles for 'cpu', "
                          "'cpu:<LLVM CPU name>[,+feature,-feature][@triple]' and 'cuda'")
    return head


def arch_of(triple: str) -> str:
    a = triple.split("-", 1)[0]
    return _ARCH_ALIASES.get(a, a)


@functools.cache
def init() -> None:
    """Every LLVM target braze may compile for (cross-compiling needs them all)."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@functools.cache
def host() -> Target:
    """This machine."""
    init()
    triple, cpu = llvm.get_process_triple(), llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    on = {f[1:] for f in features.split(",") if f.startswith("+")}
    isa = frozenset(f for f in _PROBES.get(arch_of(triple), {}) if f in on)
    if arch_of(triple) == "aarch64":
        isa |= {"neon"}  # AArch64's base ISA (the host string may omit it)
    return Target(HOST, triple, cpu, features, isa, *_host_caches())


def _host_caches() -> tuple[int, int]:
    """(L1D, L2) bytes of one of this machine's cores: the OS's sysconf where Python knows
    the names, else Linux's sysfs cache descriptions, else the defaults (some Pythons
    lack SC_LEVEL2_CACHE_SIZE: an Intel Xeon's 2 MiB L2 then read as the 1 MiB default)."""
    sysfs = _sysfs_caches()

    def size(name: str, level: tuple[int, str], default: int) -> int:
        try:
            value = os.sysconf(name)
        except (ValueError, OSError, AttributeError):
            value = 0
        return value if value and value > 0 else sysfs.get(level, default)

    return (size("SC_LEVEL1_DCACHE_SIZE", (1, "Data"), DEFAULT_L1D_BYTES),
            size("SC_LEVEL2_CACHE_SIZE", (2, "Unified"), DEFAULT_L2_BYTES))


_SYSFS_CACHES = "/sys/devices/system/cpu/cpu0/cache"


def _sysfs_caches(root: str | None = None) -> dict[tuple[int, str], int]:
    """{(level, type): bytes} of cpu0's caches as sysfs describes them ("48K", "2048K";
    type Data, Instruction or Unified); empty where there is no such directory."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    found = {}
    try:
        root = root or _SYSFS_CACHES
        entries = sorted(os.listdir(root))
    except OSError:
        return found
    for entry in entries:
        def read(field: str, entry=entry) -> str:
            with open(os.path.join(root, entry, field)) as f:
                return f.read().strip()
        try:
            level, kind, size = int(read("level")), read("type"), read("size")
        except (OSError, ValueError):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if m:
            found[(level, kind)] = int(m.group(1)) * units[m.group(2)]
    return found


def parse(spec) -> Target:
    """The Target for `spec` (a Target is returned as it is); TargetError if LLVM does not
    know the triple, CPU or a feature."""
    if isinstance(spec, Target):
        return spec
    if kind(spec) != "cpu":
        raise TargetError(f"target {spec!r} is not a CPU target")
    return _parse(spec)


@functools.cache
def _parse(spec: str) -> Target:
    if spec == HOST:
        return host()
    body = spec.split(":", 1)[1]
    body, _, triple = body.partition("@")
    cpu, _, features = body.partition(",")
    if not cpu:
        raise TargetError(f"target {spec!r} names no CPU (e.g. 'cpu:haswell')")
    for f in filter(None, features.split(",")):
        if f[0] not in "+-" or len(f) < 2:
            raise TargetError(f"target {spec!r}: feature {f!r} must start with + or -")
    triple = triple or _triple_for(spec, cpu, features)
    isa = _probe(spec, triple, cpu, features)
    return Target(spec, triple, cpu, features, isa)


def _triple_for(spec: str, cpu: str, features: str) -> str:
    """This machine's triple if LLVM knows `cpu` there, else another architecture's."""
    here = host().triple
    candidates = [here] + [t for a, t in _DEFAULT_TRIPLES.items() if a != arch_of(here)]
    for triple in candidates:
        if "processor" not in _llvm_complaints(triple, cpu, "", probe=False):
            return triple
    raise TargetError(f"target {spec!r}: LLVM knows no CPU {cpu!r} for "
                      f"{', '.join(arch_of(t) for t in candidates)}")


def _probe(spec: str, triple: str, cpu: str, features: str) -> frozenset:
    """The vector features LLVM uses for `cpu` (see _PROBES); TargetError on an unknown
    triple, CPU or feature."""
    probes = _PROBES.get(arch_of(triple))
    if probes is None:
        raise TargetError(f"target {spec!r}: braze's kernels know x86_64 and aarch64, "
                          f"not {arch_of(triple)}")
    complaints = _llvm_complaints(triple, cpu, features, probe=True)
    if complaints:
        raise TargetError(f"target {spec!r}: LLVM says: {complaints}")
    asm = _probe_assembly(triple, cpu, features)
    return frozenset(f for f, (_, _, pattern) in probes.items()
                     if re.search(pattern, asm.get(_probe_name(f), "")))


def _probe_name(feature: str) -> str:
    return "probe_" + re.sub(r"\W", "_", feature)


def _probe_module(arch: str) -> str:
    lines = ["declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)"]
    for f, (ty, body, _) in _PROBES[arch].items():
        lines.append(f"define {ty} @{_probe_name(f)}({ty} %a, {ty} %b) {{\n  {body}\n}}")
    return "\n".join(lines)



def _probe_assembly(triple: str, cpu: str, features: str) -> dict[str, str]:
    """Function name -> its assembly, for the probe module compiled for the CPU."""
    tm = target_machine_for(triple, cpu, features)
    mod = llvm.parse_assembly(_probe_module(arch_of(triple)))
    mod.triple = triple
    asm = tm.emit_assembly(mod)
    out, name = {}, None
    for line in asm.splitlines():
        m = re.match(r"^(probe_\w+):", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def _llvm_complaints(triple: str, cpu: str, features: str, probe: bool) -> str:
    """What LLVM writes to stderr (unknown CPU or feature) while making a target machine
    for the triple and compiling the probe module with it ('' when it says nothing)."""
    init()
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as e:
        raise TargetError(f"unknown triple {triple!r}: {e}") from None
    with _captured_stderr() as read:
        tm = target_machine_for(triple, cpu, features)
        mod = llvm.parse_assembly(_probe_module(arch_of(triple)) if probe and
                                  arch_of(triple) in _PROBES else "")
        mod.triple = triple
        tm.emit_assembly(mod)  # the subtarget (and its warnings) is made on first use
    return " ".join(dict.fromkeys(line.strip() for line in read().splitlines()
                                  if "not a recognized" in line))


@contextlib.contextmanager
def _captured_stderr():
    """Redirect file descriptor 2 (where LLVM warns) to a temporary file; yields a
    function that returns what was written."""
    text = {"out": ""}
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield lambda: text["out"]
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text["out"] = tmp.read().decode(errors="replace")


def target_machine_for(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    init()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="default", codemodel="large")


def target_machine(t: Target) -> llvm.TargetMachine:
    """A new target machine for `t` (an MCJIT engine takes ownership of the one it gets)."""
    return target_machine_for(t.triple, t.cpu, t.features)
