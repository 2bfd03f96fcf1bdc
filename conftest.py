"""Every pytest run of the project: a hard limit on each test's time.

A test that hangs (a deadlock in a library, a server that never answers) would otherwise hold
the whole run until CI's own limit ends it, with nothing said of where. Past the limit
faulthandler prints every thread's Python stack to the terminal and ends the process with a
failure: it needs no GIL, so it fires even where a thread holds the GIL in C (a fork handler, a
stuck native call), where pytest-timeout's signal or thread methods could not.
ATTN_TEST_LIMIT_S sets the limit (default 600 s; on a 2-core machine the slowest test took 28 s
against the TSan-built server and 66 s in the final run, the short soak with its GPU phases).
"""
import faulthandler
import os
import sys

import pytest

TEST_LIMIT_S = float(os.environ.get("ATTN_TEST_LIMIT_S", "600"))

_terminal = None


def pytest_configure(config):
    # A copy of the terminal's stderr: while a test runs, pytest captures fd 2 into a file that
    # the process's end would discard.
    global _terminal
    _terminal = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    faulthandler.dump_traceback_later(TEST_LIMIT_S, exit=True, file=_terminal)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
