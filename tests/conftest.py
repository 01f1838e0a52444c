import os
import sys

# Make bench/ scripts importable as modules in tests (they are not part of the package).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_data(path): the test reads measured data at path (../shared/"
        "calibration); skipped where it is absent, failed when FXSHAPE_REQUIRE_DATA=1 (CI)")


def pytest_runtest_setup(item):
    import pytest

    for mark in item.iter_markers("needs_data"):
        path = mark.args[0]
        if os.path.exists(path):
            continue
        msg = f"measured data not found: {path}"
        if os.environ.get("FXSHAPE_REQUIRE_DATA"):
            pytest.fail(f"{msg} (FXSHAPE_REQUIRE_DATA is set: this machine must have it)",
                        pytrace=False)
        pytest.skip(msg)
