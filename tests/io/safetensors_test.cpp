#include "io/safetensors.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "scratch_dir.hpp"
#include "tensor_samples.hpp"

namespace mg::io {
namespace {

using testing::expect_error;

class SafetensorsTest : public testing::ScratchDirTest {
 protected:
  SafetensorsFile sample_file() {
    std::mt19937 random(42);
    SafetensorsFile file;
    file.metadata = {{"format", "pt"}, {"note", "seeded sample"}};
    file.tensors.push_back(
        testing::random_tensor("model.layers.0.weight", DType::f32, {3, 5}, random));
    file.tensors.push_back(testing::random_tensor("model.layers.0.bias", DType::bf16, {5}, random));
    file.tensors.push_back(testing::random_tensor("scale", DType::f16, {}, random));
    file.tensors.push_back(testing::random_tensor("ids", DType::i32, {2, 1, 3}, random));
    file.tensors.push_back(testing::random_tensor("counts", DType::u32, {7}, random));
    file.tensors.push_back(testing::random_tensor("empty", DType::f32, {0, 4}, random));
    return file;
  }

  // Writes a file from raw header text and data, to craft malformed inputs.
  std::filesystem::path craft(const std::string& header, size_t data_bytes) {
    const std::filesystem::path file = path("crafted.safetensors");
    std::vector<std::byte> bytes(8 + header.size() + data_bytes, std::byte{0x5A});
    const uint64_t length = header.size();
    std::memcpy(bytes.data(), &length, 8);
    std::memcpy(bytes.data() + 8, header.data(), header.size());
    testing::write_bytes(file, bytes);
    return file;
  }
};

void expect_same_tensors(const std::vector<TensorRecord>& expected,
                         const std::vector<TensorRecord>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].name, actual[i].name);
    EXPECT_EQ(expected[i].dtype, actual[i].dtype) << expected[i].name;
    EXPECT_EQ(expected[i].shape, actual[i].shape) << expected[i].name;
    EXPECT_EQ(expected[i].bytes, actual[i].bytes) << expected[i].name;
  }
}

TEST_F(SafetensorsTest, RoundTripKeepsNamesTypesShapesBytesAndMetadata) {
  const SafetensorsFile file = sample_file();
  write_safetensors(path("a.safetensors"), file);
  const SafetensorsFile read = read_safetensors(path("a.safetensors"));
  EXPECT_EQ(read.metadata, file.metadata);
  expect_same_tensors(file.tensors, read.tensors);
  ASSERT_NE(read.find("scale"), nullptr);
  EXPECT_TRUE(read.find("scale")->shape.empty());
  EXPECT_EQ(read.find("missing"), nullptr);
  EXPECT_FALSE(std::filesystem::exists(path("a.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST_F(SafetensorsTest, HeaderIsPaddedSoDataIsEightByteAligned) {
  write_safetensors(path("a.safetensors"), sample_file());
  const auto bytes = testing::read_bytes(path("a.safetensors"));
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  SafetensorsFile file = sample_file();
  file.tensors[1].bytes.pop_back();
  expect_error([&] { write_safetensors(path("w.safetensors"), file); },
               {path("w.safetensors").string(), "model.layers.0.bias"});
  file = sample_file();
  file.tensors.push_back(file.tensors[0]);
  expect_error([&] { write_safetensors(path("w.safetensors"), file); }, {"used twice"});
  EXPECT_FALSE(std::filesystem::exists(path("w.safetensors")));
}

TEST_F(SafetensorsTest, ReadsFileWrittenByPython) {
  if (!std::filesystem::exists(testing::kPython)) GTEST_SKIP() << "no " << testing::kPython;
  testing::write_text(path("write.py"), R"PY(
import json, random, struct, sys
out_path, expected_path = sys.argv[1], sys.argv[2]
rng = random.Random(1234)
def round_trip(fmt, values):
    return list(struct.unpack("<%d%s" % (len(values), fmt), struct.pack("<%d%s" % (len(values), fmt), *values)))
tensors = []
f32 = round_trip("f", [rng.uniform(-3, 3) for _ in range(6)])
tensors.append(("model.layers.0.weight", "F32", [2, 3], struct.pack("<6f", *f32), f32))
i32 = [rng.randint(-2**31, 2**31 - 1) for _ in range(4)]
tensors.append(("ids", "I32", [4], struct.pack("<4i", *i32), i32))
u32 = [rng.randint(1, 2**32 - 1) for _ in range(4)]
tensors.append(("counts", "U32", [2, 2], struct.pack("<4I", *u32), u32))
f16 = round_trip("e", [rng.uniform(-3, 3)])
tensors.append(("scale", "F16", [], struct.pack("<e", *f16), f16))
bf16_bits = [struct.unpack("<I", struct.pack("<f", rng.uniform(-3, 3)))[0] >> 16 for _ in range(3)]
bf16 = [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bf16_bits]
tensors.append(("model.norm.weight", "BF16", [3], struct.pack("<3H", *bf16_bits), bf16))
tensors.append(("empty", "F32", [0, 5], b"", []))
header, data, expected = {"__metadata__": {"format": "pt", "source": "python"}}, b"", {}
for name, dtype, shape, raw, values in reversed(tensors):
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
    expected[name] = {"dtype": dtype, "shape": shape, "values": values}
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(out_path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
with open(expected_path, "w") as f:
    json.dump(expected, f)
)PY");
  ASSERT_EQ(testing::run_python(path("write.py"), path("py.safetensors").string() + " " +
                                                      path("expected.json").string()),
            0);
  const SafetensorsFile file = read_safetensors(path("py.safetensors"));
  EXPECT_EQ(file.metadata.at("source"), "python");
  std::ifstream expected_stream(path("expected.json"));
  const nlohmann::json expected = nlohmann::json::parse(expected_stream);
  ASSERT_EQ(file.tensors.size(), expected.size());
  for (const auto& [name, want] : expected.items()) {
    const TensorRecord* tensor = file.find(name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(safetensors_dtype_name(tensor->dtype), want["dtype"].get<std::string>());
    EXPECT_EQ(tensor->shape, want["shape"].get<Shape>());
    const auto& values = want["values"];
    ASSERT_EQ(tensor->bytes.size(), values.size() * safetensors_dtype_bytes(tensor->dtype));
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(testing::element_value(*tensor, i), values[i].get<double>())
          << name << "[" << i << "]";
    }
  }
}

TEST_F(SafetensorsTest, PythonReadsOurFile) {
  if (!std::filesystem::exists(testing::kPython)) GTEST_SKIP() << "no " << testing::kPython;
  const SafetensorsFile file = sample_file();
  write_safetensors(path("ours.safetensors"), file);
  testing::write_text(path("read.py"), R"PY(
import json, struct, sys
formats = {"F32": ("f", 4), "F16": ("e", 2), "I32": ("i", 4), "U32": ("I", 4)}
raw = open(sys.argv[1], "rb").read()
(length,) = struct.unpack("<Q", raw[:8])
assert (8 + length) % 8 == 0, "data is not 8-byte aligned"
header = json.loads(raw[8:8 + length])
data = raw[8 + length:]
out = {"__metadata__": header.pop("__metadata__")}
spans = sorted(tuple(entry["data_offsets"]) for entry in header.values())
assert spans[0][0] == 0 and spans[-1][1] == len(data), "data not fully indexed"
assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "holes or overlaps"
for name, entry in header.items():
    begin, end = entry["data_offsets"]
    chunk = data[begin:end]
    if entry["dtype"] == "BF16":
        bits = struct.unpack("<%dH" % (len(chunk) // 2), chunk)
        values = [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]
    else:
        fmt, size = formats[entry["dtype"]]
        values = list(struct.unpack("<%d%s" % (len(chunk) // size, fmt), chunk))
    out[name] = {"dtype": entry["dtype"], "shape": entry["shape"], "values": values}
json.dump(out, open(sys.argv[2], "w"))
)PY");
  ASSERT_EQ(testing::run_python(path("read.py"), path("ours.safetensors").string() + " " +
                                                     path("seen.json").string()),
            0);
  std::ifstream seen_stream(path("seen.json"));
  const nlohmann::json seen = nlohmann::json::parse(seen_stream);
  using Metadata = std::map<std::string, std::string>;
  EXPECT_EQ(seen["__metadata__"].get<Metadata>(), file.metadata);
  for (const TensorRecord& tensor : file.tensors) {
    const auto& entry = seen.at(tensor.name);
    EXPECT_EQ(entry["dtype"].get<std::string>(), safetensors_dtype_name(tensor.dtype));
    EXPECT_EQ(entry["shape"].get<Shape>(), tensor.shape);
    const auto& values = entry["values"];
    ASSERT_EQ(values.size() * safetensors_dtype_bytes(tensor.dtype), tensor.bytes.size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(values[i].get<double>(), testing::element_value(tensor, i)) << tensor.name;
    }
  }
}

TEST_F(SafetensorsTest, MissingFileIsNamed) {
  expect_error([&] { read_safetensors(path("nope.safetensors")); },
               {"no safetensors file at", path("nope.safetensors").string()});
}

TEST_F(SafetensorsTest, EveryTruncationIsAnErrorNamingTheFile) {
  write_safetensors(path("full.safetensors"), sample_file());
  const auto bytes = testing::read_bytes(path("full.safetensors"));
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  const size_t cuts[] = {0,
                         3,
                         8,
                         9,
                         8 + header_length / 2,
                         8 + header_length - 1,
                         8 + header_length,
                         8 + header_length + 1,
                         (bytes.size() + 8 + header_length) / 2,
                         bytes.size() - 1};
  for (size_t cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    testing::write_bytes(path("cut.safetensors"),
                         std::vector<std::byte>(bytes.begin(), bytes.begin() + cut));
    expect_error([&] { read_safetensors(path("cut.safetensors")); },
                 {path("cut.safetensors").string()});
  }
}

TEST_F(SafetensorsTest, FlippedHeaderBytesNeverCrash) {
  write_safetensors(path("full.safetensors"), sample_file());
  const auto bytes = testing::read_bytes(path("full.safetensors"));
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  std::mt19937 random(7);
  int errors = 0;
  // The length field, then a seeded sample of header positions (every one is slow on busy disks).
  std::vector<size_t> positions = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int i = 0; i < 150; ++i) positions.push_back(8 + random() % header_length);
  for (size_t position : positions) {
    auto corrupt = bytes;
    corrupt[position] ^= std::byte(1 + random() % 255);
    testing::write_bytes(path("flip.safetensors"), corrupt);
    // A flip inside a tensor name or metadata text can leave a valid file; anything else must be
    // reported as mg::Error naming the file.
    try {
      read_safetensors(path("flip.safetensors"));
    } catch (const Error& error) {
      ++errors;
      EXPECT_NE(std::string(error.what()).find(path("flip.safetensors").string()),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_GT(errors, static_cast<int>(positions.size()) / 2);
}

TEST_F(SafetensorsTest, MalformedHeadersAreExplained) {
  const std::string file = path("crafted.safetensors").string();
  const auto entry = [](const std::string& dtype, const std::string& shape,
                        const std::string& offsets) {
    return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets +
           "}";
  };
  expect_error([&] { read_safetensors(craft("{not json", 0)); }, {file, "malformed JSON header"});
  expect_error([&] { read_safetensors(craft("[1,2]", 0)); }, {file, "not a JSON object"});
  expect_error(
      [&] { read_safetensors(craft(R"({"a":)" + entry("F64", "[2]", "[0,16]") + "}", 16)); },
      {file, "unsupported dtype 'F64'"});
  expect_error(
      [&] { read_safetensors(craft(R"({"a":)" + entry("F32", "[2]", "[0,12]") + "}", 12)); },
      {file, "span 12 bytes"});
  expect_error(
      [&] { read_safetensors(craft(R"({"a":)" + entry("F32", "[4]", "[0,16]") + "}", 8)); },
      {file, "truncated"});
  expect_error([&] { read_safetensors(craft(R"({"a":)" + entry("F32", "[2]", "[8,0]") + "}", 8)); },
               {file, "end before they begin"});
  expect_error(
      [&] { read_safetensors(craft(R"({"a":)" + entry("F32", "[-2]", "[0,8]") + "}", 8)); },
      {file, "not a non-negative integer"});
  expect_error(
      [&] {
        read_safetensors(craft(R"({"a":)" + entry("F32", "[2]", "[0,8]") + R"(,"b":)" +
                                   entry("F32", "[2]", "[4,12]") + "}",
                               12));
      },
      {file, "overlap"});
  expect_error(
      [&] { read_safetensors(craft(R"({"a":)" + entry("F32", "[2]", "[4,12]") + "}", 12)); },
      {file, "belong to no tensor"});
  expect_error(
      [&] { read_safetensors(craft(R"({"a":)" + entry("F32", "[2]", "[0,8]") + "}", 11)); },
      {file, "3 bytes of trailing data"});
  expect_error([&] { read_safetensors(craft(R"({"__metadata__":{"k":3}})", 0)); },
               {file, "metadata entry 'k' is not a string"});
  expect_error([&] { read_safetensors(craft(R"({"a":{"dtype":"F32"}})", 0)); }, {file, "no shape"});
}

TEST_F(SafetensorsTest, NestingDeeperThanAHeaderIsRefusedBeforeParsing) {
  const std::string file = path("crafted.safetensors").string();
  expect_error([&] { read_safetensors(craft(R"({"a":{"shape":[[1]]}})", 0)); },
               {file, "nests deeper than the 3 levels"});
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  expect_error([&] { read_safetensors(craft(R"({"a":)" + deep + "}", 0)); },
               {file, "nests deeper"});
}

TEST_F(SafetensorsTest, ErrorLinesQuoteLongInputShortly) {
  const std::string name(30000, 'n');
  try {
    read_safetensors(craft(R"({")" + name + R"(":{"dtype":"F32"}})", 0));
    FAIL() << "a tensor without a shape was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("no shape array"), std::string::npos) << message;
    EXPECT_NE(message.find("nnn..."), std::string::npos) << message;
    EXPECT_LT(message.size(), 400u);
  }
}

TEST_F(SafetensorsTest, HugeHeaderLengthIsRejectedWithoutAllocating) {
  std::vector<std::byte> bytes(16, std::byte{0});
  const uint64_t length = uint64_t{1} << 62;
  std::memcpy(bytes.data(), &length, 8);
  testing::write_bytes(path("huge.safetensors"), bytes);
  expect_error([&] { read_safetensors(path("huge.safetensors")); },
               {path("huge.safetensors").string(), "header length"});
}

}  // namespace
}  // namespace mg::io
