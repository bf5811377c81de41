"""A GPU session in one command (run by scripts/gpu_session.sh; Python's standard library only,
since it runs before polyft's dependencies are installed).

    scripts/gpu_session.sh --rehearse   # here, without a GPU: every stage up to the first kernel launch
    scripts/gpu_session.sh              # on the GPU machine (.whl and .gpu-cache carried)
    scripts/gpu_session.sh --resume     # again after a cut-off run: keeps the benchmark rows measured
    PYTHON=python3.12 scripts/gpu_session.sh --rehearse   # also leaves a PyCUDA build the GPU machine can use

Stages, each printed with its start, its time and what is left of the budget (--budget, 420 s):
locate (the CUDA root from nvcc's own answer; cuda.h, Python.h, libcuda; says what is missing),
pins (the carried files' sha256 against scripts/gpu_pins.txt), install (the wheels and cgen
into .gpu-session/site-cp<version>, polyft itself), pycuda (built from its sdist with curand off, linked
against the driver's libcuda or a stub; the whole log kept, the exit status checked; a build
carried in .gpu-cache for this Python and CUDA is used instead when it imports), import,
cubins (every module of the GPU tests and benchmark compiled into .gpu-cache, which the run
reuses). A rehearsal stops there. On the GPU: smoke (one small program), bench
(experiments/gpu_bench.py --paper, each row written as it finishes, stopping at the budget),
tests (pytest -m gpu), sanitize (compute-sanitizer racecheck and synccheck on small shapes).
When time is short, sanitize is dropped first, then tests; benchmark rows never: a run
stopped at the budget goes on with --resume. Logs go to $OUT (else gpu-out/): session.log,
pycuda-build.log, cubins.log, gpu-bench.log, gpu_bench.csv, gpu-tests.log, sanitize.log.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE = os.path.join(ROOT, ".gpu-session")  # this machine's installs and build (kept while it stays warm)
CACHE = os.path.join(ROOT, ".gpu-cache")  # made by a rehearsal, carried: cubins, a PyCUDA build
WHEELS = os.path.join(ROOT, ".whl")
PINS = os.path.join(ROOT, "scripts", "gpu_pins.txt")
NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE: what the rehearsal's stub libcuda answers
# the stub's functions that must answer through their pointers (PyCUDA reports an error with them)
STUB_SPECIAL = {n: f'int {n}(int e, const char** s) {{ *s = "no CUDA device (polyft\'s stub libcuda: no driver here)"; '
                   'return 0; }\n' for n in ("cuGetErrorString", "cuGetErrorName")}
RESERVE_S = 10  # kept at the end for the summary
MIN_S = {"tests": 90, "sanitize": 60}  # less left than this: the stage is dropped


class Failed(Exception):
    """A stage failed: the session stops, saying why."""


class Session:
    def __init__(self, args):
        self.args, self.rehearse = args, args.rehearse
        self.start, self.wall = time.monotonic(), time.time()
        self.out = os.path.abspath(os.environ.get("OUT") or os.path.join(ROOT, "gpu-out"))
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(STATE, exist_ok=True)
        self.log = open(os.path.join(self.out, "session.log"), "a")
        self.report, self.env = [], dict(os.environ)
        self.python = args.python
        self.site = None  # .gpu-session/site-cp<version>: set once the Python is known

    # -- bookkeeping --------------------------------------------------------------------------
    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.start)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def stage(self, name: str, fn) -> None:
        at = time.monotonic() - self.start
        self.say(f"== {name}: at {at:.1f} s, {self.left():.0f} s of {self.args.budget:.0f} s left")
        t = time.monotonic()
        try:
            status = fn() or "ok"
        except Exception as e:  # a bug or a surprise of the machine's: reported like a failure
            self.report.append((name, time.monotonic() - t, "FAILED"))
            self.say(f"-- {name}: FAILED after {time.monotonic() - t:.1f} s: "
                     f"{e if isinstance(e, Failed) else repr(e)}")
            raise Failed(str(e)) from None
        self.report.append((name, time.monotonic() - t, status))
        self.say(f"-- {name}: {status} in {time.monotonic() - t:.1f} s")

    def run(self, cmd, log: str | None = None, timeout: float | None = None, env=None, cwd=ROOT, check=True):
        """`cmd` with its whole output in $OUT/<log> (else returned); Failed on a non-zero exit."""
        limit = max(1.0, self.left() - RESERVE_S) if timeout is None else timeout
        dest = open(os.path.join(self.out, log), "a") if log else subprocess.PIPE
        if log:
            dest.write(f"$ {' '.join(cmd)}\n")
            dest.flush()
        try:  # in a session of its own: on time-out its whole group goes (a build's compilers too)
            with subprocess.Popen(cmd, stdout=dest, stderr=subprocess.STDOUT, text=True, env=env or self.env,
                                  cwd=cwd, start_new_session=True) as p:
                try:
                    out = p.communicate(timeout=limit)[0]
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()
                    raise Failed(f"{' '.join(cmd[:4])} ... still running after {limit:.0f} s (killed)") from None
                except BaseException:
                    os.killpg(p.pid, signal.SIGKILL)
                    raise
        finally:
            if log:
                dest.close()
        if check and p.returncode != 0:
            tail = self.tail(log) if log else (out or "")[-3000:]
            raise Failed(f"{' '.join(cmd[:4])} ... exited with {p.returncode}:\n{tail}")
        return subprocess.CompletedProcess(cmd, p.returncode, out)

    def tail(self, log: str, lines: int = 40) -> str:
        with open(os.path.join(self.out, log), errors="replace") as f:
            return "".join(f.readlines()[-lines:]) + f"(the whole log: {os.path.join(self.out, log)})"

    # -- stages -------------------------------------------------------------------------------
    def locate(self):
        """The CUDA root and the files the build needs, from nvcc's own answer."""
        missing = []
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise Failed("nvcc is not on PATH")
        dry = subprocess.run([nvcc, "--dryrun", "-v", "-c", "x.cu"], capture_output=True, text=True, cwd=STATE).stderr
        var = dict(re.findall(r"^#\$ (\w+)=(.*)$", dry, re.M))
        if "TOP" not in var:
            raise Failed(f"`nvcc --dryrun -v` names no TOP (the CUDA root); it printed:\n{dry[-1500:]}")
        self.cuda_root = os.path.realpath(var["TOP"])
        includes = [os.path.realpath(d) for d in re.findall(r'-I"?([^"\s]+)', var.get("INCLUDES", ""))]
        includes.append(os.path.join(self.cuda_root, "include"))
        self.cuda_inc = next((d for d in includes if os.path.exists(os.path.join(d, "cuda.h"))), None)
        if self.cuda_inc is None:
            missing.append(f"cuda.h (looked in {', '.join(dict.fromkeys(includes))})")
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        release = re.search(r"release (\d+\.\d+)", version)
        if release is None:
            raise Failed(f"`nvcc --version` names no release: {version[-500:]!r}")
        self.release = release.group(1)
        py = subprocess.run([self.python, "-c", "import sys, sysconfig; print(sysconfig.get_paths()['include']); "
                             "print('%d%d' % sys.version_info[:2]); print(sys.version.split()[0])"],
                            capture_output=True, text=True)
        if py.returncode != 0:
            raise Failed(f"{self.python} does not run: {py.stderr[-500:]}")
        py_inc, self.pytag, pyver = py.stdout.splitlines()[:3]
        self.site = os.path.join(STATE, f"site-cp{self.pytag}")
        build_needs = []  # what only building PyCUDA needs: a carried build does without
        if not os.path.exists(os.path.join(py_inc, "Python.h")):
            minor = ".".join(pyver.split(".")[:2])
            build_needs.append(f"Python.h for {self.python} {pyver} (looked in {py_inc}; install python{minor}-dev)")
        libdirs = [os.path.realpath(d) for d in re.findall(r'-L"?([^"\s]+)', var.get("LIBRARIES", ""))]
        libdirs += [os.path.join(self.cuda_root, d) for d in ("lib64", "lib", "lib64/stubs", "lib/stubs")]
        libdirs += ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
        libdirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
        ldc = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig")
                                                if os.path.exists(p)), None)
        ldconfig = subprocess.run([ldc, "-p"], capture_output=True, text=True).stdout if ldc else ""
        found = [os.path.join(d, n) for d in dict.fromkeys(libdirs) for n in ("libcuda.so", "libcuda.so.1")
                 if os.path.exists(os.path.join(d, n))]
        found += re.findall(r"libcuda\.so(?:\.1)? .*=> (\S+)", ldconfig)
        self.libcuda = found[0] if found else None
        self.driver = next((f for f in found if "stubs" not in f), None)  # the driver's own, for the loader
        if self.driver and os.path.dirname(self.driver) not in ldconfig:  # where the loader would not look
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (os.path.dirname(self.driver), self.env.get("LD_LIBRARY_PATH")) if p)
        build_needs += [tool for tool in ("gcc", "g++") if shutil.which(tool) is None]
        self.carried = os.path.join(CACHE, f"pycuda-cp{self.pytag}-cuda{self.release}", "pycuda")
        self.cannot_build = "; ".join(build_needs)
        if build_needs and (self.rehearse or not os.path.isdir(self.carried)):
            missing += build_needs
        elif build_needs:
            self.say(f"   missing {self.cannot_build}: PyCUDA only from the build carried in {self.carried}")
        self.sanitizer = shutil.which("compute-sanitizer") or next(
            iter(glob.glob(os.path.join(self.cuda_root, "compute-sanitizer", "compute-sanitizer"))), None)
        self.say(f"   python {self.python} ({pyver}); nvcc {nvcc} (release {self.release}); CUDA root "
                 f"{self.cuda_root}; cuda.h in {self.cuda_inc}; libcuda {self.libcuda or 'none'}"
                 f"{' (the driver: ' + self.driver + ')' if self.driver and self.driver != self.libcuda else ''}; "
                 f"compute-sanitizer {self.sanitizer or 'none'}")
        if self.libcuda is None:
            if self.rehearse:
                self.say("   no libcuda here (no driver, no stubs): PyCUDA links against a stub made from cuda.h")
            else:
                missing.append("libcuda (the driver's, or CUDA's lib64/stubs)")
        if self.sanitizer is None and not self.rehearse:
            self.say("   compute-sanitizer not found: the sanitize stage will be dropped")
        if missing:
            raise Failed("missing: " + "; ".join(missing))

    def pins(self):
        """Every pinned file in .whl with its pinned sha256."""
        self.pinned, bad = [], []
        for line in open(PINS):
            if line.strip() and not line.startswith("#"):
                digest, name, _url = line.split()
                path = os.path.join(WHEELS, name)
                if not os.path.exists(path):
                    bad.append(f"{name} is missing")
                elif _sha256(path) != digest:
                    bad.append(f"{name}'s sha256 is not the pinned {digest}")
                self.pinned.append(path)
        if bad:
            raise Failed("; ".join(bad) + " (run scripts/fetch_gpu_wheels.sh here and carry .whl)")
        return f"ok: {len(self.pinned)} files"

    def install(self):
        """The wheels and cgen's package into .gpu-session/site-cp<version>, on PYTHONPATH from
        now on (a rehearsal with another Python than 3.12 only checks them); polyft itself
        (editable) where the Python does not import it from this tree."""
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (self.site, self.env.get("PYTHONPATH")) if p)
        self.env["PYTHONUNBUFFERED"] = "1"
        wheels = [p for p in self.pinned if p.endswith(".whl")]
        for w in wheels:
            with zipfile.ZipFile(w) as z:
                if z.testzip() is not None:
                    raise Failed(f"{w} is corrupt")
            if not re.search(r"-(py3-none-any|cp312-cp312-manylinux[\w.]*x86_64)\.whl$", w):
                raise Failed(f"{os.path.basename(w)} is not for CPython 3.12 on x86-64 Linux")
        installed = not self.rehearse or self.pytag == "312"  # the GPU machine's Python is 3.12
        if not installed:
            done = f"wheels checked (for Python 3.12), not installed for Python {self.pytag[0]}.{self.pytag[1:]}"
        else:
            os.makedirs(self.site, exist_ok=True)
            self.run([self.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                      "--upgrade", "--target", self.site, *wheels], log="session.log")
            done = f"{len(wheels)} wheels"
        cgen = next(p for p in self.pinned if os.path.basename(p).startswith("cgen-"))
        with tarfile.open(cgen) as t:  # pure Python: its package directory is all it takes
            members = [m for m in t.getmembers() if re.match(r"[^/]+/cgen/", m.name)]
            for m in members:
                m.name = m.name.split("/", 1)[1]
            _extract(t, self.site if installed else os.path.join(STATE, "cgen-check"), members)
        where = self.run([self.python, "-c", "import polyft, os; print(os.path.dirname(polyft.__file__))"],
                         check=False).stdout.strip()
        if os.path.realpath(where) != os.path.join(ROOT, "polyft"):
            if self.rehearse:
                raise Failed(f"{self.python} imports polyft from {where or 'nowhere'}, not from {ROOT}: "
                             "pip install -e . first")
            self.run([self.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                      "-e", ROOT], log="session.log")
            done += ", polyft installed (editable)"
        return done + ", cgen unpacked"

    def pycuda(self):
        """PyCUDA from its sdist against this CUDA, into .gpu-session/site-cp<version> (or a
        build carried in .gpu-cache)."""
        carried = self.carried
        target = os.path.join(self.site, "pycuda")
        lib = os.path.join(STATE, "lib")
        os.makedirs(lib, exist_ok=True)
        if self.libcuda is None:
            self._stub(lib)
        if glob.glob(os.path.join(target, "_driver*.so")) and self._imports():
            return "already built on this machine"
        if not self.rehearse and os.path.isdir(carried):
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(carried, target)
            if self._imports():
                return f"the build carried in {carried}"
            if self.cannot_build:
                raise Failed(f"the build carried in {carried} does not import here, and building needs "
                             f"{self.cannot_build}")
            self.say("   the carried build does not import here: building from the sdist")
        if self.libcuda is not None:  # -lcuda needs the unversioned name, which a driver directory may lack
            link = os.path.join(lib, "libcuda.so")
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(self.libcuda, link)
        build = os.path.join(STATE, f"build-cp{self.pytag}")
        shutil.rmtree(build, ignore_errors=True)
        os.makedirs(build)
        sdist = next(p for p in self.pinned if os.path.basename(p).startswith("pycuda-"))
        with tarfile.open(sdist) as t:
            _extract(t, build)
        src = glob.glob(os.path.join(build, "pycuda-*"))[0]
        self.run([self.python, "configure.py", f"--cuda-root={self.cuda_root}", f"--cuda-inc-dir={self.cuda_inc}",
                  "--no-cuda-enable-curand", f"--cudadrv-lib-dir={lib}"]
                 + ([f"--ldflags=-Wl,-rpath,{os.path.dirname(self.driver)}"] if self.driver else []),
                 log="pycuda-build.log", cwd=src)
        self.run([self.python, "setup.py", "build", "-j", str(os.cpu_count() or 1)], log="pycuda-build.log", cwd=src)
        built = glob.glob(os.path.join(src, "build", "lib*", "pycuda"))
        if not built or not glob.glob(os.path.join(built[0], "_driver*.so")):
            raise Failed("setup.py build exited with 0 but left no pycuda/_driver*.so:\n"
                         + self.tail("pycuda-build.log"))
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(built[0], target)
        if self.libcuda is None:  # the stub gains what the build calls beyond the headers
            self._stub(lib)
        if self.rehearse:  # what a later rehearsal or GPU run with this Python and CUDA can reuse
            shutil.rmtree(os.path.dirname(carried), ignore_errors=True)
            shutil.copytree(built[0], carried)
            if shutil.which("strip"):  # without debug information: a sixth of the size to carry
                for so in glob.glob(os.path.join(carried, "*.so")):
                    self.run(["strip", "--strip-debug", so], log="pycuda-build.log")
        return f"built ({_size(target)}{f', {_size(carried)} carried' if self.rehearse else ''})"

    def _stub(self, lib: str) -> None:
        """libcuda.so (soname libcuda.so.1) defining every function cuda.h and cudaProfiler.h
        declare, and every cu* function a PyCUDA built here calls, each answering
        CUDA_ERROR_NO_DEVICE: PyCUDA links and imports against it without a driver."""
        headers = [h for h in ("cuda.h", "cudaProfiler.h") if os.path.exists(os.path.join(self.cuda_inc, h))]
        pre = subprocess.run(["gcc", "-E", "-P", "-x", "c", f"-I{self.cuda_inc}", "-"],
                             input="".join(f"#include <{h}>\n" for h in headers), capture_output=True, text=True)
        if pre.returncode != 0:
            raise Failed(f"gcc cannot preprocess {' and '.join(headers)}: {pre.stderr[-1000:]}")
        names = set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", pre.stdout))
        for so in glob.glob(os.path.join(self.site, "pycuda", "_driver*.so")):  # a build to import
            nm = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True).stdout
            names |= set(re.findall(r"\bU (cu[A-Z]\w*)", nm))
        names = sorted(names)
        c = os.path.join(lib, "stub.c")
        with open(c, "w") as f:
            f.write("".join(STUB_SPECIAL.get(n, f"int {n}(void) {{ return {NO_DEVICE}; }}\n") for n in names))
        self.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", c, "-o", os.path.join(lib, "libcuda.so")],
                 log="pycuda-build.log")
        link = os.path.join(lib, "libcuda.so.1")
        if not os.path.lexists(link):
            os.symlink("libcuda.so", link)
        self.env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, self.env.get("LD_LIBRARY_PATH")) if p)
        self.say(f"   stub libcuda: {len(names)} functions from cuda.h, each answering {NO_DEVICE} (no device)")

    def _imports(self) -> bool:
        return self.run([self.python, "-c", "import pycuda.driver"], check=False).returncode == 0

    def import_(self):
        """PyCUDA imports; on the GPU it names the device, in a rehearsal the stub says: no device."""
        if self.rehearse:
            p = self.run([self.python, "-c", "import pycuda.driver as d\ntry:\n    d.init()\nexcept d.Error as e:\n"
                          "    print('no device:', e)\nelse:\n    raise SystemExit('cuInit succeeded without a GPU')"])
            return p.stdout.strip()
        p = self.run([self.python, "-c", "import pycuda.autoprimaryctx, pycuda.driver as d; "
                      "dev = d.Context.get_device(); "
                      "print(dev.name(), 'sm_%d%d' % dev.compute_capability(), 'driver', d.get_driver_version(), "
                      "'pycuda', d.get_version())"])
        if shutil.which("nvidia-smi"):
            smi = self.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem",
                            "--format=csv"], check=False)
            self.say("   " + smi.stdout.strip().replace("\n", "\n   "))
        return p.stdout.strip()

    def cubins(self):
        """Every module of the GPU tests and the benchmark compiled into .gpu-cache."""
        self.env["POLYFT_CUBIN_CACHE"] = os.path.join(CACHE, "cubins")
        self.env["POLYFT_CUBIN_LOG"] = os.path.join(STATE, "cubins-compiled.txt")
        self.run([self.python, "-m", "polyft.experiments.gpu_modules", "prepare", "--preset", self.args.preset,
                  "--arch", self.args.arch, "-j", str(self.args.jobs)], log="cubins.log")
        return self.tail("cubins.log", 1).splitlines()[0].strip()

    def smoke(self):
        self.run([self.python, "-m", "polyft.experiments.gpu_modules", "smoke"], log="session.log",
                 timeout=min(120, self.left() - RESERVE_S))

    def bench(self):
        deadline = self.wall + self.args.budget - RESERVE_S
        cmd = [self.python, "-m", "polyft.experiments.gpu_bench", "--out", os.path.join(ROOT, "results"),
               "--deadline", f"{deadline:.0f}"] + (["--paper"] if self.args.preset == "paper" else []) \
            + (["--resume"] if self.args.resume else [])
        try:
            self.run(cmd, log="gpu-bench.log")
        finally:  # what was measured comes back even if the bench failed
            csv = os.path.join(ROOT, "results", "gpu_bench.csv")
            if os.path.exists(csv):
                shutil.copy(csv, os.path.join(self.out, "gpu_bench.csv"))
        rows = sum(1 for _ in open(csv)) - 1 if os.path.exists(csv) else 0
        return f"{rows} rows in results/gpu_bench.csv" + ("" if "stopped at the time budget" not in
                                                          open(os.path.join(self.out, "gpu-bench.log")).read()
                                                          else " (stopped at the budget: run again with --resume)")

    def tests(self):
        if self.left() < MIN_S["tests"] + RESERVE_S:
            return f"DROPPED: {self.left():.0f} s left, the GPU tests take about {MIN_S['tests']} s"
        self.run([self.python, "-m", "pytest", "-q", "-m", "gpu", "-x", "-p", "no:cacheprovider", "tests"],
                 log="gpu-tests.log")
        return self.tail("gpu-tests.log", 1).splitlines()[0].strip()

    def sanitize(self):
        if self.sanitizer is None:
            return "DROPPED: no compute-sanitizer"
        if self.left() < MIN_S["sanitize"] + RESERVE_S:
            return f"DROPPED: {self.left():.0f} s left, the sanitizers take about {MIN_S['sanitize']} s"
        for tool in ("racecheck", "synccheck"):
            self.run([self.sanitizer, "--tool", tool, "--error-exitcode", "3", self.python, "-m",
                      "polyft.experiments.gpu_modules", "sanitize"], log="sanitize.log")
        return "racecheck and synccheck found nothing"

    def summary(self):
        compiled = os.path.join(STATE, "cubins-compiled.txt")
        self.say("== summary (seconds)")
        for name, seconds, status in self.report:
            self.say(f"   {name:9s} {seconds:7.1f}  {status.splitlines()[0] if status else ''}")
        if not self.rehearse and os.path.exists(compiled):
            with open(compiled) as f:
                self.say(f"   cubins compiled on this machine (not carried): {len(f.readlines())}")
        self.say(f"   total {time.monotonic() - self.start:.1f} s of {self.args.budget:.0f} s")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extract(t: tarfile.TarFile, path: str, members=None) -> None:
    try:
        t.extractall(path, members, filter="data")  # Python 3.12 (and 3.11.4): no links out, no odd modes
    except TypeError:
        t.extractall(path, members)


def _size(path: str) -> str:
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return f"{total / 2**20:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rehearse", action="store_true", help="without a GPU: every stage up to the first launch")
    ap.add_argument("--fresh", action="store_true", help="forget this machine's installs and PyCUDA build first")
    ap.add_argument("--resume", action="store_true", help="keep the benchmark rows already in results/gpu_bench.csv")
    ap.add_argument("--budget", type=float, help="seconds for the whole session (default 420 on the GPU; "
                    "3600 for a rehearsal, whose machine may have two cores where the GPU machine has 16)")
    ap.add_argument("--preset", default="paper", choices=["paper", "quick"], help="the benchmark's preset")
    ap.add_argument("--arch", default="sm_90", help="the GPU's architecture for the cubins (H100/H200: sm_90)")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or shutil.which("python3") or sys.executable)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.fresh:
        shutil.rmtree(STATE, ignore_errors=True)
    if args.budget is None:
        args.budget = 3600.0 if args.rehearse else 420.0
    s = Session(args)
    stages = [("locate", s.locate), ("pins", s.pins), ("install", s.install), ("pycuda", s.pycuda),
              ("import", s.import_), ("cubins", s.cubins)]
    if not s.rehearse:
        stages += [("smoke", s.smoke), ("bench", s.bench), ("tests", s.tests), ("sanitize", s.sanitize)]
    s.say(f"gpu session {'rehearsal ' if s.rehearse else ''}at {time.strftime('%Y-%m-%d %H:%M:%S')}, "
          f"budget {s.args.budget:.0f} s, logs in {s.out}")
    code = 0
    for name, fn in stages:
        try:
            s.stage(name, fn)
        except Failed:
            code = 1
            if name in ("bench", "tests", "sanitize"):  # the later stages still run
                continue
            break
    s.summary()
    return code


if __name__ == "__main__":
    sys.exit(main())
