// `meganeura fashion-folder OUT_DIR`: writes Fashion-MNIST (the idx files the other commands
// read) as a torchvision-style image folder of PNGs, the ResNet demo's data.
#include <cstdio>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "data/image_folder.hpp"
#include "meganeura/error.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura fashion-folder OUT_DIR [options]

Writes Fashion-MNIST as OUT_DIR/train/<class>/<n>.png and OUT_DIR/test/<class>/<n>.png: gray
PNGs resampled to --size pixels (PIL's bilinear filter), class folders 0-t-shirt-top ...
9-ankle-boot so that sorted names keep Fashion-MNIST's labels. 'meganeura train --model resnet18
--data OUT_DIR' trains on it. OUT_DIR must not exist; an interrupted run leaves
OUT_DIR.partial, never a half folder.

  --size PX     side of the images (default 64)
  --limit N     write only the first N images of each split (default: all, 60000 + 10000)
  --data DIR    Fashion-MNIST idx files (default /usr/share/datasets/fashion-mnist)
)";

}  // namespace

int fashion_folder_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura fashion-folder", words, {"size", "limit", "data"}, {"help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (arguments.positional().size() != 1) {
    throw Error("give one OUT_DIR (usage: meganeura fashion-folder OUT_DIR [--size PX])");
  }
  const int64_t size = arguments.integer("size", 64);
  const int64_t limit = arguments.integer("limit", -1);
  if (size < 1 || size > 4096) throw Error("--size must be in 1..4096 pixels");
  if (arguments.has("limit") && limit <= 0) throw Error("--limit must be positive");
  const std::filesystem::path out_dir = arguments.positional()[0];
  data::write_fashion_image_folder(arguments.text("data", std::string(data::kFashionMnistDir)),
                                   out_dir, static_cast<int>(size), limit);
  std::printf("wrote %s/train and %s/test (%lldx%lld PNGs)\n", out_dir.c_str(), out_dir.c_str(),
              static_cast<long long>(size), static_cast<long long>(size));
  return 0;
}

}  // namespace mg::cli
