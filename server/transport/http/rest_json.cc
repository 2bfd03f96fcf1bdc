#include "server/transport/http/rest_json.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnserve::transport::rest {
namespace {

// Thrown by the parse callback to stop at the first level past kMaxJsonDepth.
struct TooDeep {};

}  // namespace

absl::StatusOr<Json> ParseJson(absl::string_view text, const std::string& what) {
  // nlohmann's lexer takes a NUL byte for the end of the input and would accept whatever
  // follows it: binary bytes sent without Inference-Header-Content-Length, for one.
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not valid JSON (a NUL byte at offset ", nul,
                     "; binary data needs the Inference-Header-Content-Length header)"));
  }
  auto bound_depth = [](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), bound_depth);
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": JSON nested deeper than ", kMaxJsonDepth, " levels"));
  } catch (const Json::exception& e) {
    // nlohmann's messages say where parsing stopped and why, without echoing the input.
    return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON (", e.what(), ")"));
  }
}

absl::StatusOr<oip::Parameters> DecodeParameters(const Json& object, const std::string& field) {
  if (!object.is_object()) return absl::InvalidArgumentError(field + ": must be an object");
  oip::Parameters out;
  for (const auto& [name, value] : object.items()) {
    if (value.is_boolean()) {
      out[name] = value.get<bool>();
    } else if (value.is_number_unsigned()) {
      const uint64_t number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".", name, ": out of the int64 range"));
      }
      out[name] = static_cast<int64_t>(number);
    } else if (value.is_number_integer()) {
      out[name] = value.get<int64_t>();
    } else if (value.is_number_float()) {
      out[name] = value.get<double>();
    } else if (value.is_string()) {
      out[name] = value.get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".", name, ": must be a boolean, number or string"));
    }
  }
  return out;
}

Json EncodeParameters(const oip::Parameters& parameters) {
  Json out = Json::object();
  for (const auto& [name, value] : parameters) {
    std::visit([&out, &name = name](const auto& v) { out[name] = v; }, value);
  }
  return out;
}

absl::StatusOr<const Json*> Member(const Json& object, const char* name, const std::string& field,
                                   bool (Json::*is)() const noexcept, const char* kind) {
  auto it = object.find(name);
  if (it == object.end()) return nullptr;
  if (!((*it).*is)()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".", name, ": must be ", kind));
  }
  return &*it;
}

std::string ErrorBody(absl::string_view message) {
  // Replace invalid UTF-8 (a name echoed from the request) rather than fail to answer.
  return Json{{"error", std::string(message)}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace attnserve::transport::rest
