// JSON for the Open Inference Protocol's REST API (nlohmann/json): bounded parsing of request
// bodies, protocol parameters, and the `{"error": "..."}` body of every refusal.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/transport/oip/infer_request.h"

namespace attnserve::transport::rest {

using Json = nlohmann::json;

// JSON nested deeper than this (objects and arrays) is refused: tensors need shape-deep lists
// at most, and the bound keeps a hostile body from making parsing or freeing the document
// recurse deeply.
inline constexpr int kMaxJsonDepth = 32;

// Parses `text`; INVALID_ARGUMENT naming `what` (e.g. "request body") and what was wrong.
absl::StatusOr<Json> ParseJson(absl::string_view text, const std::string& what);

// A "parameters" object as protocol parameters: booleans, integers (int64), other numbers
// (double) and strings; INVALID_ARGUMENT naming `field` for anything else.
absl::StatusOr<oip::Parameters> DecodeParameters(const Json& object, const std::string& field);
Json EncodeParameters(const oip::Parameters& parameters);

// The member `name` of `object` when it has the type `is` checks; nullptr when absent.
// INVALID_ARGUMENT "<field>.<name>: must be <kind>" when present with another type.
absl::StatusOr<const Json*> Member(const Json& object, const char* name, const std::string& field,
                                   bool (Json::*is)() const noexcept, const char* kind);

// `{"error": message}`, the body of every REST error.
std::string ErrorBody(absl::string_view message);

}  // namespace attnserve::transport::rest
