#!/usr/bin/env python3
"""Spillway's oversubscription check on a real GPU, with PyTorch.

Run it under `spillway run --memory-limit Q --oversubscribe` (oversubscribe.sh
does that, and builds what it needs). It allocates tensors summing to 1.5x the
quota Q in equal chunks, alternating float32 and bfloat16, and checks:

  - the shim is in front of PyTorch's runtime: cudaMemGetInfo's total is Q;
  - every chunk is allocated; the bytes the driver reports as device memory
    (or managed memory preferring the device) sum to at most Q, and the rest
    are in host memory (managed memory preferring the CPU, pinned memory, or
    virtual memory's host granules: the driver is asked at every 2 MiB, as
    a chunk may be part device, part host);
  - cudaMemGetInfo's free excludes host memory: at most Q minus device chunks;
  - the CPU reaches host granules at their addresses where the driver grants
    it (cuMemGetAccess): it reads and writes bytes of the first and last host
    granule of each chunk, guarded so that a fault is a FAIL and no crash,
    as PyTorch's copies of them show; a driver that refuses is reported, not
    failed (the shim's documented fallback);
  - a matmul of a spilled chunk with another chunk (both ways round, for each
    dtype that has a spilled chunk) equals the CPU's result;
  - every chunk reads back bit for bit; a GPU reduction over a spilled chunk
    equals the CPU's exact sum;
  - the device memory NVML attributes to this process never exceeds
    Q + the CUDA context's overhead (measured in this process before anything
    is allocated) + a slack for kernels loaded later; nor does the growth of
    the device's used memory over the same baseline exceed Q + the slack;
  - every chunk is freed and cudaMemGetInfo's free comes back.

It also measures the bandwidth of a kernel reading a spilled chunk against a
pinned host-to-device copy of the same size (and a read of device memory),
and prints them in GB/s: figures to report, never a pass/fail criterion.

The patterns are exact in both dtypes: every element is k/64 with |k| <= 62,
so the float32 matmul over K = 4096 is exact in float32 (every partial sum is
a multiple of 2^-12 below 2^12 in magnitude) and the bfloat16 one differs from
the exact result only by the final rounding to bfloat16.

With --probe it only says whether the check can run here: one line, `ready`
or `SKIP: <why>`, exit status 0. Without a GPU or PyTorch a normal run prints
that same SKIP line and exits 0. Otherwise it exits 0 when every check passed,
1 when one failed, 2 on bad arguments.
"""

import argparse
import ctypes
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

ROW = 4096  # elements per row of every chunk's 2-D view: the matmul's K
MATMUL_N = 256  # rows of the second operand: the matmul's N
PATTERN_RANGE = 63  # row and column terms are (k - 31) / 64, k in [0, 63)
TIMED_REPEATS = 10  # kernels or copies between two CUDA events
TIMINGS = 3  # event pairs per bandwidth figure; the median is reported

# CUDA driver API values (cuda.h), for classifying where a pointer lives.
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION = 2
CU_MEMORYTYPE_HOST = 1
CU_MEMORYTYPE_DEVICE = 2
CU_DEVICE_CPU = -1
CU_MEM_LOCATION_TYPE_HOST_NUMA = 3
CU_MEM_ACCESS_FLAGS_PROT_NONE = 0
CU_MEM_ACCESS_FLAGS_PROT_READ = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
ACCESS_NAMES = {CU_MEM_ACCESS_FLAGS_PROT_NONE: "none", CU_MEM_ACCESS_FLAGS_PROT_READ: "read",
                CU_MEM_ACCESS_FLAGS_PROT_READWRITE: "read-write"}


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


# The host NUMA node the shim grants the CPU host granules on.
CPU_LOCATION = CUmemLocation(CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)

# Where a chunk lives, as reported by the driver.
TIER_DEVICE = "device"  # cudaMalloc'd device memory
TIER_MANAGED_DEVICE = "managed, prefers the device"  # promoted
TIER_MANAGED_HOST = "managed, prefers the CPU"  # spilled
TIER_MANAGED_ANY = "managed, no preferred location"
TIER_HOST = "host (pinned, or host granules)"  # spilled
TIER_MIXED = "device and host granules"  # partly spilled
SPILLED_TIERS = (TIER_MANAGED_HOST, TIER_HOST, TIER_MIXED)
TIER_LETTER = {TIER_DEVICE: "D", TIER_MANAGED_DEVICE: "P", TIER_MANAGED_HOST: "S",
               TIER_MANAGED_ANY: "?", TIER_HOST: "H", TIER_MIXED: "M"}
# With virtual memory the shim spills per granule of this size, so one
# allocation may be part device memory, part host memory.
GRANULE = 2 * MiB
# Bytes of a host granule the CPU reads and writes at its address: one page,
# which a pipe takes in one piece (PIPE_BUF).
CPU_SAMPLE = 4 * KiB

SIZE_UNITS = {"": 1, "b": 1,
              "k": KiB, "ki": KiB, "kib": KiB, "kb": 10**3,
              "m": MiB, "mi": MiB, "mib": MiB, "mb": 10**6,
              "g": GiB, "gi": GiB, "gib": GiB, "gb": 10**9,
              "t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def parse_size(text):
    """Bytes in a size written as Spillway writes them (8GiB, 512MiB, 8G, 8GB).

    Single letters and the i/iB forms are binary, KB/MB/GB/TB decimal. Only
    whole numbers: a fraction could round differently here and in the shim.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size; expected a whole number and a unit, "
                         "such as 8GiB, 512MiB, 8G or 8GB")
    return int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]


def human(n):
    """A byte count in GiB or MiB, with the exact count."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB ({n} B)"
    return f"{n / MiB:.1f} MiB ({n} B)"


def say(line=""):
    print(line, flush=True)


class Checks:
    """The verdicts of the run, printed as they come and summed up at the end."""

    def __init__(self):
        self.results = []

    def record(self, name, ok, detail):
        self.results.append((name, ok))
        say(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
        return ok

    def summary(self):
        failed = [name for name, ok in self.results if not ok]
        if not self.results:
            return False, "FAIL: no check ran"
        if failed:
            return False, f"FAIL: {len(failed)} of {len(self.results)} checks failed: {', '.join(failed)}"
        return True, f"PASS: all {len(self.results)} checks passed"


def readiness():
    """None when a GPU and PyTorch with CUDA are here, else why not."""
    try:
        import torch
    except Exception as e:  # an ImportError, or a broken install
        return f"PyTorch is not importable ({type(e).__name__}: {e})"
    if torch.version.cuda is None:
        return f"PyTorch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU"
    return None


# ---------------------------------------------------------------- NVML

class NvmlReader:
    """Device and per-process memory through NVML's Python binding."""

    source = "NVML (pynvml)"
    interval = 0.05

    def __init__(self, uuid, index):
        import pynvml
        self.nvml = pynvml
        pynvml.nvmlInit()
        if uuid:
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())  # every binding takes bytes
        else:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    @staticmethod
    def _text(value):
        return value.decode() if isinstance(value, bytes) else str(value)

    def describe(self):
        name = self._text(self.nvml.nvmlDeviceGetName(self.handle))
        driver = self._text(self.nvml.nvmlSystemGetDriverVersion())
        return name, driver

    def device_used(self):
        info = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return info.used, info.total

    def processes(self):
        """(pid, used bytes or None) for each compute process on the device."""
        return [(p.pid, p.usedGpuMemory) for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)]


class SmiReader:
    """The same through nvidia-smi, where the Python binding is missing."""

    source = "nvidia-smi"
    interval = 0.25

    def __init__(self, uuid, index):
        self.target = uuid or str(index)
        # nvidia-smi must not run under the shim.
        self.env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def _query(self, *args):
        out = subprocess.run(["nvidia-smi", f"--id={self.target}", *args, "--format=csv,noheader,nounits"],
                             check=True, capture_output=True, text=True, env=self.env, timeout=30).stdout
        return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]

    def describe(self):
        name, driver = self._query("--query-gpu=name,driver_version")[0]
        return name, driver

    def device_used(self):
        used, total = self._query("--query-gpu=memory.used,memory.total")[0]
        return int(used) * MiB, int(total) * MiB

    def processes(self):
        procs = []
        for pid, used in self._query("--query-compute-apps=pid,used_memory"):
            procs.append((int(pid), int(used) * MiB if used.isdigit() else None))
        return procs


def open_reader(uuid, index):
    """The best available way to read the GPU's memory, and notes on the others."""
    notes = []
    try:
        return NvmlReader(uuid, index), notes
    except Exception as e:
        notes.append(f"pynvml unusable ({type(e).__name__}: {e}); using nvidia-smi")
    reader = SmiReader(uuid, index)
    reader.describe()  # fails here, not in the middle of the run
    return reader, notes


def own_usage(procs, pid):
    """This process's device memory from a process list: (bytes or None, how it was found)."""
    for p, used in procs:
        if p == pid:
            return used, "by pid"
    if len(procs) == 1:
        # In a container NVML reports host PIDs; alone on the device, it is us.
        return procs[0][1], "the only compute process on the device"
    return None, f"pid {pid} not among {len(procs)} compute processes"


class Sampler(threading.Thread):
    """Polls the GPU's memory in the background and keeps the peaks."""

    def __init__(self, reader, pid):
        super().__init__(daemon=True)
        self.reader, self.pid = reader, pid
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.peak_process = None
        self.peak_device = 0
        self.most_processes = 0
        self.samples = 0
        self.errors = []

    def sample(self):
        try:
            used, _ = self.reader.device_used()
            procs = self.reader.processes()
        except Exception as e:
            with self.lock:
                self.errors.append(f"{type(e).__name__}: {e}")
            return
        mine, _ = own_usage(procs, self.pid)
        with self.lock:
            self.samples += 1
            self.peak_device = max(self.peak_device, used)
            self.most_processes = max(self.most_processes, len(procs))
            if mine is not None:
                self.peak_process = mine if self.peak_process is None else max(self.peak_process, mine)

    def run(self):
        while not self.stop_event.wait(self.reader.interval):
            self.sample()

    def stop(self):
        self.stop_event.set()
        self.join()
        self.sample()


# ---------------------------------------------------------------- placement

class Placement:
    """Where the driver says an allocation lives, asked through libcuda.

    The shim sees these calls too (it interposes dlsym), and passes the
    ones asked here (memory type, access, host flags, a managed range's
    preferred location) to the driver, so their answers are the driver's.
    """

    def __init__(self, device):
        self.device = device
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.cuda.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        self.cuda.cuMemRangeGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                     ctypes.c_uint64, ctypes.c_size_t]
        self.cuda.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.cuda.cuMemGetAccess.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(CUmemLocation),
                                             ctypes.c_uint64]
        self.cuda.cuMemHostGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]

    def _check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.cuda.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def driver_version(self):
        v = ctypes.c_int()
        self._check(self.cuda.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        return f"{v.value // 1000}.{v.value % 1000 // 10}"

    def tier(self, ptr, size):
        """(tier, bytes in device memory, [(start, end) of each piece in host
        memory other than managed]) of the allocation [ptr, ptr + size)."""
        managed = ctypes.c_uint()
        self._check(self.cuda.cuPointerGetAttribute(ctypes.byref(managed), CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr),
                    f"cuPointerGetAttribute(IS_MANAGED, {ptr:#x})")
        if managed.value:
            where = ctypes.c_int()
            self._check(self.cuda.cuMemRangeGetAttribute(ctypes.byref(where), ctypes.sizeof(where),
                                                         CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, ptr, size),
                        f"cuMemRangeGetAttribute(PREFERRED_LOCATION, {ptr:#x})")
            if where.value == CU_DEVICE_CPU:
                return TIER_MANAGED_HOST, 0, []
            if where.value == self.device:
                return TIER_MANAGED_DEVICE, size, []
            return TIER_MANAGED_ANY, size, []
        # Host granules are host-located memory mapped among the device
        # granules, which lie at multiples of GRANULE: the driver is asked
        # once per granule the allocation overlaps, and the overlap counts.
        on_device, host = 0, []
        p, end = ptr, ptr + size
        while p < end:
            granule_end = min(end, (p // GRANULE + 1) * GRANULE)
            kind = ctypes.c_uint()
            self._check(self.cuda.cuPointerGetAttribute(ctypes.byref(kind), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p),
                        f"cuPointerGetAttribute(MEMORY_TYPE, {p:#x})")
            if kind.value == CU_MEMORYTYPE_DEVICE:
                on_device += granule_end - p
            elif kind.value == CU_MEMORYTYPE_HOST:
                host.append((p, granule_end))
            else:
                raise RuntimeError(f"pointer {p:#x} has memory type {kind.value}")
            p = granule_end
        if on_device == size:
            return TIER_DEVICE, size, host
        return (TIER_HOST if on_device == 0 else TIER_MIXED), on_device, host

    def pinned(self, ptr):
        """Whether ptr lies in page-locked memory (cudaHostAlloc: the shim's
        spill to pinned memory), which is no host granule."""
        flags = ctypes.c_uint()
        return self.cuda.cuMemHostGetFlags(ctypes.byref(flags), ptr) == 0

    def cpu_access(self, ptr):
        """The CPU's access flags to the mapping at ptr (host NUMA node 0), as
        the driver answers them: asking touches nothing."""
        flags = ctypes.c_ulonglong()
        self._check(self.cuda.cuMemGetAccess(ctypes.byref(flags), ctypes.byref(CPU_LOCATION), ptr),
                    f"cuMemGetAccess(host NUMA node 0, {ptr:#x})")
        return flags.value


# ---------------------------------------------------------------- the CPU on host granules

class GuardedTouch:
    """The CPU reading and writing memory at an address without dying of it.

    The kernel copies between the address and a pipe through this process's
    page tables, as the process's own loads and stores would, and answers
    EFAULT where they would fault: a read is write(2) from the address into
    the pipe, a write read(2) from the pipe into the address.
    """

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        for name in ("read", "write"):
            f = getattr(self.libc, name)
            f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
            f.restype = ctypes.c_ssize_t

    def _fault(self, what, addr, n, done):
        err = ctypes.get_errno()
        return OSError(err, f"{what} {n} bytes at {addr:#x}: {os.strerror(err) if done < 0 else f'only {done}'}")

    def read(self, addr, n):
        r, w = os.pipe()
        try:
            done = self.libc.write(w, addr, n)
            if done != n:
                raise self._fault("reading", addr, n, done)
            return os.read(r, n)
        finally:
            os.close(r)
            os.close(w)

    def write(self, addr, data):
        r, w = os.pipe()
        try:
            os.write(w, data)
            done = self.libc.read(r, addr, len(data))
            if done != len(data):
                raise self._fault("writing", addr, len(data), done)
        finally:
            os.close(r)
            os.close(w)


def copied_bytes(torch, chunk, offset, n):
    """n bytes of chunk at offset, copied to the host by PyTorch (cudaMemcpy)."""
    out = bytearray(n)
    torch.frombuffer(out, dtype=torch.uint8).copy_(chunk.tensor.view(-1).view(torch.uint8)[offset:offset + n])
    return bytes(out)


def first_difference(cpu, copy):
    at = next(i for i, (a, b) in enumerate(zip(cpu, copy)) if a != b)
    return f"byte {at}: the CPU's {cpu[at]:#04x}, PyTorch's copy {copy[at]:#04x}"


def touch_host_granule(torch, touch, chunk, addr, n, writable):
    """What went wrong when the CPU read (and, if writable, wrote) n bytes of
    chunk at addr, a host granule, against PyTorch's copies of the same bytes:
    ([problems], whether the CPU faulted). The chunk's bytes are put back."""
    offset = addr - chunk.tensor.data_ptr()
    where = f"{chunk.name} at {addr:#x}"
    want = copied_bytes(torch, chunk, offset, n)
    try:
        got = touch.read(addr, n)
    except OSError as e:
        return [f"{where}: the CPU faulted {e.strerror}"], True
    # Readable through the page tables: the process's own load is safe now.
    direct = ctypes.string_at(addr, n)
    problems = [f"{where}: the CPU {how} {n} bytes that differ from PyTorch's copy at {first_difference(cpu, want)}"
                for how, cpu in (("read (guarded)", got), ("read (ctypes.string_at)", direct)) if cpu != want]
    if problems or not writable:
        return problems, False
    flipped = bytes(b ^ 0xFF for b in want)
    try:
        touch.write(addr, flipped)
    except OSError as e:
        return [f"{where}: the CPU faulted {e.strerror}"], True
    seen = copied_bytes(torch, chunk, offset, n)
    if seen != flipped:
        problems.append(f"{where}: after the CPU wrote {n} bytes PyTorch's copy differs at "
                        f"{first_difference(flipped, seen)}")
    ctypes.memmove(addr, want, n)  # the pattern back, with the process's own stores
    seen = copied_bytes(torch, chunk, offset, n)
    if seen != want:
        problems.append(f"{where}: after the CPU put back {n} bytes with ctypes.memmove PyTorch's copy differs "
                        f"at {first_difference(want, seen)}")
    return problems, False


def check_cpu_access(torch, placement, checks, chunks):
    """Whether the CPU reaches the host granules of spilled chunks at their
    addresses, as the shim grants it (README, Page-granular spill).

    For the first and last host granule of each chunk: the driver's word
    (cuMemGetAccess for host NUMA node 0); where it grants read-write (or
    cannot say), the CPU reads the first CPU_SAMPLE bytes there, guarded and
    then with ctypes.string_at, writes them inverted and puts them back, each
    step compared with PyTorch's copy. Prints one `cpu-access: STATE: ...`
    line, STATE granted, refused, mixed, not asked or failed; oversubscribe.sh
    adds whether the shim warned that it fell back. Records a verdict unless
    the driver refused (the documented fallback) or nothing was asked."""
    try:
        cpu_access_of(torch, placement, checks, chunks)
    except Exception as e:
        say(f"cpu-access: failed: {type(e).__name__}: {e}")
        checks.record("cpu-access", False, f"asking or touching host granules failed: {type(e).__name__}: {e}")


def cpu_access_of(torch, placement, checks, chunks):
    picks, pinned = [], []
    for c in chunks:
        for start, end in c.host_ranges[:1] + c.host_ranges[1:][-1:]:
            if placement.pinned(start):
                pinned.append(c)
            else:
                picks.append((c, start, min(CPU_SAMPLE, end - start)))
    if not picks:
        why = (f"the host memory of {len({id(c) for c in pinned})} chunks is pinned memory "
               "(cuMemHostGetFlags answers for it), not host granules" if pinned else
               "no chunk has memory the driver calls host memory other than managed memory")
        say(f"cpu-access: not asked: {why}")
        return
    touch = GuardedTouch()
    granted, refused, other, problems, unsaid = [], [], [], [], []
    for c, addr, n in picks:
        where = f"{c.name} at {addr:#x}"
        try:
            access = placement.cpu_access(addr)
        except RuntimeError as e:
            access = None
            unsaid.append(str(e))
        if access == CU_MEM_ACCESS_FLAGS_PROT_NONE:
            refused.append(where)  # not touched: the CPU would fault
            continue
        found, faulted = touch_host_granule(torch, touch, c, addr, n, access != CU_MEM_ACCESS_FLAGS_PROT_READ)
        if access is None:
            # The driver cannot say: the guarded read settles it.
            (refused if faulted else granted).append(where)
            problems += [] if faulted else found
        elif access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            granted.append(where)
            problems += found
        else:
            other.append(f"{where}: cuMemGetAccess says {ACCESS_NAMES.get(access, access)}")
            problems += found
    sampled = f"{len(picks)} host granules of {len({id(c) for c, _, _ in picks})} chunks"
    source = "cuMemGetAccess for host NUMA node 0"
    if unsaid:
        source += f", or where it failed ({len(unsaid)} of them; {unsaid[0]}) the CPU's guarded read,"
    if refused and not granted and not other:
        say(f"cpu-access: refused: the CPU has no access to the {sampled} asked, {source} says "
            f"(first: {refused[0]}); {'only the guarded read' if unsaid else 'nothing'} touched them")
        return
    if granted and not refused and not other:
        detail = f"the CPU may read and write the {sampled} asked, {source} says"
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            detail += ", but: " + "; ".join(problems[:5]) + more
        else:
            detail += (f"; the CPU read, wrote and put back up to {CPU_SAMPLE} bytes of each at its address, "
                       "equal to PyTorch's copies")
        say(f"cpu-access: granted: {detail}")
        checks.record("cpu-access", not problems, detail)
        return
    detail = (f"of the {sampled} asked, {len(granted)} granted, {len(refused)} refused, {len(other)} otherwise, "
              f"{source} says" + "".join(f"; {x}" for x in (refused[:1] + other[:2] + problems[:3])))
    say(f"cpu-access: mixed: {detail}")
    checks.record("cpu-access", False, f"the CPU's access differs between host granules, where the shim "
                                       f"grants each read-write or none: {detail}")


# ---------------------------------------------------------------- patterns

def pattern_terms(torch, index, rows, dtype):
    """The row and column terms of chunk `index`'s pattern, exact in dtype.

    Element (r, c) of a chunk's (rows, ROW) view is row[r] + col[c]. The row
    term hashes the row number and the chunk index, so no page of one chunk
    or row looks like another's; the column term varies within a page.
    """
    r = torch.arange(rows, dtype=torch.int64)
    hashed = (r * 2654435761 + (index + 1) * 40503) % (1 << 32) // (1 << 16)
    row = hashed % PATTERN_RANGE - 31
    c = torch.arange(ROW, dtype=torch.int64)
    col = (c * 37 + index * 11) % PATTERN_RANGE - 31
    return (row.to(torch.float64) / 64).to(dtype), (col.to(torch.float64) / 64).to(dtype)


def expected_rows(torch, index, rows, dtype, r0, r1, out_dtype=None):
    """Rows r0..r1 of chunk `index`'s pattern, on the CPU."""
    row, col = pattern_terms(torch, index, rows, dtype)
    block = row[r0:r1, None] + col[None, :]
    return block if out_dtype is None else block.to(out_dtype)


def exact_sum(torch, index, rows, dtype):
    """The exact sum of chunk `index`'s pattern: ROW * sum(row) + rows * sum(col)."""
    row, col = pattern_terms(torch, index, rows, dtype)
    return ROW * row.double().sum().item() + rows * col.double().sum().item()


class Chunk:
    def __init__(self, torch, index, nbytes, dtype, device):
        self.index, self.nbytes, self.dtype = index, nbytes, dtype
        self.rows = nbytes // (ROW * torch.tensor([], dtype=dtype).element_size())
        self.tensor = torch.empty((self.rows, ROW), dtype=dtype, device=device)
        self.tier, self.device_bytes, self.host_ranges = None, None, []

    def locate(self, placement):
        self.tier, self.device_bytes, self.host_ranges = placement.tier(self.tensor.data_ptr(), self.nbytes)

    def fill(self, torch):
        row, col = pattern_terms(torch, self.index, self.rows, self.dtype)
        device = self.tensor.device
        torch.add(row.to(device)[:, None], col.to(device)[None, :], out=self.tensor)

    @property
    def spilled(self):
        return self.tier in SPILLED_TIERS

    @property
    def name(self):
        return f"chunk {self.index} ({str(self.dtype).replace('torch.', '')}, {self.tier})"


# ---------------------------------------------------------------- bandwidth

def gbps(torch, nbytes, op):
    """GB/s of `op` moving nbytes, from CUDA events around TIMED_REPEATS runs."""
    op()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(TIMINGS):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(TIMED_REPEATS):
            op()
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3 / TIMED_REPEATS)
    return nbytes / statistics.median(seconds) / 1e9


def reader_op(torch, tensor):
    """A kernel that reads every byte of tensor: a float64 sum into a fixed output."""
    flat = tensor.view(-1)
    out = torch.empty((), dtype=torch.float64, device=tensor.device)
    return lambda: torch.sum(flat, dim=0, dtype=torch.float64, out=out)


# ---------------------------------------------------------------- the run

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", action="store_true", help="only say `ready` or `SKIP: <why>`")
    p.add_argument("--quota", default="8GiB", help="the quota spillway run was given (default 8GiB)")
    p.add_argument("--chunk", default="512MiB", help="size of each tensor (default 512MiB)")
    p.add_argument("--slack", default="256MiB",
                   help="device memory allowed beyond quota + context for kernels loaded later and "
                        "library-internal allocations (default 256MiB)")
    args = p.parse_args(argv)
    try:
        args.quota_bytes = parse_size(args.quota)
        args.chunk_bytes = parse_size(args.chunk)
        args.slack_bytes = parse_size(args.slack)
    except ValueError as e:
        p.error(str(e))
    if args.chunk_bytes < 16 * MiB or args.chunk_bytes % MiB:
        p.error(f"--chunk {args.chunk}: must be a whole number of MiB, at least 16MiB")
    if args.quota_bytes < 2 * args.chunk_bytes:
        p.error(f"--quota {args.quota}: must hold at least two chunks of {args.chunk}")
    return args


def main(argv):
    args = parse_args(argv)
    why = readiness()
    if args.probe:
        say("ready" if why is None else f"SKIP: {why}")
        return 0
    if why is not None:
        say(f"SKIP: {why}")
        return 0
    import torch
    return run(torch, args)


def run(torch, args):
    checks = Checks()
    quota, chunk_bytes, slack = args.quota_bytes, args.chunk_bytes, args.slack_bytes
    count = math.ceil(1.5 * quota / chunk_bytes)
    total = count * chunk_bytes
    pid = os.getpid()
    started = time.monotonic()

    say("== Spillway GPU check: oversubscription to host memory ==")
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:true" in alloc_conf.replace(" ", "").lower():
        # Expandable segments map memory with the driver's cuMemCreate: the
        # placement and release steps below know only the runtime's
        # allocations.
        say(f"FAIL  setup: PYTORCH_CUDA_ALLOC_CONF={alloc_conf!r} enables expandable segments; unset it")
        return 1
    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") != "1"
    if not os.environ.get("LD_PRELOAD", ""):
        say("note: LD_PRELOAD is empty: this is not running under `spillway run`")

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid and not uuid.startswith("GPU-"):
        uuid = "GPU-" + uuid
    try:
        reader, notes = open_reader(uuid, index)
    except Exception as e:
        say(f"FAIL  setup: cannot read the GPU's memory: no pynvml and nvidia-smi failed ({e})")
        return 1
    for note in notes:
        say(f"note: {note}")

    # Before this process creates its CUDA context.
    device_before, device_total = reader.device_used()
    name, driver = reader.describe()
    torch.cuda.init()
    torch.zeros(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    placement = Placement(index)
    device_ctx, _ = reader.device_used()
    process_ctx, found = own_usage(reader.processes(), pid)
    context_overhead = process_ctx if process_ctx is not None else device_ctx - device_before

    say(f"gpu: {name} ({uuid or 'index ' + str(index)}), {human(device_total)}, "
        f"driver {driver} (CUDA {placement.driver_version()})")
    say(f"torch {torch.__version__} (CUDA runtime {torch.version.cuda}), python {sys.version.split()[0]}, "
        f"memory read with {reader.source}")
    say(f"quota: {human(quota)}; chunks: {count} x {human(chunk_bytes)} alternating float32/bfloat16 "
        f"= {human(total)} ({total / quota:.2f}x the quota)")
    say(f"PyTorch caching allocator: {'on' if caching else 'off (PYTORCH_NO_CUDA_MEMORY_CACHING=1)'}; "
        f"SPILLWAY_SPILL={os.environ.get('SPILLWAY_SPILL', '(default)')}, "
        f"SPILLWAY_HOST_LIMIT={os.environ.get('SPILLWAY_HOST_LIMIT', '(default)')}")
    say(f"CUDA context overhead: {human(context_overhead)} "
        f"({'NVML per-process, ' + found if process_ctx is not None else 'growth of device used memory'}); "
        f"device used before the context {human(device_before)}")
    allowance = context_overhead + slack
    say(f"residency allowance: quota + context overhead + slack {human(slack)} = {human(quota + allowance)} "
        f"per process; device growth over the context baseline at most quota + slack = {human(quota + slack)}")

    free_device = device_total - device_ctx
    if quota + allowance > free_device:
        say(f"FAIL  setup: quota {human(quota)} plus allowance {human(allowance)} exceeds the GPU's free "
            f"memory {human(free_device)}; pass a smaller quota")
        return 1
    host_available = meminfo_available()
    host_needed = total - quota + 4 * GiB  # spilled chunks, CPU references, pinned buffer
    if host_available is not None and host_available < host_needed:
        say(f"FAIL  setup: {human(host_available)} of host memory available, the run needs about "
            f"{human(host_needed)}; pass a smaller quota")
        return 1

    _, total0 = torch.cuda.mem_get_info()
    if not checks.record("interposed", total0 == quota,
                         f"cudaMemGetInfo total = {human(total0)}, quota {human(quota)}"
                         + ("" if total0 == quota else
                            " (the shim is not in front of PyTorch's CUDA runtime, or has another quota)")):
        say(checks.summary()[1])
        return 1

    torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    sampler = Sampler(reader, pid)
    sampler.start()
    chunks = []
    try:
        bandwidth = warm_up(torch, placement, checks, chunk_bytes)
        free_before, _ = torch.cuda.mem_get_info()  # the warm-up's kernels and library workspaces stay
        chunks = allocate(torch, placement, checks, count, chunk_bytes, quota)
        if chunks:
            check_mem_get_info(torch, checks, chunks, quota)
            check_cpu_access(torch, placement, checks, chunks)
            check_matmuls(torch, checks, chunks)
            check_contents(torch, checks, chunks)
            bandwidth.update(measure_spilled_read(torch, placement, checks, chunks))
    finally:
        torch.cuda.synchronize()
        sampler.stop()
    check_residency(checks, sampler, quota, allowance, slack, device_ctx)
    if chunks:
        check_release(torch, checks, chunks, free_before)
    report_bandwidth(bandwidth)
    ok, line = checks.summary()
    say(f"{line} ({time.monotonic() - started:.0f} s)")
    return 0 if ok else 1


def meminfo_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * KiB
    except OSError:
        pass
    return None


def warm_up(torch, placement, checks, chunk_bytes):
    """Loads the kernels the run uses and measures the reference bandwidths
    on device memory, while the quota is still empty."""
    figures = {}
    try:
        single = Chunk(torch, 0, chunk_bytes, torch.float32, "cuda")
        single.locate(placement)
        half = Chunk(torch, 1, chunk_bytes, torch.bfloat16, "cuda")
        for c in (single, half):
            c.fill(torch)
            (c.tensor @ c.tensor[:MATMUL_N].t()).float().sum().item()
            reader_op(torch, c.tensor)()
        torch.cuda.synchronize()
        if single.tier == TIER_DEVICE:
            host = torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True)
            target = single.tensor.view(-1).view(torch.uint8)
            figures["pinned copy"] = gbps(torch, chunk_bytes, lambda: target.copy_(host, non_blocking=True))
            figures["device read"] = gbps(torch, chunk_bytes, reader_op(torch, single.tensor))
            del host
        else:
            say(f"note: the warm-up chunk is {single.tier}, not device memory: no reference bandwidth")
        del single, half
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as e:
        checks.record("warm-up", False, f"{type(e).__name__}: {e}")
    return figures


def allocate(torch, placement, checks, count, chunk_bytes, quota):
    chunks = []
    started = time.monotonic()
    try:
        for i in range(count):
            dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
            chunks.append(Chunk(torch, i, chunk_bytes, dtype, "cuda"))
    except Exception as e:
        checks.record("allocate", False, f"chunk {len(chunks)} of {count} refused: {type(e).__name__}: {e}")
        return []
    try:
        for c in chunks:
            c.fill(torch)
        torch.cuda.synchronize()
    except Exception as e:
        checks.record("allocate", False, f"filling the chunks failed: {type(e).__name__}: {e}")
        return []
    checks.record("allocate", True, f"{count} chunks, {human(count * chunk_bytes)}, allocated and filled "
                                    f"in {time.monotonic() - started:.1f} s")
    return chunks if classify(placement, checks, chunks, quota) else []


def classify(placement, checks, chunks, quota):
    try:
        for c in chunks:
            c.locate(placement)
    except Exception as e:
        checks.record("placement", False, f"asking the driver where a chunk lives failed: {e}")
        return False
    on_device = sum(c.device_bytes for c in chunks)
    spilled = sum(c.nbytes - c.device_bytes for c in chunks)
    tiers = sorted({c.tier for c in chunks})
    say("placement: " + "".join(TIER_LETTER[c.tier] for c in chunks)
        + "  (" + ", ".join(f"{TIER_LETTER[t]} = {t}" for t in tiers) + ")")
    total = on_device + spilled
    checks.record("placement", on_device <= quota and spilled > 0,
                  f"{human(on_device)} on the device (at most the quota {human(quota)}), "
                  f"{human(spilled)} spilled to host memory (at least {human(max(0, total - quota))})"
                  + ("; managed chunks without a preferred location count as device"
                     if TIER_MANAGED_ANY in tiers else ""))
    return True


def check_mem_get_info(torch, checks, chunks, quota):
    free, total = torch.cuda.mem_get_info()
    on_device = sum(c.device_bytes for c in chunks)
    checks.record("mem-get-info", total == quota and free <= quota - min(on_device, quota),
                  f"total {human(total)}, free {human(free)}: at most quota - device chunks "
                  f"{human(max(0, quota - on_device))} (host memory is not counted as free)")


def pick_pairs(chunks):
    """For each dtype with a spilled chunk: (spilled, partner) where the
    partner is a device chunk of that dtype if there is one."""
    pairs = []
    for dtype in sorted({c.dtype for c in chunks}, key=str):
        spilled = [c for c in chunks if c.dtype == dtype and c.spilled]
        if not spilled:
            continue
        resident = [c for c in chunks if c.dtype == dtype and not c.spilled]
        others = resident or [c for c in spilled if c is not spilled[0]] or spilled
        pairs.append((spilled[0], others[0]))
    return pairs


def check_matmuls(torch, checks, chunks):
    pairs = pick_pairs(chunks)
    if not pairs:
        checks.record("matmul", False, "no spilled chunk to multiply")
        return
    for s, d in pairs:
        # float32: exact (see the module comment); bfloat16: the final rounding
        # to bfloat16 (2^-9 relative) with room for a different reduction.
        rtol, atol = (1e-5, 1e-4) if s.dtype == torch.float32 else (2.0**-6, 2.0**-4)
        for a, b in ((s, d), (d, s)):
            label = f"matmul {a.name} x {b.name} rows 0..{MATMUL_N}"
            try:
                got = (a.tensor @ b.tensor[:MATMUL_N].t()).float().cpu()
                want = (expected_rows(torch, a.index, a.rows, a.dtype, 0, a.rows, torch.float32)
                        @ expected_rows(torch, b.index, b.rows, b.dtype, 0, MATMUL_N, torch.float32).t())
                err = (got - want).abs()
                bad = int((err > atol + rtol * want.abs()).sum())
                checks.record("matmul", bad == 0,
                              f"{label}: {tuple(got.shape)}, max |error| {err.max().item():.3g}, "
                              f"{bad} elements beyond rtol {rtol:g} atol {atol:g}")
            except Exception as e:
                checks.record("matmul", False, f"{label}: {type(e).__name__}: {e}")


def check_contents(torch, checks, chunks):
    """Every chunk copied back to the host in blocks and compared bit for bit."""
    bad = []
    started = time.monotonic()
    try:
        for c in chunks:
            step = max(1, (64 * MiB) // (ROW * c.tensor.element_size()))
            for r0 in range(0, c.rows, step):
                r1 = min(c.rows, r0 + step)
                if not torch.equal(c.tensor[r0:r1].cpu(), expected_rows(torch, c.index, c.rows, c.dtype, r0, r1)):
                    bad.append(f"{c.name} rows {r0}..{r1}")
                    break
    except Exception as e:
        checks.record("contents", False, f"reading back failed: {type(e).__name__}: {e}")
        return
    spilled = sum(1 for c in chunks if c.spilled)
    checks.record("contents", not bad,
                  f"{len(chunks)} chunks ({spilled} spilled) read back in {time.monotonic() - started:.1f} s"
                  + (": all intact" if not bad else ": differ at " + "; ".join(bad[:5])))


def measure_spilled_read(torch, placement, checks, chunks):
    # Where everything lives now: the shim may have promoted chunks since.
    before = {c.index: c.tier for c in chunks}
    try:
        for c in chunks:
            c.locate(placement)
    except Exception as e:
        checks.record("gpu-read", False, f"asking the driver where a chunk lives failed: {e}")
        return {}
    moved = [f"{c.index}: {before[c.index]} -> {c.tier}" for c in chunks if c.tier != before[c.index]]
    if moved:
        say(f"note: chunks moved since allocation: {'; '.join(moved)}")
    # Wholly in host memory if one is, so that the read is the interconnect's
    # alone; float32 if one is.
    spilled = sorted((c for c in chunks if c.spilled), key=lambda c: (c.tier == TIER_MIXED, c.dtype != torch.float32))
    target = spilled[0] if spilled else None
    if target is None:
        say("note: no chunk is spilled any more: spilled reads not measured")
        return {}
    try:
        got = target.tensor.view(-1).sum(dtype=torch.float64).item()
        want = exact_sum(torch, target.index, target.rows, target.dtype)
        checks.record("gpu-read", got == want,
                      f"float64 sum over {target.name} on the GPU = {got!r}, exact {want!r}")
        return {"spilled read": gbps(torch, target.nbytes, reader_op(torch, target.tensor)),
                "spilled chunk": target.name}
    except Exception as e:
        checks.record("gpu-read", False, f"{target.name}: {type(e).__name__}: {e}")
        return {}


def check_residency(checks, sampler, quota, allowance, slack, device_ctx):
    if sampler.errors:
        say(f"note: {len(sampler.errors)} memory samples failed, first: {sampler.errors[0]}")
    measured = []
    if sampler.peak_process is not None:
        measured.append(checks.record(
            "residency-process", sampler.peak_process <= quota + allowance,
            f"peak device memory of this process {human(sampler.peak_process)} "
            f"<= quota + allowance {human(quota + allowance)} ({sampler.samples} samples)"))
    else:
        say("note: NVML gives no per-process figure here; only the device-wide growth is checked")
    if sampler.most_processes <= 1:
        growth = sampler.peak_device - device_ctx
        measured.append(checks.record(
            "residency-device", growth <= quota + slack,
            f"peak growth of the device's used memory over the context baseline {human(growth)} "
            f"<= quota + slack {human(quota + slack)} (counts managed pages migrated to the device)"))
    else:
        say(f"note: {sampler.most_processes} compute processes shared the device: "
            "device-wide growth not checked")
    if not measured:
        checks.record("residency", False, "no usable measurement of device memory")


def check_release(torch, checks, chunks, free_before):
    try:
        for c in chunks:
            c.tensor = None
        chunks.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
    except Exception as e:
        checks.record("release", False, f"freeing the chunks failed: {type(e).__name__}: {e}")
        return
    checks.record("release", free >= free_before - 64 * MiB,
                  f"every chunk freed; cudaMemGetInfo free {human(free)}, "
                  f"before allocating {human(free_before)} (64 MiB tolerance)")


def report_bandwidth(figures):
    spilled, pinned = figures.get("spilled read"), figures.get("pinned copy")
    if "device read" in figures:
        say(f"bandwidth: device read (float64 sum of a device chunk) {figures['device read']:.1f} GB/s")
    if pinned is not None:
        say(f"bandwidth: pinned host-to-device copy {pinned:.1f} GB/s")
    if spilled is not None:
        say(f"bandwidth: GPU reading spilled memory in place ({figures['spilled chunk']}) {spilled:.1f} GB/s")
    if spilled is not None and pinned is not None:
        say(f"bandwidth: spilled read / pinned copy = {spilled / pinned:.2f}")
        if spilled > 2 * pinned:
            say("note: spilled memory read faster than the interconnect copies: "
                "its pages were probably migrated to the device (see the residency checks)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
