#include "io/image.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <string>

#include "scratch_dir.hpp"

namespace mg::io {
namespace {

using testing::expect_error;

Image random_image(int width, int height, int channels, unsigned seed) {
  std::mt19937 random(seed);
  Image image{width, height, channels,
              std::vector<uint8_t>(static_cast<size_t>(width) * height * channels)};
  for (auto& value : image.pixels) value = static_cast<uint8_t>(random());
  return image;
}

class ImageTest : public testing::ScratchDirTest {};

void append_big_endian(std::vector<std::byte>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(std::byte(value >> shift));
}

// One PNG chunk with its length and CRC.
void append_chunk(std::vector<std::byte>& out, const char* type, const std::vector<uint8_t>& data) {
  append_big_endian(out, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> typed(type, type + 4);
  typed.insert(typed.end(), data.begin(), data.end());
  for (uint8_t byte : typed) out.push_back(std::byte{byte});
  append_big_endian(out, static_cast<uint32_t>(crc32(0, typed.data(), typed.size())));
}

std::vector<uint8_t> ihdr(uint32_t width, uint32_t height, uint8_t color_type) {
  std::vector<uint8_t> data;
  for (uint32_t value : {width, height}) {
    for (int shift = 24; shift >= 0; shift -= 8)
      data.push_back(static_cast<uint8_t>(value >> shift));
  }
  data.insert(data.end(), {8, color_type, 0, 0, 0});
  return data;
}

// A PNG declaring width x height RGBA whose image data is one deflated zero row.
std::vector<std::byte> png_declaring(uint32_t width, uint32_t height, bool second_ihdr) {
  std::vector<uint8_t> row(1 + 4 * size_t{std::min(width, 64u)});
  std::vector<uint8_t> packed(compressBound(static_cast<uLong>(row.size())));
  uLongf packed_size = packed.size();
  compress(packed.data(), &packed_size, row.data(), static_cast<uLong>(row.size()));
  packed.resize(packed_size);
  std::vector<std::byte> out;
  for (int byte : {0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A}) out.push_back(std::byte(byte));
  append_chunk(out, "IHDR", ihdr(width, height, 6));
  append_chunk(out, "IDAT", packed);
  if (second_ihdr) append_chunk(out, "IHDR", ihdr(width, height, 6));
  append_chunk(out, "IEND", {});
  return out;
}

TEST_F(ImageTest, PngRoundTripForEveryChannelCount) {
  for (int channels = 1; channels <= 4; ++channels) {
    const Image image = random_image(13, 7, channels, 100 + channels);
    const auto file = path("round" + std::to_string(channels) + ".png");
    write_png(file, image);
    const Image read = read_image(file);
    EXPECT_EQ(read.width, 13);
    EXPECT_EQ(read.height, 7);
    EXPECT_EQ(read.channels, channels);
    EXPECT_EQ(read.pixels, image.pixels) << channels << " channels";
  }
}

TEST_F(ImageTest, ReadsPngsWrittenByPythonOfEveryKind) {
  if (!std::filesystem::exists(testing::kPython)) GTEST_SKIP() << "no " << testing::kPython;
  testing::write_text(path("png.py"), R"PY(
import random, struct, sys, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)
def write_png(path, width, height, color_type, channels, pixels):
    stride, rows, previous = width * channels, b"", bytes(width * channels)
    for y in range(height):
        row, kind, out = pixels[y * stride:(y + 1) * stride], y % 5, bytearray()
        for i, x in enumerate(row):
            a = row[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            out.append((x - [0, a, b, (a + b) // 2, paeth(a, b, c)][kind]) & 255)
        rows += bytes([kind]) + bytes(out)
        previous = row
    data = zlib.compress(rows, 9)
    half = len(data) // 2  # two IDAT chunks, as encoders may split them
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
    png += chunk(b"tEXt", b"Comment\x00made by hand") + chunk(b"IDAT", data[:half])
    png += chunk(b"IDAT", data[half:]) + chunk(b"IEND", b"")
    open(path, "wb").write(png)
rng = random.Random(77)
for name, color_type, channels in [("rgb", 2, 3), ("gray_alpha", 4, 2), ("rgba", 6, 4), ("gray", 0, 1)]:
    width, height = 11, 10
    pixels = bytes(rng.randrange(256) for _ in range(width * height * channels))
    write_png(sys.argv[1] + "/" + name + ".png", width, height, color_type, channels, pixels)
    open(sys.argv[1] + "/" + name + ".raw", "wb").write(pixels)
def png(path, width, height, bit_depth, color_type, interlace, rows, extra=b""):
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra +
                           chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
width, height = 11, 10
samples = [rng.randrange(65536) for _ in range(width * height * 3)]
rows = b"".join(b"\x00" + struct.pack(">%dH" % (width * 3), *samples[y * width * 3:(y + 1) * width * 3])
                for y in range(height))
png(sys.argv[1] + "/sixteen.png", width, height, 16, 2, 0, rows)
open(sys.argv[1] + "/sixteen.raw", "wb").write(bytes(sample >> 8 for sample in samples))
palette = bytes(rng.randrange(256) for _ in range(7 * 3))
indices = [rng.randrange(7) for _ in range(width * height)]
rows = b"".join(b"\x00" + bytes(indices[y * width:(y + 1) * width]) for y in range(height))
png(sys.argv[1] + "/palette.png", width, height, 8, 3, 0, rows, chunk(b"PLTE", palette))
open(sys.argv[1] + "/palette.raw", "wb").write(b"".join(palette[i * 3:i * 3 + 3] for i in indices))
pixels = bytes(rng.randrange(256) for _ in range(width * height * 3))
rows = b""
for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]:
    for y in range(y0, height, dy):
        columns = range(x0, width, dx)
        if columns:
            rows += b"\x00" + b"".join(pixels[(y * width + x) * 3:(y * width + x) * 3 + 3] for x in columns)
png(sys.argv[1] + "/interlaced.png", width, height, 8, 2, 1, rows)
open(sys.argv[1] + "/interlaced.raw", "wb").write(pixels)
)PY");
  ASSERT_EQ(testing::run_python(path("png.py"), dir_.string()), 0);
  // 16-bit samples keep their high byte; palette entries expand to RGB; Adam7 is de-interlaced.
  const std::pair<const char*, int> kinds[] = {{"rgb", 3},       {"gray_alpha", 2}, {"rgba", 4},
                                               {"gray", 1},      {"sixteen", 3},    {"palette", 3},
                                               {"interlaced", 3}};
  for (const auto& [name, channels] : kinds) {
    const Image image = read_png(path(std::string(name) + ".png"));
    EXPECT_EQ(image.width, 11);
    EXPECT_EQ(image.height, 10);
    EXPECT_EQ(image.channels, channels);
    const auto raw = testing::read_bytes(path(std::string(name) + ".raw"));
    ASSERT_EQ(raw.size(), image.pixels.size());
    EXPECT_TRUE(std::equal(raw.begin(), raw.end(), image.pixels.begin(),
                           [](std::byte a, uint8_t b) { return std::to_integer<uint8_t>(a) == b; }))
        << name;
  }
}

TEST_F(ImageTest, CorruptPngsAreErrorsNamingTheFile) {
  write_png(path("ok.png"), random_image(9, 9, 3, 5));
  auto bytes = testing::read_bytes(path("ok.png"));
  auto flipped = bytes;
  flipped[45] ^= std::byte{0x10};  // inside IDAT
  testing::write_bytes(path("flipped.png"), flipped);
  expect_error([&] { read_png(path("flipped.png")); }, {path("flipped.png").string(), "CRC"});
  for (size_t cut : {size_t{4}, size_t{20}, size_t{50}, bytes.size() - 3}) {
    testing::write_bytes(path("cut.png"),
                         std::vector<std::byte>(bytes.begin(), bytes.begin() + cut));
    expect_error([&] { read_png(path("cut.png")); }, {path("cut.png").string()});
  }
  testing::write_text(path("text.png"), "hello, not an image");
  expect_error([&] { read_image(path("text.png")); }, {path("text.png").string(), "neither"});
  expect_error([&] { read_png(path("absent.png")); }, {"no image at", path("absent.png").string()});
}

// The process's peak resident memory in KiB (Linux's VmHWM), which writing 5 to
// /proc/self/clear_refs resets to the current resident memory; -1 where it cannot be read.
int64_t peak_resident_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6));
  return -1;
}

TEST_F(ImageTest, PngSizesBeyondItsDataAndASecondIhdrAreRefusedBeforeDecoding) {
  testing::write_bytes(path("huge.png"), png_declaring(32768, 32768, false));
  testing::write_bytes(path("bomb.png"), png_declaring(8000, 8000, false));
  std::ofstream clear_refs("/proc/self/clear_refs");
  const bool peak_reset = static_cast<bool>(clear_refs << "5" << std::flush);
  const int64_t before_kib = peak_resident_kib();
  expect_error([&] { read_image(path("huge.png")); }, {path("huge.png").string(), "too large"});
  expect_error([&] { read_png(path("bomb.png")); },
               {path("bomb.png").string(), "declares 8000x8000 but holds only", "too few"});
  const int64_t after_kib = peak_resident_kib();

  testing::write_bytes(path("twice.png"), png_declaring(4, 1, true));
  expect_error([&] { read_image(path("twice.png")); }, {path("twice.png").string(), "second IHDR"});
  testing::write_bytes(path("once.png"), png_declaring(4, 1, false));
  EXPECT_EQ(read_image(path("once.png")).pixels, std::vector<uint8_t>(16, 0));

  // The oversized ones were refused before anything of their declared size (256 MB for the
  // smaller) was allocated and filled: the peak resident memory grew by less than a quarter of it.
  if (!peak_reset || before_kib < 0)
    GTEST_SKIP() << "the peak resident memory cannot be reset and read here (Linux's "
                    "/proc/self/clear_refs and VmHWM): the refusals were checked, not when";
  EXPECT_LT(after_kib - before_kib, 64 * 1024);
}

TEST_F(ImageTest, JpegDeclaringMorePixelsThanItsBytesCanHoldIsRefused) {
  write_jpeg(path("small.jpg"), random_image(16, 16, 3, 9), 90);
  auto bytes = testing::read_bytes(path("small.jpg"));
  // The baseline frame header: FF C0, length, precision, then height and width.
  size_t frame = 2;
  while (frame + 9 < bytes.size() &&
         !(bytes[frame] == std::byte{0xFF} && bytes[frame + 1] == std::byte{0xC0})) {
    ++frame;
  }
  ASSERT_LT(frame + 9, bytes.size());
  for (size_t at : {frame + 5, frame + 7}) {
    bytes[at] = std::byte{0x1F};  // 8000 = 0x1F40
    bytes[at + 1] = std::byte{0x40};
  }
  testing::write_bytes(path("huge.jpg"), bytes);
  expect_error([&] { read_image(path("huge.jpg")); },
               {path("huge.jpg").string(), "declares 8000x8000", "too few for that size"});
}

std::vector<std::byte> as_bytes(const std::vector<uint8_t>& values) {
  std::vector<std::byte> bytes(values.size());
  std::transform(values.begin(), values.end(), bytes.begin(),
                 [](uint8_t value) { return std::byte{value}; });
  return bytes;
}

// A 41-byte run-length TGA declaring 2056x16392 (found by fuzz_image: decoding it took seconds)
// is refused before decoding; a TGA its bytes can hold still loads.
TEST_F(ImageTest, TgaDeclaringMorePixelsThanItsBytesCanHoldIsRefused) {
  const std::vector<uint8_t> huge{0xff, 0x00, 0x0b, 0x00, 0x08, 0x08, 0x08, 0x08, 0x08, 0xff, 0x08,
                                  0x08, 0x08, 0x08, 0x08, 0x40, 0x08, 0x08, 0x08, 0x08, 0x00, 0xc9,
                                  0x3f, 0x7c, 0x01, 0x00, 0x07, 0x1f, 0x08, 0xd7, 0xff, 0xff, 0xff,
                                  0xff, 0xff, 0xff, 0x7f, 0x00, 0xff, 0xfc, 0x5d};
  testing::write_bytes(path("huge.tga"), as_bytes(huge));
  expect_error([&] { read_image(path("huge.tga")); },
               {path("huge.tga").string(), "declares 2056x16392", "too few for that size"});
  // Uncompressed 8-bit gray, 3 x 2, bottom-up rows as TGA stores them by default.
  std::vector<uint8_t> small{0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, 0, 8, 0};
  for (uint8_t value : {10, 20, 30, 40, 50, 60}) small.push_back(value);
  testing::write_bytes(path("small.tga"), as_bytes(small));
  const Image image = read_image(path("small.tga"));
  EXPECT_EQ(image.width, 3);
  EXPECT_EQ(image.height, 2);
  EXPECT_EQ(image.pixels, (std::vector<uint8_t>{40, 50, 60, 10, 20, 30}));
}

// JPEGs (after fill bytes, as stb_image reads them) whose Huffman table declares more than 256
// codes (found by fuzz_image: stb_image wrote past its tables) are refused before decoding; real
// JPEGs pass the walk over their markers.
TEST_F(ImageTest, JpegHuffmanTableOfMoreThan256CodesIsRefused) {
  std::vector<uint8_t> bad{0xff, 0xff, 0xff, 0xff, 0xd8};
  for (int i = 0; i < 13; ++i) bad.push_back(0xff);
  for (uint8_t value : {0xc4, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x03}) bad.push_back(value);
  for (int i = 0; i < 8; ++i) bad.push_back(0x00);
  for (int i = 0; i < 3; ++i) bad.push_back(0xff);
  for (int i = 0; i < 40; ++i) bad.push_back(i == 24 ? 0x40 : 0x00);
  testing::write_bytes(path("huffman.jpg"), as_bytes(bad));
  expect_error([&] { read_image(path("huffman.jpg")); },
               {path("huffman.jpg").string(), "Huffman table declares 768 codes"});
  // The file ends inside the table's counts, which stb_image reads on as zeros.
  std::vector<uint8_t> truncated{0xff, 0xff, 0xd8};
  for (int i = 0; i < 13; ++i) truncated.push_back(0xff);
  for (uint8_t value : {0xc4, 0xff, 0xff, 0x12, 0x00, 0xff, 0xff, 0xff, 0xff})
    truncated.push_back(value);
  testing::write_bytes(path("truncated.jpg"), as_bytes(truncated));
  expect_error([&] { read_image(path("truncated.jpg")); },
               {path("truncated.jpg").string(), "Huffman table declares 1020 codes"});
  write_jpeg(path("fine.jpg"), random_image(40, 24, 3, 5), 85);
  EXPECT_EQ(read_image(path("fine.jpg")).width, 40);
}

TEST_F(ImageTest, JpegRoundTripStaysCloseAndDamagedJpegsAreErrors) {
  // A smooth gradient survives JPEG's quantisation with small errors (noise would not). A gray
  // image comes back as three equal channels, since stb writes every JPEG in colour.
  Image rgb{24, 16, 3, {}};
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 24; ++x) {
      for (int c = 0; c < 3; ++c) rgb.pixels.push_back(static_cast<uint8_t>(20 + 4 * (x + y + c)));
    }
  }
  Image gray{24, 16, 1, {}};
  for (size_t i = 0; i < rgb.pixels.size(); i += 3) gray.pixels.push_back(rgb.pixels[i]);
  for (const Image& image : {rgb, gray}) {
    write_jpeg(path("smooth.jpg"), image, 95);
    const Image read = read_image(path("smooth.jpg"));
    ASSERT_EQ(read.width, 24);
    ASSERT_EQ(read.height, 16);
    ASSERT_EQ(read.channels, 3);
    double total_error = 0;
    for (size_t i = 0; i < read.pixels.size(); ++i) {
      const int expected = image.pixels[image.channels == 3 ? i : i / 3];
      total_error += std::abs(int{read.pixels[i]} - expected);
    }
    EXPECT_LT(total_error / read.pixels.size(), 2.0) << image.channels << " channels";
  }
  const auto bytes = testing::read_bytes(path("smooth.jpg"));
  testing::write_bytes(path("cut.jpg"), std::vector<std::byte>(bytes.begin(), bytes.begin() + 40));
  expect_error([&] { read_image(path("cut.jpg")); },
               {path("cut.jpg").string(), "cannot be decoded"});
  testing::write_bytes(path("empty.jpg"), {});
  expect_error([&] { read_image(path("empty.jpg")); }, {path("empty.jpg").string()});
  expect_error(
      [&] {
        write_jpeg(path("alpha.jpg"), Image{2, 2, 4, std::vector<uint8_t>(16)});
      },
      {path("alpha.jpg").string(), "1 or 3 channels"});
}

TEST_F(ImageTest, ReadsAsciiAndBinaryPgm) {
  testing::write_text(path("ascii.pgm"), "P2\n# a comment\n3 2\n# another\n15\n0 5 10\n15 1 7\n");
  const Image ascii = read_image(path("ascii.pgm"));
  EXPECT_EQ(ascii.width, 3);
  EXPECT_EQ(ascii.height, 2);
  EXPECT_EQ(ascii.channels, 1);
  EXPECT_EQ(ascii.pixels, (std::vector<uint8_t>{0, 85, 170, 255, 17, 119}));

  const Image random = random_image(5, 4, 1, 9);
  std::string binary = "P5 5 4\n255\n";
  binary.append(random.pixels.begin(), random.pixels.end());
  testing::write_text(path("binary.pgm"), binary);
  EXPECT_EQ(read_pgm(path("binary.pgm")).pixels, random.pixels);

  testing::write_text(path("wide.pgm"), std::string("P5 2 1 65535\n\xFF\xFF\x80\x00", 17));
  EXPECT_EQ(read_pgm(path("wide.pgm")).pixels, (std::vector<uint8_t>{255, 128}));

  testing::write_text(path("short.pgm"), binary.substr(0, binary.size() - 2));
  expect_error([&] { read_pgm(path("short.pgm")); }, {path("short.pgm").string(), "truncated"});
  testing::write_text(path("over.pgm"), "P2 1 1 10 11");
  expect_error([&] { read_pgm(path("over.pgm")); }, {path("over.pgm").string(), "above"});
}

TEST(ImageConversion, GrayUsesLumaAndCompositesAlphaOverBlack) {
  const Image rgba{2, 1, 4, {255, 0, 0, 255, 255, 255, 255, 0}};
  const GrayImage gray = to_gray(rgba);
  EXPECT_NEAR(gray.pixels[0], 0.299f, 1e-6f);
  EXPECT_EQ(gray.pixels[1], 0.0f);
  EXPECT_NEAR(to_gray(Image{1, 1, 1, {51}}).pixels[0], 0.2f, 1e-6f);
}

TEST(ImageConversion, ShrinkingAveragesAreasAndGrowingInterpolates) {
  std::mt19937 random(12);
  std::uniform_real_distribution<float> value(0.0f, 1.0f);
  GrayImage big{56, 56, std::vector<float>(56 * 56)};
  for (float& pixel : big.pixels) pixel = value(random);
  const GrayImage small = resize(big, 28, 28);
  ASSERT_EQ(small.pixels.size(), 28u * 28);
  for (int y = 0; y < 28; ++y) {
    for (int x = 0; x < 28; ++x) {
      const float mean =
          (big.pixels[2 * y * 56 + 2 * x] + big.pixels[2 * y * 56 + 2 * x + 1] +
           big.pixels[(2 * y + 1) * 56 + 2 * x] + big.pixels[(2 * y + 1) * 56 + 2 * x + 1]) /
          4;
      EXPECT_NEAR(small.pixels[y * 28 + x], mean, 1e-5f);
    }
  }

  const GrayImage flat = resize(GrayImage{37, 23, std::vector<float>(37 * 23, 0.625f)}, 28, 28);
  for (float pixel : flat.pixels) EXPECT_NEAR(pixel, 0.625f, 1e-5f);

  const GrayImage grown = resize(GrayImage{2, 1, {0.0f, 1.0f}}, 4, 1);
  EXPECT_EQ(grown.pixels, (std::vector<float>{0.0f, 0.25f, 0.75f, 1.0f}));
  expect_error([&] { resize(big, 0, 28); }, {"cannot resize"});
}

}  // namespace
}  // namespace mg::io
