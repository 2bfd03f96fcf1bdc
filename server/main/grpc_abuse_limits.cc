#include "server/main/grpc_abuse_limits.h"

#include <grpc/compression.h>

namespace attnserve {

void ApplyGrpcAbuseLimits(const GrpcAbuseLimits& limits, grpc::ServerBuilder& builder) {
  // Only uncompressed messages. gRPC 1.51 inflates a compressed message before the size limit
  // and before the handler (so before authentication): 261 KB of gzip became 256 MiB. With
  // identity alone, a compressed call is refused from its headers (UNIMPLEMENTED, "algorithm
  // disabled") and nothing is inflated; random tensor data gains nothing from gzip anyway.
  for (int algorithm = GRPC_COMPRESS_NONE + 1; algorithm < GRPC_COMPRESS_ALGORITHMS_COUNT;
       ++algorithm) {
    builder.SetCompressionAlgorithmSupportStatus(
        static_cast<grpc_compression_algorithm>(algorithm), false);
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, limits.max_metadata_bytes);
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(limits.handshake_timeout)));
}

}  // namespace attnserve
