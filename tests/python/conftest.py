import os

import numpy as np
import pytest

# HF transformers must never reach for the network: every model file comes from PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_figures: list[str] = []


@pytest.fixture
def report():
    """Lines the session prints at its end (the HF comparison figures)."""
    return _figures.append


def pytest_terminal_summary(terminalreporter):
    if _figures:
        terminalreporter.section("embrope against HF transformers (max abs error vs float64)")
        for line in _figures:
            terminalreporter.write_line(line)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "ci_required: must run in CI (CI=true): a skip there is a failure")


def _missing_package(report) -> bool:
    """A skip of pytest.importorskip: a package that the test needs is not installed."""
    return report.skipped and "could not import" in str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true, a ci_required test that skips fails, and so does any test skipped for a
    package that is not installed (scripts/install-deps.sh --python installs every one)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") == "true" and (
            item.get_closest_marker("ci_required") is not None or _missing_package(report)):
        reason = str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: skipped under CI=true, where it must run ({reason})"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Under CI=true, a test module skipped whole for a package that is not installed (a
    module-level pytest.importorskip) fails: its tests never reach the hook above."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and _missing_package(report):
        reason = str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: skipped under CI=true, where it must run ({reason})"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def ulp_tolerance(dtype_name: str) -> float:
    """Relative size of one unit in the last place of a dtype's significand."""
    return {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype_name]
