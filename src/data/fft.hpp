#pragma once
#include <complex>
#include <span>
#include <vector>

namespace mg::data {

// Discrete Fourier transform of one fixed size, X[k] = sum_n x[n] exp(-2 pi i n k / size), in
// double precision. Mixed-radix Cooley-Tukey: the size is split into factors 4, 2, 3 and 5 first,
// and any remaining prime factor is handled by a direct DFT of that length, so every size works
// and sizes built from small primes (Whisper's 400 = 4 * 4 * 5 * 5) are fast.
class Fft {
 public:
  explicit Fft(int size);

  int size() const { return size_; }
  // `input` and `output` hold size() values each and must not overlap.
  void forward(std::span<const std::complex<double>> input,
               std::span<std::complex<double>> output) const;

 private:
  void transform(const std::complex<double>* input, size_t input_stride,
                 std::complex<double>* output, size_t length, size_t level,
                 std::complex<double>* scratch) const;

  int size_;
  std::vector<size_t> radices_;
  std::vector<std::complex<double>> twiddles_;  // exp(-2 pi i k / size) for k < size
};

}  // namespace mg::data
