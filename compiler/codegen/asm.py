"""Reading LLVM's verbose assembly: innermost loops, and the stack spills inside them.

A micro-kernel that needs more vector registers than its target has spills
accumulators to the stack inside its K loop, which costs a load and a store per
FMA. LLVM's verbose assembly (llvm_cpu.emit_assembly) marks every block's loop
("=>  This Inner Loop Header: Depth=2", "in Loop: Header=BB0_4 Depth=2") and every
spill and reload ("# 64-byte Spill", "// 16-byte Folded Reload"), on x86 and AArch64
alike, so both can be counted without a disassembler.
"""

from __future__ import annotations

import re

_LABEL = re.compile(r"^(\.?L?(BB\d+_\d+)|[#/]+ %bb\.\d+):")
_INNER_HEADER = re.compile(r"This Inner Loop Header")
_IN_LOOP = re.compile(r"in Loop: Header=(BB\d+_\d+)")
_SPILL = re.compile(r"\b(Spill|Reload)\b")
# Floating-point multiplies: x86 FMA and SSE, AArch64 NEON (by element or by vector).
_MULTIPLY = re.compile(r"^\s+(v?fmadd\w*|v?mulps|fmla|fmul)\b")


def _blocks(asm: str) -> list[tuple[str | None, list[str]]]:
    """(the block's BB name or None, its lines) in order, from each label to the next."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in asm.splitlines():
        m = _LABEL.match(line)
        if m:
            blocks.append((m.group(2), [line]))
        else:
            blocks[-1][1].append(line)
    return blocks


def _annotations(lines: list[str]) -> list[str]:
    """A block's label line and the comment lines right after it (its loop nesting)."""
    out = lines[:1]
    for line in lines[1:]:
        if not re.match(r"^\s+(#|//)", line):
            break
        out.append(line)
    return out


def inner_loops(asm: str) -> dict[str, list[str]]:
    """Innermost loops of verbose assembly: header block name -> the lines of its blocks."""
    loops: dict[str, list[str]] = {}
    for name, lines in _blocks(asm):
        head = "\n".join(_annotations(lines))
        if name is not None and _INNER_HEADER.search(head):
            loops[name] = list(lines)
            continue
        m = _IN_LOOP.search(head)
        if m and m.group(1) in loops:
            loops[m.group(1)].extend(lines)
    return loops


def multiplies(lines: list[str]) -> int:
    """Floating-point multiply (or FMA) instructions among `lines`."""
    return sum(bool(_MULTIPLY.match(line)) for line in lines)


def spills(lines: list[str]) -> int:
    """Stack spills and reloads among `lines` (LLVM's verbose comments)."""
    return sum(bool(_SPILL.search(line)) for line in lines)


def loop_spills(asm: str, block: str | None = None) -> dict[str, tuple[int, int]]:
    """For each innermost loop that multiplies floats (whose header is the IR block named
    `block`, e.g. gemm.K_LOOP, the micro-kernel's K loop; any, if None): header ->
    (multiplies, spills and reloads)."""
    out = {}
    for name, lines in inner_loops(asm).items():
        named = block is None or re.search(rf"[#/] %{re.escape(block)}\b", lines[0])
        if named and multiplies(lines):
            out[name] = (multiplies(lines), spills(lines))
    return out
