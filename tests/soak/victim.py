"""A client the soak kills with SIGKILL mid-call: the abrupt disconnect of a crashing training
host. It calls in a loop and reports each step on stdout (flushed), so that the coordinator
knows how many calls it started and how they ended before it died:
  ready | start | ok | wrong <why> | error <CODE> [device]

    victim.py TARGET SEED RPC
"""
import pathlib
import sys
import time

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent),
                str(pathlib.Path(__file__).resolve().parents[1] / "python")]

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import worker  # noqa: E402
import workload  # noqa: E402


def main(target: str, seed: int, rpc: str) -> None:
    rng = np.random.default_rng(seed)
    problems = [workload.valid_problem(rng, rpc) for _ in range(4)]
    channel = grpc.insecure_channel(target, options=worker.CHANNEL_OPTIONS)
    method = worker.stub_method(channel, rpc)
    print("ready", flush=True)
    for n in range(1_000_000):
        problem = problems[n % len(problems)]
        print("start", flush=True)
        try:
            why = problem.check(method(problem.request, timeout=worker.CALL_TIMEOUT_S))
            print("ok" if why is None else f"wrong {why} [{problem.describe}]", flush=True)
        except grpc.RpcError as error:
            # "device": refused for a device fault, which the soak allows (worker.py).
            refused = worker.device_refused(error.code(), error.details())
            print(f"error {error.code().name}" + (" device" if refused else ""), flush=True)
            if refused:  # as the workers do: no spinning while the device is out of service
                time.sleep(worker.DEVICE_REFUSED_PAUSE_S)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
