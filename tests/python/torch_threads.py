"""The one_torch_thread fixture the torch test modules import: the server runs on this
machine's few cores, and torch's OpenMP workers busy-wait between ops, so with more than one
they starve it and every call takes seconds."""
import pytest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
