"""One version everywhere: the C/C++ header's, CMake's (its package's version file), the
Python package's metadata and embrope.__version__ (the extension's, from the header)."""

import importlib.metadata
import pathlib
import re

import embrope

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_place_holds_the_same_version():
    header = (ROOT / "include" / "embrope" / "version.h").read_text()
    parts = [re.search(rf"#define EMBROPE_VERSION_{p} (\d+)", header).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    version = ".".join(parts)
    assert re.search(r'#define EMBROPE_VERSION_STRING "([^"]+)"', header).group(1) == version
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"project\(embrope VERSION (\S+)", cmake).group(1) == version
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1) == version
    assert embrope.__version__ == version
    assert importlib.metadata.version("embrope") == version
