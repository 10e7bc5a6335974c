// Whisper's log-mel features against the numpy twin (tests/parity/whisper_features.py), which
// follows transformers' WhisperFeatureExtractor in both of its number formats: its numpy path and
// its torch path (torch.stft in float32, the one transformers takes when torch is installed).
#include "data/log_mel.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <complex>
#include <fstream>
#include <numbers>
#include <random>

#include "audio_support.hpp"
#include "data/audio.hpp"
#include "data/fft.hpp"

namespace mg::data {
namespace {

using io::testing::expect_error;
using testing::max_abs_difference;
using testing::read_raw;
using testing::write_raw;

// WhisperFeatureExtractor's agreement bound, asked of every comparison with transformers' math.
constexpr double kFeatureTolerance = 1e-4;

TEST(Fft, MatchesTheDirectSumForSmoothAndPrimeSizes) {
  std::mt19937_64 generator(5);
  std::normal_distribution<double> normal;
  for (int size : {1, 2, 6, 7, 49, 128, 400, 401}) {
    SCOPED_TRACE(size);
    std::vector<std::complex<double>> input(static_cast<size_t>(size));
    for (auto& value : input) value = {normal(generator), normal(generator)};
    std::vector<std::complex<double>> output(input.size());
    Fft(size).forward(input, output);
    double magnitude = 0.0;
    for (const auto& value : input) magnitude += std::abs(value);
    for (int k = 0; k < size; ++k) {
      std::complex<long double> sum = 0.0L;
      for (int n = 0; n < size; ++n) {
        const long double angle = -2.0L * std::numbers::pi_v<long double> *
                                  static_cast<long double>((int64_t{n} * k) % size) / size;
        sum += std::complex<long double>(input[n].real(), input[n].imag()) *
               std::complex<long double>(std::cos(angle), std::sin(angle));
      }
      const std::complex<double> exact(static_cast<double>(sum.real()),
                                       static_cast<double>(sum.imag()));
      // Rounding grows with the passes over the data; 1e-14 of the input's magnitude is ample.
      ASSERT_LT(std::abs(output[static_cast<size_t>(k)] - exact), 1e-14 * magnitude) << "bin " << k;
    }
  }
}

class WhisperFeaturesTest : public io::testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    if (!std::filesystem::exists(io::testing::kPython)) {
      GTEST_SKIP() << "no " << io::testing::kPython;
    }
  }

  // The twin's features of `samples` along transformers' `path` ("numpy" or "torch").
  std::vector<float> twin_features(const std::vector<float>& samples, const LogMelConfig& config,
                                   const std::string& path) {
    write_raw(this->path("samples.f32"), samples);
    const std::string arguments =
        "features " + this->path("samples.f32").string() + " " +
        this->path("features.f32").string() + " " + path + " " + std::to_string(config.n_mels) +
        " " + std::to_string(config.sample_rate) + " " + std::to_string(config.n_fft) + " " +
        std::to_string(config.hop_length) + " " + std::to_string(config.chunk_seconds);
    EXPECT_EQ(io::testing::run_python(testing::whisper_twin(), arguments), 0);
    return read_raw<float>(this->path("features.f32"));
  }
};

// Noise with tones and a quiet stretch, so that the log floor and the max - 8 clamp both act.
std::vector<float> seeded_signal(size_t count, int sample_rate, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<float> samples(count);
  for (size_t i = 0; i < count; ++i) {
    const double t = static_cast<double>(i) / sample_rate;
    const double tones = 0.3 * std::sin(2.0 * std::numbers::pi * 440.0 * t) +
                         0.1 * std::sin(2.0 * std::numbers::pi * 3150.0 * t);
    const double envelope = (i / static_cast<size_t>(sample_rate)) % 3 == 1 ? 1e-4 : 1.0;
    samples[i] = static_cast<float>(envelope * (tones + noise(generator)));
  }
  return samples;
}

TEST_F(WhisperFeaturesTest, MelFiltersMatchTheTwin) {
  for (const auto& [mels, rate, n_fft] :
       {std::tuple{80, 16000, 400}, std::tuple{128, 16000, 400}, std::tuple{40, 22050, 512}}) {
    SCOPED_TRACE(std::to_string(mels) + " mels");
    const LogMelConfig config{.sample_rate = rate, .n_fft = n_fft, .n_mels = mels};
    ASSERT_EQ(io::testing::run_python(testing::whisper_twin(),
                                      "filters " + path("filters.f64").string() + " " +
                                          std::to_string(mels) + " " + std::to_string(rate) + " " +
                                          std::to_string(n_fft)),
              0);
    const std::vector<double> twin = read_raw<double>(path("filters.f64"));
    const std::vector<double> ours = whisper_mel_filters(config);
    ASSERT_EQ(ours.size(), twin.size());
    for (size_t i = 0; i < ours.size(); ++i) {
      // Both in double; only the order of operations differs.
      ASSERT_NEAR(ours[i], twin[i], 1e-12) << "entry " << i;
    }
  }
}

TEST_F(WhisperFeaturesTest, SeededSignalsMatchTransformersNumpyPath) {
  struct Case {
    const char* name;
    LogMelConfig config;
    double seconds;
  };
  const Case cases[] = {
      {"whisper 80 mels, 7 s", LogMelConfig{}, 7.0},
      {"large-v3 128 mels, 31 s (cut to 30)", LogMelConfig{.n_mels = 128}, 31.0},
      {"40 mels, n_fft 512, hop 256, 22.05 kHz, 5 s windows",
       LogMelConfig{
           .sample_rate = 22050, .n_fft = 512, .hop_length = 256, .n_mels = 40, .chunk_seconds = 5},
       3.5},
  };
  uint64_t seed = 17;
  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.name);
    const LogMelConfig& config = test_case.config;
    const std::vector<float> samples = seeded_signal(
        static_cast<size_t>(test_case.seconds * config.sample_rate), config.sample_rate, ++seed);
    const std::vector<float> ours = whisper_log_mel(samples, config);
    ASSERT_EQ(ours.size(), static_cast<size_t>(config.n_mels * config.frames()));
    EXPECT_LT(max_abs_difference(ours, twin_features(samples, config, "numpy")), kFeatureTolerance);
  }
}

TEST_F(WhisperFeaturesTest, SpeechMatchesTransformersNumpyAndTorchPaths) {
  const Audio speech = read_audio(testing::audio_fixture("speech_16k.wav"));
  const LogMelConfig config;
  const std::vector<float> ours = whisper_log_mel(speech.samples, config);
  ASSERT_EQ(ours.size(), 80u * 3000u);
  EXPECT_LT(max_abs_difference(ours, twin_features(speech.samples, config, "numpy")),
            kFeatureTolerance);
  EXPECT_LT(max_abs_difference(ours, twin_features(speech.samples, config, "torch")),
            kFeatureTolerance);
}

std::vector<float> read_gzipped_floats(const std::filesystem::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  EXPECT_NE(file, nullptr) << path;
  std::vector<float> values;
  std::vector<float> block(65536);
  while (file != nullptr) {
    const int bytes = gzread(file, block.data(), static_cast<unsigned>(block.size() * 4));
    if (bytes <= 0) break;
    values.insert(values.end(), block.begin(), block.begin() + bytes / 4);
  }
  if (file != nullptr) gzclose(file);
  return values;
}

// Features transformers itself computed (tests/fixtures/audio/transformers_features.json says
// how), with the model folders' own preprocessor_config.json: Whisper tiny's 80 mel bins and
// large-v3's 128.
TEST(WhisperFeatures, SpeechMatchesFeaturesMadeByTransformers) {
  const Audio speech = read_audio(testing::audio_fixture("speech_16k.wav"));
  ASSERT_EQ(speech.samples.size(), 102150u);
  for (int mels : {80, 128}) {
    SCOPED_TRACE(std::to_string(mels) + " mels");
    const std::string suffix = std::to_string(mels);
    std::ifstream config_file(testing::audio_fixture("preprocessor_config_" + suffix + ".json"));
    const LogMelConfig config = log_mel_config_from_json(nlohmann::json::parse(config_file));
    EXPECT_EQ(config.n_mels, mels);
    const std::vector<float> expected =
        read_gzipped_floats(testing::audio_fixture("transformers_features_" + suffix + ".f32.gz"));
    ASSERT_EQ(expected.size(), static_cast<size_t>(mels) * 3000u);
    EXPECT_LT(max_abs_difference(whisper_log_mel(speech.samples, config), expected),
              kFeatureTolerance);
  }
}

TEST(WhisperWindows, CutLongAudioIntoConsecutiveWindowsThatPadTheLast) {
  const LogMelConfig config;
  const std::vector<float> samples = seeded_signal(70 * 16000, 16000, 3);
  const auto windows = whisper_windows(samples, config);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0].size(), 480000u);
  EXPECT_EQ(windows[1].size(), 480000u);
  EXPECT_EQ(windows[2].size(), 160000u);
  EXPECT_TRUE(std::equal(windows[1].begin(), windows[1].end(), samples.begin() + 480000));
  EXPECT_TRUE(std::equal(windows[2].begin(), windows[2].end(), samples.begin() + 960000));
  EXPECT_TRUE(whisper_windows(std::span<const float>(), config).empty());
  EXPECT_EQ(whisper_windows(std::span(samples).first(480000), config).size(), 1u);

  // Features of a long input are those of its first window; a short one is padded with zeros.
  EXPECT_EQ(whisper_log_mel(samples, config), whisper_log_mel(windows[0], config));
  std::vector<float> padded = windows[2];
  padded.resize(480000, 0.0f);
  EXPECT_EQ(whisper_log_mel(windows[2], config), whisper_log_mel(padded, config));
}

TEST(LogMelConfig, ReadsWhisperPreprocessorConfigs) {
  // As in openai/whisper-tiny's preprocessor_config.json (abridged).
  const auto tiny = nlohmann::json::parse(R"({
    "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
    "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000,
    "padding_side": "right", "padding_value": 0.0, "processor_class": "WhisperProcessor",
    "return_attention_mask": false, "sampling_rate": 16000})");
  const LogMelConfig config = log_mel_config_from_json(tiny);
  EXPECT_EQ(config.n_mels, 80);
  EXPECT_EQ(config.n_fft, 400);
  EXPECT_EQ(config.hop_length, 160);
  EXPECT_EQ(config.sample_rate, 16000);
  EXPECT_EQ(config.chunk_seconds, 30);
  EXPECT_EQ(config.frames(), 3000);

  auto large = tiny;
  large["feature_size"] = 128;
  EXPECT_EQ(log_mel_config_from_json(large).n_mels, 128);
  EXPECT_EQ(log_mel_config_from_json(nlohmann::json::object()).n_mels, 80);
}

TEST(LogMelConfig, RefusesConfigsThatAreNotWhispersOrAreInconsistent) {
  const auto refuses = [](const std::string& text, const std::string& reason) {
    SCOPED_TRACE(text);
    expect_error([&] { log_mel_config_from_json(nlohmann::json::parse(text)); },
                 {"preprocessor_config.json", reason});
  };
  refuses(R"({"feature_extractor_type": "Wav2Vec2FeatureExtractor"})", "Wav2Vec2FeatureExtractor");
  refuses(R"({"hop_length": "160"})", "'hop_length' must be a positive integer");
  refuses(R"({"feature_size": 0})", "'feature_size' must be a positive integer");
  refuses(R"({"n_fft": 400.5})", "'n_fft' must be a positive integer");
  refuses(R"({"n_samples": 16000})", "n_samples 16000");
  refuses(R"({"nb_max_frames": 1500})", "nb_max_frames 1500");
  refuses(R"([1, 2])", "JSON object");
  expect_error([] { log_mel_config_from_json(nlohmann::json::parse(R"({"n_fft": 100000})")); },
               {"n_fft", "100000"});
  expect_error([] { whisper_log_mel({}, LogMelConfig{.hop_length = 0}); }, {"hop_length", "0"});
}

}  // namespace
}  // namespace mg::data
