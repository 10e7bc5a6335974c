#version 450
// A procedural shade whose cost per pixel is set by the app (shading_iterations), standing in
// for an XR app's lighting.
layout(push_constant) uniform Frame {
  float time;
  int shading_iterations;
} frame;
layout(location = 0) in vec3 color;
layout(location = 0) out vec4 result;

void main() {
  vec3 shade = color;
  for (int i = 0; i < frame.shading_iterations; ++i)
    shade = abs(sin(shade * 1.7 + gl_FragCoord.xyx * 0.01 + frame.time));
  result = vec4(shade, 0.5);
}
