"""How a kernel's outer loop is shared among threads: `braze_parallel`, as LLVM IR.

A cluster's entry (cpu.py) calls `braze_parallel(nest, table, outer, threads)`, which
runs `nest(table, lo, hi)` over ranges [lo, hi) covering [0, outer) once, on up to
`threads` threads, and returns when all of it is done. Three definitions of it, one
picked where the code is loaded (runtime/pool.py) or linked (aot.py):

- `pool_module`: braze's own workers (started by runtime/pool.py, each running
  `braze_worker(id)`). The caller posts the job and takes ranges itself; workers that
  see it in time take ranges too. Ranges are claimed from one shared counter (guided:
  each claim takes the items left / (CLAIM_DIVISOR * threads), at least one), the
  caller from the front of the items left and the first worker from the back, so on two
  threads each one's items are one contiguous stretch, as in a static split (a GEMM's
  tiles sharing a weight panel stay on one core), wherever they meet. The caller waits
  only for ranges a worker has claimed and is running, never for a worker that has not
  shown up: when the machine is oversubscribed (more runnable threads than cores) a
  descheduled worker costs nothing but its share of the speed-up. With
  OpenMP's fork/join each kernel waited for every thread of the team to be scheduled,
  then for the slowest static half. Measured on 2 cores with other processes running
  (load 5-9), both in one process, interleaved: the fusion MLP block (0.75 ms alone)
  3.9 ms median with the pool against 27 ms with OpenMP; ResNet-50 batch 1 182 against
  892 ms; Swin-T 214 against 614 ms.
  A worker polls for the next job WORKER_SPINS times (kernels follow each other within
  microseconds), then sleeps on a futex; the caller wakes sleepers only when there are.
- `gomp_module`: GNU OpenMP's `GOMP_parallel`, each thread of the team a static share
  (shared libraries written by bridge/export_c.py, which start no workers of their own).
- `serial_module`: the caller runs it all (no threads to be had).

The claim counter holds a job's generation in its high 32 bits and the front and back
of the grains left in its low 32: a worker late for a job whose items are all claimed
(or a newer job) fails its compare-and-swap and takes nothing, so it never runs a stale
job's nest or table. Jobs have at most MAX_ITEMS items (more run on the caller alone).
One job at a time: a second caller (another Python thread running a cluster at the same
moment) finds the pool busy and runs its kernel on its own thread. Each item runs once
on one thread, and an item's arithmetic does not depend on which: results are the same
bits for any thread count.
"""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen import fpmode
from compiler.codegen.symbols import declare
from compiler.target import arch_of

PARALLEL = "braze_parallel"  # void (ptr nest, ptr table, i64 outer, i32 threads)
WORKER = "braze_worker"  # void (i32 id): worker `id` (0-based) of the pool, forever
RESET = "braze_pool_reset"  # void (): the pool idle, no worker asleep (a forked child's)

# A claim takes the items left / (CLAIM_DIVISOR * threads): large ranges first (few
# claims, each thread's items contiguous), single items at the end (the threads finish
# together even when items cost unevenly or a thread started late).
CLAIM_DIVISOR = 2
# Pause-loop iterations a worker polls for the next job before it sleeps: 200 us on Zen 4
# (a pause measured 24 ns; more on Intel cores since Skylake), far longer than the gap
# between two kernels of a call, shorter than a scheduler tick (a worker that sleeps
# costs the next job a futex wake-up, ~10-50 us, and nothing else).
WORKER_SPINS = 8192
# Pause-loop iterations (50 us on Zen 4) the caller polls for ranges still running on
# workers before it yields its core at each further poll (a worker descheduled
# mid-range needs a core).
WAIT_SPINS = 2048
# The claim counter's low 32 bits hold the front and back ends of the grains left,
# GRAIN_BITS each: a job of more items than GRAIN_MASK splits them into GRAIN_MASK
# grains (grain g: items [g outer / G, (g + 1) outer / G)), claimed as items are.
GRAIN_BITS = 16
GRAIN_MASK = (1 << GRAIN_BITS) - 1
# Items a job may have (outer * GRAIN_MASK must fit 63 bits); more run on the caller.
MAX_ITEMS = 1 << 46

# Linux futex(2): the system call's number per architecture and its private operations.
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT_PRIVATE = 128
FUTEX_WAKE_PRIVATE = 129
WAKE_ALL = (1 << 31) - 1
CACHE_LINE = 64

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()
NEST = ir.FunctionType(VOID, [PTR, I64, I64])
PARALLEL_TYPE = ir.FunctionType(VOID, [PTR, PTR, I64, I32])


def _c(n: int, ty=I64) -> ir.Constant:
    return ir.Constant(ty, n)


class _Indirect:
    """A function pointer held in a value, as llvmlite's `call` takes it: called with
    `function_type` (llvmlite reads a callee's type from the callee)."""

    def __init__(self, value, function_type: ir.FunctionType):
        self.value, self.function_type, self.type = value, function_type, value.type

    def get_reference(self) -> str:
        return self.value.get_reference()


def _size(ty) -> int:
    """Bytes of i32, i64 and pointers (the only types the pool reads atomically)."""
    return 4 if ty == I32 else 8


def has_pool(triple: str) -> bool:
    """Whether `pool_module` knows this architecture (futex: Linux on x86_64, AArch64)."""
    return "linux" in triple and arch_of(triple) in FUTEX_SYSCALL


def serial_module(triple: str) -> str:
    """`braze_parallel` that runs the whole range on the caller."""
    m = _module("braze.serial", triple)
    fn = ir.Function(m, PARALLEL_TYPE, PARALLEL)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    nest, table, outer, _ = fn.args
    b.call(_Indirect(nest, NEST), [table, _c(0), outer])
    b.ret_void()
    return str(m)


def gomp_module(triple: str, linkage: str = "external") -> str:
    """`braze_parallel` on GOMP_parallel: thread t of n runs items [t c, (t + 1) c),
    c = ceil(outer / n) (the static split braze used before its own pool)."""
    m = _module("braze.gomp", triple)
    # the job's three 8-byte words: nest, table, outer
    share = ir.Function(m, ir.FunctionType(VOID, [PTR]), "braze.gomp_share")
    share.linkage = "internal"
    b = ir.IRBuilder(share.append_basic_block("entry"))
    fields = [b.load(b.gep(share.args[0], [_c(i)], source_etype=PTR), typ=t)
              for i, t in enumerate([PTR, PTR, I64])]
    nest, table, outer = fields
    tid = b.sext(b.call(declare(m, "omp_get_thread_num", I32, []), []), I64)
    nth = b.sext(b.call(declare(m, "omp_get_num_threads", I32, []), []), I64)
    chunk = b.sdiv(b.add(outer, b.sub(nth, _c(1))), nth)
    lo = _min(b, b.mul(tid, chunk), outer)
    hi = _min(b, b.add(b.mul(tid, chunk), chunk), outer)
    saved = fpmode.save(b, triple)  # the application's thread: its mode put back
    b.call(_Indirect(nest, NEST), [table, lo, hi])
    fpmode.restore(b, triple, saved)
    b.ret_void()

    fn = ir.Function(m, PARALLEL_TYPE, PARALLEL)
    fn.linkage = linkage
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    data = b.alloca(PTR, size=_c(3))
    for i, x in enumerate(fn.args[:3]):
        slot = b.gep(data, [_c(i)], source_etype=PTR)
        b.store(x, slot if x.type == PTR else b.bitcast(slot, x.type.as_pointer()))
    gomp = declare(m, "GOMP_parallel", VOID, [PTR, PTR, I32, I32])
    b.call(gomp, [share, data, fn.args[3], _c(0, I32)])
    b.ret_void()
    return str(m)


def _module(name: str, triple: str) -> ir.Module:
    m = ir.Module(name=name)
    m.triple = triple
    return m


def _grains(b: ir.IRBuilder, outer):
    """A job's grains: min(outer, GRAIN_MASK)."""
    return _min(b, outer, _c(GRAIN_MASK))


def _min(b: ir.IRBuilder, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


class _Pool:
    """The pool's module: its shared words (each on its own cache line), `braze_parallel`,
    the claim loop `work(gen)` both sides run, and `braze_worker`."""

    def __init__(self, triple: str):
        self.m = _module("braze.pool", triple)
        self.arch = arch_of(triple)
        self.busy = self._word("braze.pool.busy", I32)  # 1 while a caller owns the pool
        self.epoch = self._word("braze.pool.epoch", I32)  # jobs posted (the futex word)
        self.sleepers = self._word("braze.pool.sleepers", I32)  # workers in futex wait
        self.ticket = self._word("braze.pool.ticket", I64)  # generation << 32 | next item
        self.done = self._word("braze.pool.done", I64)  # items of the job finished
        # the job: its nest, table, items and threads (written before the ticket)
        self.job = [self._word(f"braze.pool.{n}", t) for n, t in
                    (("nest", PTR), ("table", PTR), ("outer", I64), ("threads", I64))]
        self.work = self._work()

    def _word(self, name: str, ty) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.m, ty, name)
        g.linkage = "internal"
        g.initializer = ir.Constant(ty, None)
        g.align = CACHE_LINE
        return g

    def _field(self, b: ir.IRBuilder, i: int):
        return self.job[i]

    def _load(self, b, ptr, ty, order="acquire"):
        return b.load_atomic(ptr, order, _size(ty), typ=ty)

    def _store(self, b, value, ptr, order="release"):
        if value.type == PTR:
            # llvmlite's store_atomic takes no opaque pointer value: a plain store (the
            # job's pointers are read only by a claim that the ticket's release, stored
            # after them, makes see them; a read racing a newer job's store is discarded)
            b.store(value, ptr, align=_size(PTR))
            return
        b.store_atomic(value, ptr, order, _size(value.type))

    def _pause(self, b: ir.IRBuilder) -> None:
        if self.arch == "x86_64":
            b.call(declare(self.m, "llvm.x86.sse2.pause", VOID, []), [])
        elif self.arch == "aarch64":
            b.call(declare(self.m, "llvm.aarch64.hint", VOID, [I32]), [_c(1, I32)])  # yield

    def _futex(self, b: ir.IRBuilder, op: int, value) -> None:
        syscall = self.m.globals.get("syscall") or ir.Function(
            self.m, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        # syscall(2) reads its arguments as longs: pass 64-bit words
        b.call(syscall, [_c(FUTEX_SYSCALL[self.arch]), self.epoch, _c(op),
                         b.zext(value, I64), ir.Constant(PTR, None)])

    def _work(self) -> ir.Function:
        """void work(i64 gen, i1 back): claim and run ranges of job `gen`, from the back
        end of the grains left or from the front, until none is left."""
        fn = ir.Function(self.m, ir.FunctionType(VOID, [I64, I1]), "braze.pool.work")
        fn.linkage = "internal"
        gen, back_end = fn.args
        entry = fn.append_basic_block("entry")
        claim, check, run, leave = (fn.append_basic_block(n) for n in
                                    ("claim", "check", "run", "leave"))
        b = ir.IRBuilder(entry)
        b.branch(claim)
        b.position_at_end(claim)
        t = self._load(b, self.ticket, I64)
        b.cbranch(b.icmp_unsigned("==", b.lshr(t, _c(32)), gen), check, leave)
        b.position_at_end(check)
        nest, table, outer, threads = (self._load(b, self._field(b, i), ty, "monotonic")
                                       for i, ty in enumerate([PTR, PTR, I64, I64]))
        front = b.and_(b.lshr(t, _c(GRAIN_BITS)), _c(GRAIN_MASK))
        back = b.and_(t, _c(GRAIN_MASK))
        with b.if_then(b.icmp_unsigned(">=", front, back)):
            b.branch(leave)
        size = b.udiv(b.sub(back, front), b.mul(threads, _c(CLAIM_DIVISOR)))
        size = b.select(b.icmp_unsigned("<", size, _c(1)), _c(1), size)
        # the front end's claim adds size << GRAIN_BITS; the back end's takes size off
        new = b.select(back_end, b.sub(t, size), b.add(t, b.shl(size, _c(GRAIN_BITS))))
        first = b.select(back_end, b.sub(back, size), front)
        pair = b.cmpxchg(self.ticket, t, new, "acq_rel", "acquire")
        b.cbranch(b.extract_value(pair, 1), run, claim)
        b.position_at_end(run)
        grains = _grains(b, outer)
        item = lambda g: b.udiv(b.mul(g, outer), grains)  # noqa: E731
        b.call(_Indirect(nest, NEST), [table, item(first), item(b.add(first, size))])
        b.atomic_rmw("add", self.done, size, "release")
        b.branch(claim)
        b.position_at_end(leave)
        b.ret_void()
        return fn

    def parallel(self) -> None:
        fn = ir.Function(self.m, PARALLEL_TYPE, PARALLEL)
        nest, table, outer, threads = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        alone = b.or_(b.icmp_signed("<=", threads, _c(1, I32)),
                      b.or_(b.icmp_unsigned("<=", outer, _c(1)),
                            b.icmp_unsigned(">", outer, _c(MAX_ITEMS))))
        whole = _Indirect(nest, NEST)
        with b.if_then(alone):
            b.call(whole, [table, _c(0), outer])
            b.ret_void()
        owned = b.extract_value(b.cmpxchg(self.busy, _c(0, I32), _c(1, I32), "acquire",
                                          "monotonic"), 1)
        with b.if_then(b.not_(owned)):  # another caller's job is running: run this one here
            b.call(whole, [table, _c(0), outer])
            b.ret_void()
        for i, x in enumerate([nest, table, outer, b.sext(threads, I64)]):
            self._store(b, x, self._field(b, i), "monotonic")
        self._store(b, _c(0), self.done, "monotonic")
        gen = b.and_(b.add(b.lshr(self._load(b, self.ticket, I64, "monotonic"), _c(32)),
                           _c(1)), _c(0xFFFFFFFF))
        grains = _grains(b, outer)
        self._store(b, b.or_(b.shl(gen, _c(32)), grains), self.ticket, "seq_cst")
        b.atomic_rmw("add", self.epoch, _c(1, I32), "seq_cst")
        with b.if_then(b.icmp_signed(">", self._load(b, self.sleepers, I32, "seq_cst"),
                                     _c(0, I32))):
            self._futex(b, FUTEX_WAKE_PRIVATE, _c(WAKE_ALL, I32))
        b.call(self.work, [gen, ir.Constant(I1, 0)])
        self._wait_done(b, fn, grains)
        self._store(b, _c(0, I32), self.busy)
        b.ret_void()

    def _wait_done(self, b: ir.IRBuilder, fn: ir.Function, grains) -> None:
        """Poll until every grain is done; past WAIT_SPINS polls, yield the core at each."""
        pre = b.block
        poll, idle, out = (fn.append_basic_block(n) for n in ("poll", "idle", "finished"))
        b.branch(poll)
        b.position_at_end(poll)
        spins = b.phi(I64)
        spins.add_incoming(_c(0), pre)
        b.cbranch(b.icmp_unsigned("==", self._load(b, self.done, I64), grains), out, idle)
        b.position_at_end(idle)
        self._pause(b)
        with b.if_then(b.icmp_unsigned(">=", spins, _c(WAIT_SPINS))):
            b.call(declare(self.m, "sched_yield", I32, []), [])
        spins.add_incoming(b.add(spins, _c(1)), b.block)
        b.branch(poll)
        b.position_at_end(out)

    def reset(self) -> None:
        """void braze_pool_reset(): what a forked child calls before it starts its own
        workers (it may have been forked while a job ran or a worker slept)."""
        fn = ir.Function(self.m, ir.FunctionType(VOID, []), RESET)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        self._store(b, _c(0, I32), self.busy, "seq_cst")
        self._store(b, _c(0, I32), self.sleepers, "seq_cst")
        b.ret_void()

    def worker(self) -> None:
        """void braze_worker(i32 id): wait for a job (poll, then sleep), take part in it
        if the job asks for more than id + 1 threads, wait for the next."""
        fn = ir.Function(self.m, ir.FunctionType(VOID, [I32]), WORKER)
        b_id = fn.args[0]
        entry = fn.append_basic_block("entry")
        wait, sleep, got = (fn.append_basic_block(n) for n in ("wait", "sleep", "got"))
        b = ir.IRBuilder(entry)
        first = self._load(b, self.epoch, I32)
        b.branch(wait)
        b.position_at_end(wait)
        seen, spins = b.phi(I32), b.phi(I64)
        seen.add_incoming(first, entry)
        spins.add_incoming(_c(0), entry)
        now = self._load(b, self.epoch, I32)
        poll = fn.append_basic_block("poll")
        b.cbranch(b.icmp_unsigned("!=", now, seen), got, poll)
        b.position_at_end(poll)
        self._pause(b)
        more = b.add(spins, _c(1))
        b.cbranch(b.icmp_unsigned("<", more, _c(WORKER_SPINS)), wait, sleep)
        seen.add_incoming(seen, poll)
        spins.add_incoming(more, poll)
        b.position_at_end(sleep)
        b.atomic_rmw("add", self.sleepers, _c(1, I32), "seq_cst")
        with b.if_then(b.icmp_unsigned("==", self._load(b, self.epoch, I32, "seq_cst"),
                                       seen)):
            self._futex(b, FUTEX_WAIT_PRIVATE, seen)
        b.atomic_rmw("sub", self.sleepers, _c(1, I32), "seq_cst")
        seen.add_incoming(seen, b.block)
        spins.add_incoming(_c(0), b.block)
        b.branch(wait)
        b.position_at_end(got)
        threads = self._load(b, self._field(b, 3), I64, "monotonic")
        wanted = b.icmp_signed("<", b.add(b.sext(b_id, I64), _c(1)), threads)
        with b.if_then(wanted):  # even ids from the back, odd ones from the front
            b.call(self.work, [b.lshr(self._load(b, self.ticket, I64), _c(32)),
                               b.trunc(b.xor(b_id, _c(1, I32)), I1)])
        # a worker the job did not want goes straight back to sleep (no polling)
        seen.add_incoming(now, b.block)
        spins.add_incoming(b.select(wanted, _c(0), _c(WORKER_SPINS)), b.block)
        b.branch(wait)


def pool_module(triple: str) -> str:
    """The pool's `braze_parallel`, `braze_worker` and `braze_pool_reset` (has_pool(triple)
    must hold)."""
    p = _Pool(triple)
    p.parallel()
    p.worker()
    p.reset()
    return str(p.m)
