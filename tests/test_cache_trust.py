"""The compile cache as an attack surface (emit.runtime_c, emit.private_files).

A cache entry is code the process runs, so only this user's may be used:
* directories and objects are created private (0700, objects 0500) whatever the umask;
* a cache directory of another user's, one writable by others, or one inside a directory others
  can write is refused with a warning, and a private temporary directory used instead;
* an object of another user's, or one others can write, is not loaded even with a valid checksum
  record (its constructor never runs): it is removed, with a warning, and compiled again;
* an entry that is a FIFO, a symlink (to /dev/zero, or a loop), a huge file never blocks or is
  read: it is replaced; a directory in its place is a CompileError naming it.
"Another user" is uid 65534 (nobody), set with os.chown: those tests need root, as CI runs.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest

import polyft as ft
from polyft.emit import private_files, runtime_c
from polyft.errors import CompileError

from test_cache_faults import ROOT, WORKER, XS, W, check_numbers, f

pytestmark = pytest.mark.usefixtures("compile_cache")
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")


def compile_in_subprocess(cache, timeout=120) -> dict:
    """Compile and run the program in a fresh process using `cache`: its result, object and warnings."""
    env = {**os.environ, "POLYFT_CACHE": str(cache), "PYTHONPATH": ROOT}
    code = "import warnings; warnings.simplefilter('always')\n" + WORKER
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"worker exited with {r.returncode}:\n{r.stderr}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"] = r.stderr
    return out


@pytest.fixture(scope="module")
def entry_name(tmp_path_factory):
    """The file name the program's object has in any cache."""
    return os.path.basename(compile_in_subprocess(tmp_path_factory.mktemp("name"))["so"])


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- created private -------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o000, 0o002, 0o022])
def test_created_private_whatever_the_umask(tmp_path, monkeypatch, umask):
    cache = tmp_path / "a" / "b" / "cache"  # parents missing too
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    old = os.umask(umask)
    try:
        so = runtime_c.build(ft.compile(f, XS, W, target="c").source)
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", cache):
        assert mode(d) == 0o700, (d, oct(mode(d)))
    assert os.path.dirname(so) == str(cache) and mode(so) == 0o500
    for name in os.listdir(cache):
        assert not mode(cache / name) & 0o077, name


def test_pycudas_cubin_cache_is_private_too(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path / "cache"))
    old = os.umask(0)
    try:
        d = runtime_c.cache_subdir("pycuda")
    finally:
        os.umask(old)
    assert d == str(tmp_path / "cache" / "pycuda") and mode(d) == 0o700


# -- a cache directory that is not this user's alone -----------------------------------------
def refused(cache, why: str, fallback_expected=True):
    with pytest.warns(UserWarning, match="compile cache") as w:
        check_numbers(ft.compile(f, XS, W, target="c"))
    msg = str(w[-1].message)
    assert str(cache) in msg and why in msg, msg
    assert runtime_c._fallback_dir and runtime_c._fallback_dir in msg
    assert not any(n.endswith(".so") for n in os.listdir(cache))  # nothing written into it, nothing loaded


@as_root
def test_a_cache_directory_of_another_user_is_refused(tmp_path, monkeypatch, fresh_fallback):
    cache = tmp_path / "theirs"
    cache.mkdir(mode=0o755)
    os.chown(cache, NOBODY, NOBODY)
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    refused(cache, f"owned by uid {NOBODY}")


def test_a_cache_directory_others_can_write_is_refused(tmp_path, monkeypatch, fresh_fallback):
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    refused(cache, "writable by others")
    cache.chmod(0o775)
    refused(cache, "writable by its group")


def test_inside_a_directory_others_can_write(tmp_path, monkeypatch, fresh_fallback):
    """Others could rename the cache away and put their own in its place; a sticky directory
    (as /tmp) forbids that, so a private cache inside one is used."""
    up = tmp_path / "up"
    up.mkdir()
    up.chmod(0o777)
    cache = up / "cache"
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    refused(cache, f"inside {up}")
    up.chmod(0o1777)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        so = runtime_c.build(ft.compile(f, XS, W, target="c").source)
    assert os.path.dirname(so) == str(cache)


# -- planted objects -------------------------------------------------------------------------
PLANTED = textwrap.dedent("""
    #include <stdio.h>
    __attribute__((constructor)) static void polyft_planted(void) {{
        FILE* f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}
    }}
    int polyft_run(void** b, const long* p) {{ return 0; }}
""")


def plant(cache, name, marker, owner=None, perm=0o500):
    """An object with a valid checksum record whose constructor writes `marker`, at `name`."""
    so = runtime_c.build(PLANTED.format(marker=marker))
    data = open(so, "rb").read()
    assert runtime_c.damage(data) is None
    target = cache / name
    target.write_bytes(data)
    target.chmod(perm)
    if owner is not None:
        os.chown(target, owner, owner)
    return target


@as_root
def test_an_object_of_another_user_is_not_loaded(tmp_path, entry_name):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    marker = tmp_path / "constructor-ran"
    target = plant(cache, entry_name, marker, owner=NOBODY)
    out = compile_in_subprocess(cache)
    assert out["err"] < 1e-5 and out["so"] == str(target)
    assert not marker.exists(), "the planted object's constructor ran"
    assert f"uid {NOBODY}" in out["stderr"], out["stderr"]  # the warning says what was refused
    assert os.stat(target).st_uid == os.geteuid()  # compiled again, ours


@pytest.mark.parametrize("perm", [0o664, 0o646])
def test_an_object_others_can_write_is_not_loaded(tmp_path, entry_name, perm):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    marker = tmp_path / "constructor-ran"
    target = plant(cache, entry_name, marker, perm=perm)
    out = compile_in_subprocess(cache)
    assert out["err"] < 1e-5 and not marker.exists()
    assert "others can write" in out["stderr"], out["stderr"]
    assert mode(target) == 0o500


# -- entries that are not files ----------------------------------------------------------------
def make_fifo(p):
    os.mkfifo(p)


def symlink_to_dev_zero(p):
    os.symlink("/dev/zero", p)


def symlink_loop(p):
    os.symlink(p, p)


def huge_sparse_file(p):
    with open(p, "wb") as fh:
        fh.truncate(private_files.MAX_ENTRY + 1)  # sparse: no disk used, but no read would end soon


@pytest.mark.parametrize("make, kind", [(make_fifo, "a FIFO"), (symlink_to_dev_zero, "a symlink"),
                                        (symlink_loop, "a symlink"), (huge_sparse_file, "bytes, more than")])
def test_an_entry_that_is_not_an_object_is_replaced_without_blocking(tmp_path, entry_name, make, kind):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    make(str(cache / entry_name))
    out = compile_in_subprocess(cache, timeout=60)  # a blocked open() or endless read times out
    assert out["err"] < 1e-5 and out["so"] == str(cache / entry_name)
    assert kind in out["stderr"], out["stderr"]
    st = os.lstat(cache / entry_name)
    assert stat.S_ISREG(st.st_mode) and runtime_c.damage((cache / entry_name).read_bytes()) is None


def test_a_directory_in_place_of_an_object_is_a_compile_error(tmp_path, monkeypatch, entry_name):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    (tmp_path / entry_name).mkdir()
    with pytest.raises(CompileError) as e:
        ft.compile(f, XS, W, target="c")
    msg = str(e.value)
    assert str(tmp_path / entry_name) in msg and "is a directory" in msg and "remove it" in msg, msg
