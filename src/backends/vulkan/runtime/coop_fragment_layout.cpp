#include "backends/vulkan/runtime/coop_fragment_layout.hpp"

#include <cstring>
#include <exception>
#include <vector>

namespace mg::gpu {
namespace {

// Element (r, c) of the A fragment holds 16 r + c and of the accumulator 8 r + c (both exact in
// f16 and f32); lane l writes its A components to out[8 l ..] and its accumulator components
// to out[256 + 4 l ..].
constexpr const char* kProbe = R"glsl(
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
layout(std430, set = 0, binding = 0) readonly buffer a_values { float16_t a[]; };
layout(std430, set = 0, binding = 1) readonly buffer accumulator_values { float c[]; };
layout(std430, set = 0, binding = 2) writeonly buffer components { float out_[]; };
void main() {
  uint lane = gl_LocalInvocationID.x;
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a_fragment;
  coopMatLoadNV(a_fragment, a, 0, 16, false);
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b_fragment = fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>(0.0);
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> accumulator;
  coopMatLoadNV(accumulator, c, 0, 8, false);
  // A zero product keeps the accumulator as loaded and gives the KHR rewrite each matrix's use.
  accumulator = coopMatMulAddNV(a_fragment, b_fragment, accumulator);
  for (int e = 0; e < a_fragment.length(); ++e) out_[8 * lane + e] = float(a_fragment[e]);
  for (int e = 0; e < accumulator.length(); ++e) out_[256 + 4 * lane + e] = accumulator[e];
}
)glsl";

constexpr int kLanes = 32;

// The f16 bits of a whole number below 2048 (exact).
uint16_t half_of_whole(uint32_t n) {
  if (n == 0) return 0;
  int exponent = 0;
  while ((n >> (exponent + 1)) != 0) ++exponent;
  const uint32_t mantissa = (n << (10 - exponent)) & 0x3ffu;
  return static_cast<uint16_t>(((exponent + 15) << 10) | mantissa);
}

template <size_t kElements>
bool decode(const float* values, int columns, int rows,
            std::array<std::array<FragmentElement, kElements>, kLanes>& into) {
  std::vector<int> seen(static_cast<size_t>(rows * columns), 0);
  for (int lane = 0; lane < kLanes; ++lane) {
    for (size_t e = 0; e < kElements; ++e) {
      const float value = values[lane * kElements + e];
      const int position = static_cast<int>(value);
      if (static_cast<float>(position) != value || position < 0 || position >= rows * columns)
        return false;
      ++seen[static_cast<size_t>(position)];
      into[lane][e] = {static_cast<uint8_t>(position / columns),
                       static_cast<uint8_t>(position % columns)};
    }
  }
  for (const int count : seen)
    if (count != 1) return false;
  return true;
}

}  // namespace

std::optional<FragmentLayout> probe_fragment_layout(Device& device, bool khr) {
  if (device.info().caps.subgroup_size != kLanes) return std::nullopt;
  std::vector<uint16_t> a_values(16 * 16);
  for (size_t e = 0; e < a_values.size(); ++e)
    a_values[e] = half_of_whole(static_cast<uint32_t>(e));
  std::vector<float> accumulator_values(16 * 8);
  for (size_t e = 0; e < accumulator_values.size(); ++e)
    accumulator_values[e] = static_cast<float>(e);
  std::vector<float> components(kLanes * 12, -1.0f);

  KernelSpec spec;
  spec.label = khr ? "fragment layout probe (KHR)" : "fragment layout probe (NV)";
  spec.source = kProbe;
  spec.binding_count = 3;
  spec.khr_cooperative_matrix = khr;
  std::vector<BufferId> buffers;
  try {
    const PipelineId pipeline = device.create_pipelines(std::span(&spec, 1))[0];
    const auto buffer = [&](size_t bytes, const char* label) {
      buffers.push_back(device.create_buffer(bytes, BufferUse::device, label));
      return BufferRange{buffers.back(), 0, bytes};
    };
    const BufferRange a = buffer(a_values.size() * 2, "probe A");
    const BufferRange c = buffer(accumulator_values.size() * 4, "probe accumulator");
    const BufferRange out = buffer(components.size() * 4, "probe components");
    device.write_buffer(a.buffer, 0, std::as_bytes(std::span(a_values)));
    device.write_buffer(c.buffer, 0, std::as_bytes(std::span(accumulator_values)));
    device.write_buffer(out.buffer, 0, std::as_bytes(std::span(components)));
    Command dispatch;
    dispatch.kind = Command::Kind::dispatch;
    dispatch.dispatch = {pipeline, {a, c, out}, {}, {1, 1, 1}, spec.label};
    const RecordingId recording = device.record(std::span(&dispatch, 1), Timing::none);
    device.submit(recording);
    device.destroy_recording(recording);
    device.destroy_pipelines(std::span(&pipeline, 1));
    device.read_buffer(out.buffer, 0, std::as_writable_bytes(std::span(components)));
  } catch (const std::exception&) {
    for (const BufferId id : buffers) device.destroy_buffer(id);
    return std::nullopt;
  }
  for (const BufferId id : buffers) device.destroy_buffer(id);
  FragmentLayout layout;
  if (!decode(components.data(), 16, 16, layout.a) ||
      !decode(components.data() + kLanes * 8, 8, 16, layout.accumulator))
    return std::nullopt;
  return layout;
}

bool is_quad_row_layout(const FragmentLayout& layout) {
  const auto at = [](const FragmentElement& element, int row, int col) {
    return element.row == row && element.col == col;
  };
  for (int lane = 0; lane < kLanes; ++lane) {
    const int row = lane / 4, col = 2 * (lane % 4);
    for (int e = 0; e < 4; ++e)
      if (!at(layout.accumulator[lane][e], row + 8 * (e / 2), col + e % 2)) return false;
    for (int e = 0; e < 8; ++e)
      if (!at(layout.a[lane][e], row + 8 * (e / 4), col + 8 * ((e / 2) % 2) + e % 2)) return false;
  }
  return true;
}

}  // namespace mg::gpu
