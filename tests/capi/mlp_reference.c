#include <math.h>
#include <stdlib.h>

#include "checks.h"

static float* read_parameter(mg_program* program, const char* name, size_t count) {
  float* values = malloc(count * sizeof(float));
  CHECK_OK(mg_program_read_parameter(program, name, values, count));
  return values;
}

/* out[b][o] = bias[o] + sum_i in[b][i] * weight[o][i], then ReLU when `relu`. */
static void dense(mg_program* program, const char* prefix, const double* in, int batch, int inputs,
                  int outputs, int relu, double* out) {
  char name[64];
  snprintf(name, sizeof name, "%s.weight", prefix);
  float* weight = read_parameter(program, name, (size_t)inputs * outputs);
  snprintf(name, sizeof name, "%s.bias", prefix);
  float* bias = read_parameter(program, name, (size_t)outputs);
  for (int b = 0; b < batch; ++b) {
    for (int o = 0; o < outputs; ++o) {
      double sum = bias[o];
      for (int i = 0; i < inputs; ++i) sum += in[b * inputs + i] * weight[o * inputs + i];
      out[b * outputs + o] = relu && sum < 0 ? 0 : sum;
    }
  }
  free(weight);
  free(bias);
}

void mlp_reference(mg_program* program, const float* images, int batch, int pixels, int classes,
                   double* logits) {
  double* x = malloc(sizeof(double) * batch * pixels);
  double* h1 = malloc(sizeof(double) * batch * 256);
  double* h2 = malloc(sizeof(double) * batch * 128);
  for (int i = 0; i < batch * pixels; ++i) x[i] = images[i];
  dense(program, "model.fc1", x, batch, pixels, 256, 1, h1);
  dense(program, "model.fc2", h1, batch, 256, 128, 1, h2);
  dense(program, "model.fc3", h2, batch, 128, classes, 0, logits);
  free(x);
  free(h1);
  free(h2);
}

double mean_cross_entropy(const double* logits, const int* labels, int batch, int classes) {
  double total = 0;
  for (int b = 0; b < batch; ++b) {
    const double* row = logits + b * classes;
    double largest = row[0];
    for (int c = 1; c < classes; ++c) largest = row[c] > largest ? row[c] : largest;
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += exp(row[c] - largest);
    total += largest + log(sum) - row[labels[b]];
  }
  return total / batch;
}

void fill_random(float* values, int count, unsigned seed) {
  unsigned state = seed * 2654435761u + 1;
  for (int i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    values[i] = (float)((state >> 8) / 8388608.0 - 1.0);
  }
}

double relative_difference(const float* a, const double* b, int count) {
  double largest = 1, worst = 0;
  for (int i = 0; i < count; ++i) largest = fabs(b[i]) > largest ? fabs(b[i]) : largest;
  for (int i = 0; i < count; ++i) {
    const double difference = fabs(a[i] - b[i]);
    worst = difference > worst ? difference : worst;
  }
  return worst / largest;
}
