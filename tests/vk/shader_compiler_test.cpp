#include "meganeura/error.hpp"
#include "vk_test_support.hpp"

namespace mg::gpu {
namespace {

TEST(ShaderCompiler, ProducesValidatedSpirv) {
  auto spirv = compile_glsl(testing::scale_add_kernel());
  ASSERT_GT(spirv.size(), 5u);
  EXPECT_EQ(spirv[0], 0x07230203u);
}

TEST(ShaderCompiler, ErrorShowsLabelDefinesAndLine) {
  KernelSpec spec = testing::scale_add_kernel();
  spec.label = "broken_kernel";
  spec.source += "void helper() { float x = undefined_thing * 2.0; }\n";
  try {
    compile_glsl(spec);
    FAIL() << "expected a compile error";
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("broken_kernel"), std::string::npos) << message;
    EXPECT_NE(message.find("SCALE=2.0"), std::string::npos) << message;
    // The line, numbered as in the compiled text (version line and two defines come first).
    EXPECT_NE(message.find("13 | void helper() { float x = undefined_thing * 2.0; }"),
              std::string::npos)
        << message;
  }
}

TEST(ShaderCompiler, RejectsDefineThatIsNotAnIdentifier) {
  KernelSpec spec = testing::scale_add_kernel();
  spec.defines.push_back({"NOT AN IDENTIFIER", "1"});
  EXPECT_THROW(compile_glsl(spec), Error);
}

class CompileInDevice : public testing::DeviceTest {};

TEST_F(CompileInDevice, ErrorFromCreatePipelinesIsReadable) {
  KernelSpec good = testing::scale_add_kernel();
  KernelSpec bad = good;
  bad.label = "bad_one";
  bad.source += "#error deliberately broken\n";
  try {
    device_->create_pipelines(std::vector{good, bad});
    FAIL() << "expected a compile error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad_one"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("deliberately broken"), std::string::npos);
  }
}

}  // namespace
}  // namespace mg::gpu
