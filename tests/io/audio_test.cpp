// Reading audio files (libsndfile) and resampling them: every PCM width and float, mono and
// stereo, at several rates, against the exact samples written and against the analytic signal;
// real speech files against an independent WAV parser; and the refusals of bad files.
#include "data/audio.hpp"

#include <gtest/gtest.h>
#include <sndfile.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "audio_support.hpp"

namespace mg::data {
namespace {

using io::testing::expect_error;
using testing::read_raw;

struct WavFormat {
  const char* name;
  int subtype;
  int bits;  // 0 for float samples
};

constexpr WavFormat kFormats[] = {{"pcm8", SF_FORMAT_PCM_U8, 8},   {"pcm16", SF_FORMAT_PCM_16, 16},
                                  {"pcm24", SF_FORMAT_PCM_24, 24}, {"pcm32", SF_FORMAT_PCM_32, 32},
                                  {"float", SF_FORMAT_FLOAT, 0},   {"double", SF_FORMAT_DOUBLE, 0}};

// A linear sweep from `start` to `end` Hz over `duration` seconds, amplitude 0.5, at time `t`.
double sweep(double t, double start, double end, double duration) {
  const double phase = start * t + (end - start) * t * t / (2.0 * duration);
  return 0.5 * std::sin(2.0 * std::numbers::pi * phase);
}

double tone(double t) {
  return 0.3 * std::sin(2.0 * std::numbers::pi * 440.0 * t + 0.7);
}

// Writes `channels` (each the same length) as a WAV file in `format` and returns, per frame, the
// mean of the values a reader must see: integer PCM as q / 2^(bits - 1), floats as stored.
std::vector<float> write_wav(const std::filesystem::path& path, const WavFormat& format, int rate,
                             const std::vector<std::vector<double>>& channels) {
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = static_cast<int>(channels.size());
  info.format = SF_FORMAT_WAV | format.subtype;
  SNDFILE* file = sf_open(path.c_str(), SFM_WRITE, &info);
  EXPECT_NE(file, nullptr) << sf_strerror(nullptr);
  const size_t frames = channels[0].size();
  const size_t count = channels.size();
  std::vector<int32_t> integers(frames * count);
  std::vector<float> floats(frames * count);
  std::vector<float> expected(frames);
  const double scale = format.bits > 0 ? std::ldexp(1.0, format.bits - 1) : 1.0;
  for (size_t frame = 0; frame < frames; ++frame) {
    double sum = 0.0;
    for (size_t channel = 0; channel < count; ++channel) {
      const size_t at = frame * count + channel;
      const double value = channels[channel][frame];
      if (format.bits > 0) {
        const double quantized = std::clamp(std::round(value * scale), -scale, scale - 1.0);
        // libsndfile takes integer samples left-justified in 32 bits.
        integers[at] = static_cast<int32_t>(quantized * std::ldexp(1.0, 32 - format.bits));
        sum += quantized / scale;
      } else {
        floats[at] = static_cast<float>(value);
        sum += floats[at];
      }
    }
    expected[frame] = static_cast<float>(sum / static_cast<double>(count));
  }
  const sf_count_t written =
      format.bits > 0 ? sf_writef_int(file, integers.data(), static_cast<sf_count_t>(frames))
                      : sf_writef_float(file, floats.data(), static_cast<sf_count_t>(frames));
  EXPECT_EQ(written, static_cast<sf_count_t>(frames));
  sf_close(file);
  return expected;
}

class AudioFileTest : public io::testing::ScratchDirTest {};

// Each format, rate and channel count reads back exactly, and resamples to 16 kHz within what its
// quantization allows. Rounding to `bits` errs by up to 2^-bits per sample (float's 24-bit
// mantissa by 2^-25 of these amplitudes); the resampling weights of one output sample sum in
// magnitude to at most 2.6 (the worst phase of these ratios), so the error grows at most 2.6-fold.
// The filter adds its own: the linearly interpolated kernel errs by under 7.4e-8 per weight (so
// 1.9e-7 in all), the passband ripple is far smaller, and the float output rounds by 3e-8.
TEST_F(AudioFileTest, ReadsEveryFormatAndResamplesSweepsTo16kHz) {
  constexpr double kDuration = 1.0;
  for (const WavFormat& format : kFormats) {
    for (int rate : {8000, 22050, 44100}) {
      for (size_t channel_count : {size_t{1}, size_t{2}}) {
        SCOPED_TRACE(std::string(format.name) + " " + std::to_string(rate) + " Hz, " +
                     std::to_string(channel_count) + " channel(s)");
        // The sweep stays below 0.8 of the lower Nyquist frequency, inside the passband.
        const double top = 0.8 * std::min(rate, 16000) / 2.0;
        const size_t frames = static_cast<size_t>(kDuration * rate);
        std::vector<std::vector<double>> channels(channel_count, std::vector<double>(frames));
        for (size_t i = 0; i < frames; ++i) {
          const double t = static_cast<double>(i) / rate;
          channels[0][i] = sweep(t, 100.0, top, kDuration);
          if (channel_count == 2) channels[1][i] = tone(t);
        }
        const auto path = this->path(std::string(format.name) + ".wav");
        const std::vector<float> expected = write_wav(path, format, rate, channels);

        const Audio native = read_audio(path, rate);
        EXPECT_EQ(native.sample_rate, rate);
        ASSERT_EQ(native.samples.size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i) {
          ASSERT_EQ(native.samples[i], expected[i]) << "frame " << i;
        }

        const Audio resampled = read_audio(path, 16000);
        EXPECT_EQ(resampled.sample_rate, 16000);
        EXPECT_EQ(resampled.samples.size(), frames * 16000 / static_cast<size_t>(rate));
        // Away from the ends, where the filter reaches past the signal (under 10 ms).
        const size_t margin = 160;
        const double rounding = std::ldexp(1.0, format.bits > 0 ? -format.bits : -25);
        const double bound = 2.6 * rounding + 2.5e-7;
        double worst = 0.0;
        for (size_t j = margin; j + margin < resampled.samples.size(); ++j) {
          const double t = static_cast<double>(j) / 16000.0;
          const double left = sweep(t, 100.0, top, kDuration);
          const double truth = channel_count == 2 ? (left + tone(t)) / 2.0 : left;
          worst = std::max(worst, std::abs(resampled.samples[j] - truth));
        }
        EXPECT_LT(worst, bound);
      }
    }
  }
}

// A 10 kHz tone lies above 16 kHz audio's 8 kHz Nyquist frequency: resampling must remove it
// rather than fold it to 6 kHz. The filter's stopband (over 140 dB down) and its interpolated
// kernel (errors near 1e-7) leave well under the 1e-6 asked here.
TEST_F(AudioFileTest, DownsamplingRemovesToneAboveNyquist) {
  const int rate = 44100;
  std::vector<std::vector<double>> channels(1, std::vector<double>(rate));
  for (int i = 0; i < rate; ++i) {
    channels[0][static_cast<size_t>(i)] =
        0.5 * std::sin(2.0 * std::numbers::pi * 10000.0 * i / rate);
  }
  write_wav(path("tone.wav"), WavFormat{"float", SF_FORMAT_FLOAT, 0}, rate, channels);
  const Audio resampled = read_audio(path("tone.wav"), 16000);
  double worst = 0.0;
  for (size_t j = 160; j + 160 < resampled.samples.size(); ++j) {
    worst = std::max(worst, static_cast<double>(std::abs(resampled.samples[j])));
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(Resample, LeavesAudioAtTheTargetRateUnchangedAndRefusesBadRates) {
  const Audio audio{22050, {0.25f, -0.5f, 0.125f}};
  EXPECT_EQ(resample(audio, 22050).samples, audio.samples);
  expect_error([&] { resample(audio, 0); }, {"resampling target", "0 Hz"});
  expect_error([&] { resample(Audio{999, {0.0f}}, 16000); }, {"999 Hz", "1000"});
}

// Real speech written by sox (a plain 16-bit header, and WAVE_FORMAT_EXTENSIBLE for 24-bit
// stereo) reads as the independent parser in whisper_features.py reads it.
TEST_F(AudioFileTest, RealSpeechFilesMatchAnIndependentWavParser) {
  if (!std::filesystem::exists(io::testing::kPython)) GTEST_SKIP() << "no " << io::testing::kPython;
  for (const char* name : {"speech_16k.wav", "speech_22k_mono16.wav", "speech_44k_stereo24.wav"}) {
    SCOPED_TRACE(name);
    const auto file = testing::audio_fixture(name);
    ASSERT_EQ(io::testing::run_python(testing::whisper_twin(),
                                      "wav " + file.string() + " " + path("twin.f64").string()),
              0);
    std::vector<double> twin = read_raw<double>(path("twin.f64"));
    ASSERT_GT(twin.size(), 1u);
    const int rate = static_cast<int>(twin.back());
    twin.pop_back();
    const Audio audio = read_audio(file, rate);
    ASSERT_EQ(audio.samples.size(), twin.size());
    double worst = 0.0;
    for (size_t i = 0; i < twin.size(); ++i) {
      worst = std::max(worst, std::abs(audio.samples[i] - twin[i]));
    }
    // Only the rounding of the mean to float separates the two.
    EXPECT_LT(worst, 1e-7);
  }
}

// A RIFF WAV file built byte by byte, so that its header can lie.
std::vector<std::byte> riff_wav(uint16_t channels, uint32_t rate, size_t samples,
                                int64_t declared_data = -1, int64_t declared_riff = -1) {
  std::string bytes;
  const auto u16 = [&](uint16_t value) { bytes.append(reinterpret_cast<const char*>(&value), 2); };
  const auto u32 = [&](uint32_t value) { bytes.append(reinterpret_cast<const char*>(&value), 4); };
  const uint32_t data_size = static_cast<uint32_t>(samples * 2);
  bytes += "RIFF";
  u32(declared_riff >= 0 ? static_cast<uint32_t>(declared_riff) : 36 + data_size);
  bytes += "WAVEfmt ";
  u32(16);
  u16(1);  // PCM
  u16(channels);
  u32(rate);
  u32(rate * channels * 2);
  u16(static_cast<uint16_t>(channels * 2));
  u16(16);
  bytes += "data";
  u32(declared_data >= 0 ? static_cast<uint32_t>(declared_data) : data_size);
  for (size_t i = 0; i < samples; ++i) u16(static_cast<uint16_t>(i * 37));
  std::vector<std::byte> result(bytes.size());
  std::memcpy(result.data(), bytes.data(), bytes.size());
  return result;
}

TEST_F(AudioFileTest, RefusesBadFilesWithOneLineNamingTheFile) {
  using io::testing::write_bytes;
  const auto refuses = [&](const std::string& name, const std::string& reason) {
    SCOPED_TRACE(name);
    expect_error([&] { read_audio(path(name)); }, {path(name).string(), reason});
  };
  // A valid file first, so that each refusal below is due to its one defect.
  write_bytes(path("valid.wav"), riff_wav(1, 16000, 1000));
  EXPECT_EQ(read_audio(path("valid.wav")).samples.size(), 1000u);

  io::testing::write_text(path("text.wav"), "this is a text file, not audio\n");
  refuses("text.wav", "cannot read audio file");
  write_bytes(path("zero_bytes.wav"), {});
  refuses("zero_bytes.wav", "is empty (0 bytes)");
  write_bytes(path("no_samples.wav"), riff_wav(1, 16000, 0));
  refuses("no_samples.wav", "holds no samples");
  std::vector<std::byte> truncated = riff_wav(1, 16000, 1000);
  truncated.resize(30);
  write_bytes(path("truncated_header.wav"), truncated);
  refuses("truncated_header.wav", "truncated or corrupt");
  write_bytes(path("huge_data.wav"), riff_wav(1, 16000, 1000, 0x7ffffff0));
  refuses("huge_data.wav", "'data' chunk declares");
  write_bytes(path("huge_riff.wav"), riff_wav(1, 16000, 1000, -1, 0xfffffff0));
  refuses("huge_riff.wav", "RIFF header declares");
  write_bytes(path("no_channels.wav"), riff_wav(0, 16000, 1000));
  refuses("no_channels.wav", "cannot read audio file");
  write_bytes(path("slow_rate.wav"), riff_wav(1, 8, 1000));
  refuses("slow_rate.wav", "sample rate 8 Hz");
  refuses("missing.wav", "does not exist");
  std::filesystem::create_directory(path("folder.wav"));
  refuses("folder.wav", "is not a regular file");
}

}  // namespace
}  // namespace mg::data
