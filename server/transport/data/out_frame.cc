#include "server/transport/data/out_frame.h"

#include <algorithm>

#include "attnserve/v1/data_channel.pb.h"
#include "server/engine/error_text.h"

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
  error.set_message(engine::BoundedErrorMessage(status.message()));
  OutFrame frame = MessageFrame(v1::FRAME_ERROR, 0, error);
  frame.last = true;
  return frame;
}

OutFrame StatusResponseFrame(uint64_t request_id, const absl::Status& status) {
  v1::DataResponse response;
  response.set_code(static_cast<int>(status.code()));
  response.set_message(engine::BoundedErrorMessage(status.message()));
  return MessageFrame(v1::FRAME_RESPONSE, request_id, response);
}

void AppendChunkFrames(uint64_t request_id, const std::shared_ptr<OutboundResponse>& response,
                       const char* data, uint64_t offset, size_t size, int64_t chunk_bytes,
                       std::vector<OutFrame>* frames) {
  for (size_t start = 0; start < size; start += static_cast<size_t>(chunk_bytes)) {
    OutFrame frame;
    frame.response = response;
    frame.data = data + start;
    frame.size = std::min(size - start, static_cast<size_t>(chunk_bytes));
    FrameHeader header;
    header.type = v1::FRAME_CHUNK;
    header.request_id = request_id;
    header.offset = offset + start;
    header.length = frame.size;
    EncodeFrameHeader(header, frame.header);
    frames->push_back(std::move(frame));
    response->unsent_frames.fetch_add(1);
  }
}

std::vector<OutFrame> ResponseFrames(uint64_t request_id,
                                     const google::protobuf::MessageLite& message,
                                     std::shared_ptr<OutboundResponse> response,
                                     int64_t chunk_bytes,
                                     const std::vector<std::pair<uint64_t, uint64_t>>& sent) {
  std::vector<OutFrame> frames;
  frames.push_back(MessageFrame(v1::FRAME_RESPONSE, request_id, message));
  frames.back().response = response;
  response->unsent_frames.fetch_add(1);
  uint64_t offset = 0;
  auto next_sent = sent.begin();
  for (const ResponseTensor& tensor : response->tensors) {
    const uint64_t end = offset + tensor.size();
    // The tensor's bytes not sent yet, run by run.
    for (uint64_t at = offset; at < end;) {
      while (next_sent != sent.end() && next_sent->second <= at) ++next_sent;
      uint64_t stop = end;
      if (next_sent != sent.end() && next_sent->first <= at) {
        at = std::min(end, next_sent->second);
        continue;
      }
      if (next_sent != sent.end()) stop = std::min(stop, next_sent->first);
      AppendChunkFrames(request_id, response, tensor.data() + (at - offset), at, stop - at,
                        chunk_bytes, &frames);
      at = stop;
    }
    offset = end;
  }
  return frames;
}

}  // namespace attnserve::transport::data
