// The C API's error reporting and devices (include/meganeura/meganeura.h).
#include "backends/vulkan/runtime/gpu.hpp"
#include "capi/handles.hpp"
#include "runtime/shared_device.hpp"

namespace mg::capi {
namespace {
thread_local std::string last_error;
}  // namespace

void fail(mg_status status, std::string message) {
  throw StatusError{status, std::move(message)};
}

const char* last_error_text() {
  return last_error.c_str();
}

mg_status set_error(mg_status status, std::string message) {
  try {
    last_error = std::move(message);
  } catch (...) {
    last_error.clear();
  }
  return status;
}

}  // namespace mg::capi

using mg::capi::guarded;
using mg::capi::require;

extern "C" {

#define MG_STRING(x) #x
#define MG_VERSION_TEXT(major, minor, patch) \
  MG_STRING(major) "." MG_STRING(minor) "." MG_STRING(patch)

const char* mg_version(void) {
  return MG_VERSION_TEXT(MG_VERSION_MAJOR, MG_VERSION_MINOR, MG_VERSION_PATCH);
}

const char* mg_last_error(void) {
  return mg::capi::last_error_text();
}

const char* mg_status_string(mg_status status) {
  switch (status) {
    case MG_OK:
      return "MG_OK";
    case MG_ERROR_INVALID_ARGUMENT:
      return "MG_ERROR_INVALID_ARGUMENT";
    case MG_ERROR_INVALID_STATE:
      return "MG_ERROR_INVALID_STATE";
    case MG_ERROR_UNSUPPORTED_DEVICE:
      return "MG_ERROR_UNSUPPORTED_DEVICE";
    case MG_ERROR_FAILED:
      return "MG_ERROR_FAILED";
    case MG_ERROR_OUT_OF_MEMORY:
      return "MG_ERROR_OUT_OF_MEMORY";
    case MG_ERROR_INTERNAL:
      return "MG_ERROR_INTERNAL";
  }
  return "MG_ERROR_UNKNOWN_STATUS";
}

mg_status mg_device_open(const char* selector, mg_device** device) {
  return guarded([&] {
    require(device, "device (the result pointer)");
    *device = nullptr;
    auto opened = std::make_unique<mg_device>();
    opened->shared = mg::open_shared_device(selector ? selector : "");
    opened->tensors = mg::make_shared_tensors(opened->shared);
    opened->description = mg::gpu::describe_device(mg::gpu_device(*opened->shared).info());
    *device = opened.release();
  });
}

mg_status mg_device_description(const mg_device* device, const char** text) {
  return guarded([&] {
    require(device, "device");
    require(text, "text");
    *text = device->description.c_str();
  });
}

mg_status mg_device_release(mg_device* device) {
  return guarded([&] { delete device; });
}

}  // extern "C"
