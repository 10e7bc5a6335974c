#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "meganeura/error.hpp"
#include "vk_test_support.hpp"

namespace mg::gpu {
namespace {

class Dispatch : public testing::DeviceTest {};

std::vector<float> random_floats(size_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> values(-4.0f, 4.0f);
  std::vector<float> out(count);
  for (float& v : out) v = values(engine);
  return out;
}

TEST_F(Dispatch, ScaleAddCopyFillAndResubmit) {
  constexpr uint32_t count = 1000;  // not a multiple of the workgroup size
  constexpr uint64_t bytes = count * sizeof(float);
  auto pipeline = device_->create_pipelines(std::vector{testing::scale_add_kernel()}).at(0);
  BufferId a = device_->create_buffer(bytes, BufferUse::device, "a");
  BufferId b = device_->create_buffer(bytes, BufferUse::device, "b");
  BufferId c = device_->create_buffer(bytes, BufferUse::device, "c");
  BufferId result = device_->create_buffer(bytes, BufferUse::download, "result");
  BufferId filled = device_->create_buffer(64, BufferUse::device, "filled");

  std::vector<Command> commands(5);
  commands[0].kind = Command::Kind::dispatch;
  commands[0].dispatch = {pipeline,
                          {{a, 0, bytes}, {b, 0, bytes}, {c, 0, bytes}},
                          {count},
                          {(count + 63) / 64, 1, 1},
                          "scale_add"};
  commands[1].kind = Command::Kind::barrier;
  commands[2].kind = Command::Kind::copy;
  commands[2].copy = {{c, 0, bytes}, result, 0};
  commands[3].kind = Command::Kind::fill;
  commands[3].fill = {{filled, 16, 32}, 0x3f800000u};  // 1.0f in words 4..11
  commands[4].kind = Command::Kind::barrier;
  RecordingId recording = device_->record(commands, Timing::per_dispatch);

  for (uint32_t seed : {1u, 2u}) {
    auto va = random_floats(count, seed), vb = random_floats(count, seed + 100);
    write(a, va);
    write(b, vb);
    device_->submit(recording);
    const auto* out = static_cast<const float*>(device_->mapped(result));
    for (uint32_t i = 0; i < count; ++i) ASSERT_EQ(out[i], va[i] * 2.0f + vb[i]) << "at " << i;
  }
  EXPECT_EQ(read<float>(c, count),
            std::vector<float>(static_cast<const float*>(device_->mapped(result)),
                               static_cast<const float*>(device_->mapped(result)) + count));

  auto words = read<uint32_t>(filled, 16);
  for (uint32_t i = 4; i < 12; ++i) EXPECT_EQ(words[i], 0x3f800000u);

  auto timings = device_->timings(recording);
  if (device_->info().caps.timestamps) {
    ASSERT_EQ(timings.size(), 1u);
    EXPECT_EQ(timings[0].label, "scale_add");
    EXPECT_GE(timings[0].duration_ms, 0.0);
  }
}

// Timing::whole: one timestamp pair around three chained dispatches (c = 2a + b, then
// d = 2c + b, then e = 2d + b), one "run" entry, and the results of every dispatch intact.
TEST_F(Dispatch, WholeRunTiming) {
  constexpr uint32_t count = 777;
  constexpr uint64_t bytes = count * sizeof(float);
  auto pipeline = device_->create_pipelines(std::vector{testing::scale_add_kernel()}).at(0);
  std::vector<BufferId> buffers;
  for (const char* name : {"a", "b", "c", "d", "e"})
    buffers.push_back(device_->create_buffer(bytes, BufferUse::device, name));
  const BufferId b = buffers[1];
  std::vector<Command> commands;
  for (size_t step = 0; step < 3; ++step) {
    if (step > 0) commands.push_back({Command::Kind::barrier});
    Command dispatch{Command::Kind::dispatch};
    const BufferId source = step == 0 ? buffers[0] : buffers[step + 1];
    dispatch.dispatch = {pipeline,
                         {{source, 0, bytes}, {b, 0, bytes}, {buffers[step + 2], 0, bytes}},
                         {count},
                         {(count + 63) / 64, 1, 1},
                         "scale_add " + std::to_string(step)};
    commands.push_back(dispatch);
  }
  RecordingId recording = device_->record(commands, Timing::whole);
  const auto va = random_floats(count, 5), vb = random_floats(count, 6);
  write(buffers[0], va);
  write(b, vb);
  device_->submit(recording);
  const std::vector<float> e = read<float>(buffers[4], count);
  for (uint32_t i = 0; i < count; ++i) {
    float value = va[i];
    for (int step = 0; step < 3; ++step) value = value * 2.0f + vb[i];
    ASSERT_EQ(e[i], value) << "at " << i;
  }
  const auto timings = device_->timings(recording);
  if (device_->info().caps.timestamps) {
    ASSERT_EQ(timings.size(), 1u);
    EXPECT_EQ(timings[0].label, "run");
    EXPECT_GE(timings[0].duration_ms, 0.0);
  } else {
    EXPECT_TRUE(timings.empty());
  }
}

TEST_F(Dispatch, ParallelBuildKeepsSpecOrder) {
  std::vector<KernelSpec> specs;
  for (int scale = 0; scale < 6; ++scale) {
    specs.push_back(testing::scale_add_kernel());
    specs.back().label = "scale_" + std::to_string(scale);
    specs.back().defines[1].second = std::to_string(scale) + ".0";
  }
  auto pipelines = device_->create_pipelines(specs);
  ASSERT_EQ(pipelines.size(), 6u);
  EXPECT_EQ(device_->last_compile_stats().pipelines, 6u);

  constexpr uint32_t count = 70;
  constexpr uint64_t bytes = count * sizeof(float);
  BufferId a = device_->create_buffer(bytes, BufferUse::upload, "a");
  BufferId b = device_->create_buffer(bytes, BufferUse::upload, "b");
  BufferId c = device_->create_buffer(bytes, BufferUse::download, "c");
  auto va = random_floats(count, 7), vb = random_floats(count, 8);
  write(a, va);
  write(b, vb);
  std::vector<Command> commands(1);
  commands[0].kind = Command::Kind::dispatch;
  commands[0].dispatch = {
      pipelines[3], {{a, 0, bytes}, {b, 0, bytes}, {c, 0, bytes}}, {count}, {2, 1, 1}, ""};
  device_->submit(device_->record(commands, Timing::none));
  auto out = read<float>(c, count);
  for (uint32_t i = 0; i < count; ++i) ASSERT_EQ(out[i], va[i] * 3.0f + vb[i]) << "at " << i;
}

TEST_F(Dispatch, ChromeTraceHasOneEventPerDispatch) {
  testing::TemporaryDirectory directory;
  std::string path = (directory.path() / "trace.json").string();
  // The second dispatch's FLOPs and bytes are known and become its args; the first's are not.
  write_chrome_trace({{"first", 0.0, 0.5}, {"second", 0.5, 0.25, 3e6, 8192}}, path);
  auto trace = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(trace["traceEvents"].size(), 2u);
  EXPECT_EQ(trace["traceEvents"][1]["name"], "second");
  EXPECT_EQ(trace["traceEvents"][1]["ph"], "X");
  EXPECT_DOUBLE_EQ(trace["traceEvents"][1]["ts"].get<double>(), 500.0);
  EXPECT_DOUBLE_EQ(trace["traceEvents"][1]["dur"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(trace["traceEvents"][1]["args"]["flops"].get<double>(), 3e6);
  EXPECT_DOUBLE_EQ(trace["traceEvents"][1]["args"]["bytes"].get<double>(), 8192.0);
  EXPECT_FALSE(trace["traceEvents"][0].contains("args"));
}

TEST_F(Dispatch, RecordRejectsBadBindings) {
  auto pipeline = device_->create_pipelines(std::vector{testing::scale_add_kernel()}).at(0);
  const DeviceCaps& caps = device_->info().caps;
  // Larger than one binding may cover, which is allowed for the buffer itself.
  uint64_t big = caps.max_storage_buffer_range + 256;
  BufferId large = device_->create_buffer(big, BufferUse::device, "large");
  BufferId small = device_->create_buffer(1024, BufferUse::device, "small");

  auto dispatch_binding = [&](BufferRange first) {
    std::vector<Command> commands(1);
    commands[0].kind = Command::Kind::dispatch;
    commands[0].dispatch = {
        pipeline, {first, {small, 0, 256}, {small, 256, 256}}, {1}, {1, 1, 1}, "bad"};
    return commands;
  };
  EXPECT_THROW(device_->record(dispatch_binding({large, 0, big}), Timing::none), Error);
  EXPECT_NO_THROW(
      device_->record(dispatch_binding({large, 256, caps.max_storage_buffer_range}), Timing::none));
  EXPECT_THROW(device_->record(dispatch_binding({small, 512, 1024}), Timing::none), Error);
  if (caps.min_storage_buffer_offset_alignment > 4) {
    EXPECT_THROW(device_->record(dispatch_binding({small, 4, 256}), Timing::none), Error);
  }
  try {
    device_->record(dispatch_binding({large, 0, big}), Timing::none);
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("maxStorageBufferRange"), std::string::npos);
  }
}

TEST_F(Dispatch, DestroyedBufferMakesRecordingStale) {
  BufferId source = device_->create_buffer(64, BufferUse::device, "source");
  BufferId target = device_->create_buffer(64, BufferUse::device, "target");
  std::vector<Command> commands(1);
  commands[0].kind = Command::Kind::copy;
  commands[0].copy = {{source, 0, 64}, target, 0};
  RecordingId recording = device_->record(commands, Timing::none);
  device_->submit(recording);
  device_->destroy_buffer(source);
  EXPECT_THROW(device_->submit(recording), Error);
}

}  // namespace
}  // namespace mg::gpu
