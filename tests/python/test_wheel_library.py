"""The installed package's libembrope for C and C++ programs: one file, libembrope.so.N with
SONAME libembrope.so.N (N the C ABI version of the headers it ships), which a program built
against the package's CMake package or pkg-config file records and loads (docs/abi.md)."""

import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

import embrope

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(embrope.__file__).resolve().parent
LIBDIR = PACKAGE / "lib"

pytestmark = pytest.mark.ci_required


def _abi_version() -> int:
    header = (PACKAGE / "include" / "embrope" / "version.h").read_text()
    return int(re.search(r"^#define EMBROPE_ABI_VERSION (\d+)$", header, re.M).group(1))


def _dynamic(path: pathlib.Path, tag: str) -> list[str]:
    """The values of one tag of an ELF file's dynamic section (readelf -d)."""
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True,
                         text=True).stdout
    return re.findall(rf"\({tag}\)\s+\S+ \S+: \[([^\]]+)\]", out)


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed")
    return path


def test_the_library_is_one_file_named_and_sonamed_by_the_abi_version():
    _need("readelf")
    name = f"libembrope.so.{_abi_version()}"
    libraries = sorted(p.name for p in LIBDIR.glob("libembrope.so*"))
    assert libraries == [name]
    assert _dynamic(LIBDIR / name, "SONAME") == [name]
    extension = next(PACKAGE.glob("_embrope*.so"))
    assert name in _dynamic(extension, "NEEDED")


def _check(command: list, **kwargs) -> str:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                            timeout=300, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout}{result.stderr}"
    return result.stdout


def _run_consumer(binary: pathlib.Path, name: str):
    assert name in _dynamic(binary, "NEEDED")
    _check([binary], env=dict(os.environ, LD_LIBRARY_PATH=str(LIBDIR)))


def test_a_cmake_program_builds_against_the_package_and_records_the_soname(tmp_path):
    _need("readelf")
    cmake = _need("cmake")
    name = f"libembrope.so.{_abi_version()}"
    build = tmp_path / "build"
    # find_package(embrope) finds <prefix>/embrope/lib/cmake/embrope under site-packages.
    # Ninja where there is one (scripts/install-deps.sh installs it; make may be absent).
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _check([cmake, "-S", ROOT / "tests" / "consumer", "-B", build, *generator,
            f"-DCMAKE_PREFIX_PATH={PACKAGE.parent}"])
    _check([cmake, "--build", build])
    for program in ("consumer", "consumer_c"):
        _run_consumer(build / program, name)


def test_a_c_program_builds_with_the_package_pkg_config_file(tmp_path):
    _need("readelf")
    pkg_config = _need("pkg-config")
    compiler = shlex.split(os.environ.get("CC", "cc"))  # "ccache gcc" too
    compiler[0] = _need(compiler[0])
    name = f"libembrope.so.{_abi_version()}"
    env = dict(os.environ, PKG_CONFIG_PATH=str(LIBDIR / "pkgconfig"))
    flags = _check([pkg_config, "--cflags", "--libs", "embrope"], env=env).split()
    binary = tmp_path / "consumer_c"
    _check([*compiler, ROOT / "tests" / "consumer" / "consumer.c", *flags, "-o", binary])
    _run_consumer(binary, name)
