#include "server/transport/data/out_frame.h"

#include <algorithm>

#include "attnserve/v1/data_channel.pb.h"

namespace attnserve::transport::data {

OutboundResponse::~OutboundResponse() {
  if (unsent_frames.load() == 0) {
    metrics->RecordTransfer("out", absl::ToDoubleSeconds(absl::Now() - queued));
  }
}

OutFrame MessageFrame(v1::FrameType type, uint64_t request_id,
                      const google::protobuf::MessageLite& message) {
  OutFrame frame;
  message.SerializeToString(&frame.message);
  FrameHeader header;
  header.type = type;
  header.request_id = request_id;
  header.length = frame.message.size();
  EncodeFrameHeader(header, frame.header);
  return frame;
}

OutFrame ErrorFrame(const absl::Status& status) {
  v1::DataError error;
  error.set_code(static_cast<int>(status.code()));
  error.set_message(std::string(status.message()));
  OutFrame frame = MessageFrame(v1::FRAME_ERROR, 0, error);
  frame.last = true;
  return frame;
}

OutFrame StatusResponseFrame(uint64_t request_id, const absl::Status& status) {
  v1::DataResponse response;
  response.set_code(static_cast<int>(status.code()));
  response.set_message(std::string(status.message()));
  return MessageFrame(v1::FRAME_RESPONSE, request_id, response);
}

std::vector<OutFrame> ResponseFrames(uint64_t request_id,
                                     const google::protobuf::MessageLite& message,
                                     std::shared_ptr<OutboundResponse> response,
                                     int64_t chunk_bytes) {
  std::vector<OutFrame> frames;
  frames.push_back(MessageFrame(v1::FRAME_RESPONSE, request_id, message));
  frames.back().response = response;
  uint64_t offset = 0;
  for (const ResponseTensor& tensor : response->tensors) {
    for (size_t start = 0; start < tensor.size(); start += static_cast<size_t>(chunk_bytes)) {
      OutFrame frame;
      frame.response = response;
      frame.data = tensor.data() + start;
      frame.size = std::min(tensor.size() - start, static_cast<size_t>(chunk_bytes));
      FrameHeader header;
      header.type = v1::FRAME_CHUNK;
      header.request_id = request_id;
      header.offset = offset + start;
      header.length = frame.size;
      EncodeFrameHeader(header, frame.header);
      frames.push_back(std::move(frame));
    }
    offset += tensor.size();
  }
  response->unsent_frames = static_cast<int64_t>(frames.size());
  return frames;
}

}  // namespace attnserve::transport::data
