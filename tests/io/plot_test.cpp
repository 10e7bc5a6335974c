#include "io/plot.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "scratch_dir.hpp"

namespace mg::io {
namespace {

Chart training_chart() {
  std::mt19937 random(8);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  Series train_loss{"train loss", {}}, test_loss{"test loss", {}}, accuracy{"test accuracy %", {}};
  for (int step = 0; step <= 200; ++step) {
    train_loss.points.emplace_back(step, 2.3 * std::exp(-step / 50.0) + 0.3 + noise(random));
    if (step % 20 == 0) {
      test_loss.points.emplace_back(step, 2.3 * std::exp(-step / 60.0) + 0.35);
      accuracy.points.emplace_back(step, 90.0 - 80.0 * std::exp(-step / 40.0));
    }
  }
  return {"Fashion-MNIST MLP",
          800,
          500,
          {{"loss", "step", "cross-entropy", {train_loss, test_loss}},
           {"accuracy", "step", "%", {accuracy}}}};
}

size_t pixels_with_color(const Image& image, uint8_t r, uint8_t g, uint8_t b) {
  size_t count = 0;
  for (size_t i = 0; i + 2 < image.pixels.size(); i += 3) {
    count += image.pixels[i] == r && image.pixels[i + 1] == g && image.pixels[i + 2] == b;
  }
  return count;
}

class PlotTest : public testing::ScratchDirTest {};

TEST_F(PlotTest, WritesPngOfRequestedSizeWithDrawnSeries) {
  write_chart_png(path("plots/training.png"), training_chart());
  const Image image = read_png(path("plots/training.png"));
  EXPECT_EQ(image.width, 800);
  EXPECT_EQ(image.height, 500);
  EXPECT_EQ(image.channels, 3);
  const size_t background = pixels_with_color(image, 255, 255, 255);
  EXPECT_LT(background, image.pixels.size() / 3);
  EXPECT_GT(background, image.pixels.size() / 3 / 2);
  EXPECT_GT(pixels_with_color(image, 31, 119, 180), 500u);  // first series colour
  EXPECT_GT(pixels_with_color(image, 255, 127, 14), 100u);  // second series colour
  EXPECT_GT(pixels_with_color(image, 40, 40, 40), 2000u);   // text and axes
}

TEST_F(PlotTest, SurvivesDegenerateData) {
  Chart chart{"", 300, 200, {{"empty", "", "", {}}}};
  EXPECT_EQ(render_chart(chart).width, 300);
  chart.panels[0].series = {{"nan and one point", {{1.0, NAN}, {2.0, 5.0}, {3.0, INFINITY}}},
                            {"flat", {{0.0, 1.0}, {10.0, 1.0}}}};
  const Image image = render_chart(chart);
  EXPECT_EQ(image.pixels.size(), 300u * 200 * 3);
  EXPECT_GT(pixels_with_color(image, 31, 119, 180), 0u);
  testing::expect_error([&] { render_chart(Chart{"", 10, 10, {}}); }, {"chart size 10x10"});
}

}  // namespace
}  // namespace mg::io
