#version 450
// Triangles scattered over the screen from the vertex index alone (no vertex buffers), drifting
// with the frame's time.
layout(push_constant) uniform Frame {
  float time;
  int shading_iterations;
} frame;
layout(location = 0) out vec3 color;

float hash(uint n) {
  n = (n << 13u) ^ n;
  n = n * (n * n * 15731u + 789221u) + 1376312589u;
  return float(n & 0x7fffffffu) / float(0x7fffffff);
}

void main() {
  const uint triangle = uint(gl_VertexIndex) / 3u;
  const uint corner = uint(gl_VertexIndex) % 3u;
  const vec2 center = vec2(hash(triangle * 7u), hash(triangle * 7u + 1u)) * 2.0 - 1.0;
  const float angle = frame.time * (0.5 + hash(triangle * 7u + 2u)) + float(corner) * 2.0944;
  const float radius = 0.05 + 0.1 * hash(triangle * 7u + 3u);
  gl_Position = vec4(center + radius * vec2(cos(angle), sin(angle)), 0.0, 1.0);
  color = vec3(hash(triangle * 7u + 4u), hash(triangle * 7u + 5u), hash(triangle * 7u + 6u));
}
