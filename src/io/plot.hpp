#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "io/image.hpp"

namespace mg::io {

// One line: (x, y) points drawn in order. Non-finite points break the line (a NaN loss shows as a
// gap rather than ruining the axis range).
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

// One set of axes with its own ranges, e.g. "loss" next to "accuracy".
struct ChartPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
};

// Panels are laid out side by side under the chart title.
struct Chart {
  std::string title;
  int width = 800;
  int height = 500;
  std::vector<ChartPanel> panels;
};

// An RGB image of the chart. Throws mg::Error if the size cannot fit the panels.
Image render_chart(const Chart& chart);
// Renders and writes a PNG atomically.
void write_chart_png(const std::filesystem::path& path, const Chart& chart);

}  // namespace mg::io
