"""GPU kernel tests: one random seed per session, printed so a failure can be replayed with
ATTN_TEST_SEED=<seed>."""

import os
import random

os.environ.setdefault("ATTN_TEST_SEED", str(random.randrange(1 << 31)))


def pytest_report_header(config):
    library = os.environ.get("ATTN_CAPI", "build-gpu/lib/libattn_capi.so")
    return f"ATTN_TEST_SEED={os.environ['ATTN_TEST_SEED']}  kernel library: {library}"
