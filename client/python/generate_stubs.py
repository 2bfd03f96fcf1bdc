#!/usr/bin/env python3
"""Regenerates the committed gRPC/protobuf stubs of the attnserve package from the protos.

Run it after any change to proto/attnserve/v1/*.proto or proto/inference/grpc_service.proto (with the grpcio-tools version pinned in
scripts/requirements-dev.txt); tests/python/test_stubs_current.py fails until then.
"""
import argparse
import pathlib
import sys

from grpc_tools import protoc

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
# Each proto and whether it declares a service (data_channel.proto only has messages: a gRPC
# module for it would be empty).
PROTO_FILES = (
    ("attnserve/v1/attention.proto", True),
    ("attnserve/v1/data_channel.proto", False),
    ("inference/grpc_service.proto", True),
)
PACKAGE_OUT = pathlib.Path(__file__).resolve().parent / "attnserve" / "_proto"

# The files protoc writes, relative to the output root.
GENERATED = (
    "attnserve/v1/attention_pb2.py",
    "attnserve/v1/attention_pb2.pyi",
    "attnserve/v1/attention_pb2_grpc.py",
    "attnserve/v1/data_channel_pb2.py",
    "attnserve/v1/data_channel_pb2.pyi",
    "inference/grpc_service_pb2.py",
    "inference/grpc_service_pb2.pyi",
    "inference/grpc_service_pb2_grpc.py",
)

# protoc names modules relative to the proto root ("attnserve.v1"), which inside the installed
# package would resolve to attnserve.v1, not attnserve._proto.attnserve.v1: the grpc module's
# import would fail, and the message classes' __module__ (used by pickle) would be wrong.
_FIXUPS = (
    ("attnserve/v1/attention_pb2_grpc.py",
     "from attnserve.v1 import attention_pb2 as", "from . import attention_pb2 as"),
    ("attnserve/v1/attention_pb2.py",
     "'attnserve.v1.attention_pb2'", "'attnserve._proto.attnserve.v1.attention_pb2'"),
    ("attnserve/v1/data_channel_pb2.py",
     "from attnserve.v1 import attention_pb2 as", "from . import attention_pb2 as"),
    ("attnserve/v1/data_channel_pb2.py",
     "'attnserve.v1.data_channel_pb2'", "'attnserve._proto.attnserve.v1.data_channel_pb2'"),
    ("attnserve/v1/data_channel_pb2.pyi",
     "from attnserve.v1 import attention_pb2 as", "from . import attention_pb2 as"),
    ("inference/grpc_service_pb2_grpc.py",
     "from inference import grpc_service_pb2 as", "from . import grpc_service_pb2 as"),
    ("inference/grpc_service_pb2.py",
     "'inference.grpc_service_pb2'", "'attnserve._proto.inference.grpc_service_pb2'"),
    # The Open Inference Protocol's messages are named "inference.*" by tritonclient's stubs
    # too: in protobuf's default pool the second module imported would fail with "duplicate
    # symbol". A pool of its own lets both live in one process (they share the wire format).
    ("inference/grpc_service_pb2.py",
     "_descriptor_pool.Default().AddSerializedFile(",
     "_descriptor_pool.DescriptorPool().AddSerializedFile("),
)


def generate(out_dir: pathlib.Path) -> None:
    """Writes the files in GENERATED under out_dir, imports fixed for use inside the package."""
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(protoc.__file__).parent / "_proto"
    for proto, has_service in PROTO_FILES:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            *([f"--grpc_python_out={out_dir}"] if has_service else []),
            proto,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_ROOT / proto}")
    for name, old, new in _FIXUPS:
        path = out_dir / name
        text = path.read_text()
        if old not in text:
            raise RuntimeError(f"{path}: expected '{old}' not found; update _FIXUPS")
        path.write_text(text.replace(old, new))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=PACKAGE_OUT,
                        help="output root (default: the package's _proto folder)")
    args = parser.parse_args()
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
