// Direct weight gradient of a stride-1 convolution without dilation or groups, in strict f32:
// grad_weight[o, c, kh, kw] = sum over (b, y, x) of grad_out[b, o, y, x] *
// image[b, c, y + kh - PAD_H, x + kw - PAD_W], with no columns in memory. The im2col route
// writes KH * KW copies of the image and reads them back; here every tap of a kernel row comes
// from one image tile in shared memory.
// A workgroup of 256 threads owns TILE_O output channels x TILE_C input channels and the KW taps
// of kernel row kh = z % KH: a thread holds 4 x 4 channels of each tap, 16 * KW accumulators
// (all 9 taps of a 3 x 3 kernel in one workgroup take too many registers to run fast). It walks
// chunks of XT adjacent
// output columns of one output row (b, y): the chunk's grad_out tile [XT][TILE_O] and the XW = XT + KW - 1 image columns it meets
// in row y + kh - PAD_H [XW][TILE_C], both channel-contiguous so that a thread reads its 4
// channels as one vec4. Image column j of the tile meets output column j - kw at tap kw, so a
// thread reads each grad_out vec4 and each image vec4 once and multiplies every pair among them:
// 16 * KW * XT multiply-adds for XT + XW vec4 reads from shared memory.
// Chunks are fetched into registers two ahead of the one being multiplied and stored into the
// other of two shared slots after its multiplies: one barrier per chunk. (Three chunks ahead,
// unconditional fetches and warps that only fetch while the others multiply were all slower: the
// chunks' loads and shared stores cost about as much as their multiply-adds.)
// Split-K: workgroup z takes chunks [s * CHUNKS / K_SPLITS, (s + 1) * CHUNKS / K_SPLITS) of
// split s = z / KH and writes its part of the partial gradient [K_SPLITS, O, C, KH, KW]
// (K_SPLITS = 1: the gradient itself).
// Defines: BATCH, C, O, H, W (the image), OH, OW (grad_out), KH, KW, PAD_H, PAD_W, XT, K_SPLITS,
// GRAD_GROUP, IMAGE_GROUP (4 or 1).
#extension GL_EXT_control_flow_attributes : enable

#define TILE_O 64
#define TILE_C 64
#define THREADS 256
#define XW (XT + KW - 1)
// Tile rows padded by one vec4: the stores of consecutive threads (consecutive rows) then fall on
// different banks instead of all on the same ones.
#define ROW_VEC4 (TILE_O / 4 + 1)
#define CHUNKS_X ((OW + XT - 1) / XT)
#define CHUNKS (BATCH * OH * CHUNKS_X)
// A fetch unit is GRAD_GROUP (IMAGE_GROUP) adjacent channels of one column of a tile: 4 (one
// vec4 store to shared memory) where at least 7 / 8 of the threads then have a unit, else 1.
#if (GRAD_GROUP != 4 && GRAD_GROUP != 1) || (IMAGE_GROUP != 4 && IMAGE_GROUP != 1)
#error "stash stores a unit as one vec4 (GROUP 4) or one float (GROUP 1)"
#endif
#define GRAD_UNITS (TILE_O / GRAD_GROUP * XT)
#define IMAGE_UNITS (TILE_C / IMAGE_GROUP * XW)
#define GRAD_FETCHES ((GRAD_UNITS + THREADS - 1) / THREADS)
#define IMAGE_FETCHES ((IMAGE_UNITS + THREADS - 1) / THREADS)

layout(local_size_x = THREADS) in;

shared vec4 grad_tile[2][XT][ROW_VEC4];
shared vec4 image_tile[2][XW][ROW_VEC4];
// A quarter of the workgroup's results on their way out.
#define STAGED (TILE_O / 4 * TILE_C * KW)
shared float staging[STAGED];

// Two register sets: chunk n + 2 is fetched while n is multiplied and n + 1 waits in the other.
// A unit's channels are the first GRAD_GROUP (IMAGE_GROUP) components of its vec4.
vec4 grad_next[2][GRAD_FETCHES];
vec4 image_next[2][IMAGE_FETCHES];
// accumulators[kw][i][j]: output channel o0 + 4 o4 + i, input channel c0 + 4 c4 + j, tap
// (kh, kw).
vec4 accumulators[KW][4];

// Thread t fetches units t, t + THREADS, ...: unit u is column u % XT (XW) of the GROUP channels
// from GROUP (u / XT), loads a plane apart, so that consecutive threads read adjacent floats of a
// channel's row and store to consecutive rows of the tile. A unit's column and channels depend
// on t alone. (Units of 4 pay where the chunks give every thread one, as 14-column chunks do up
// to 256 channels; the 7-column chunks of 512 channels leave half the threads without one and
// run faster with scalars.)
void fetch(uint chunk, uint o0, uint c0, uint kh, uint t, uint set) {
  uint x0 = chunk % CHUNKS_X * XT, y = chunk / CHUNKS_X % OH, b = chunk / (CHUNKS_X * OH);
  [[unroll]] for (uint l = 0; l < GRAD_FETCHES; ++l) {
    uint u = t + l * THREADS;
    uint o = o0 + GRAD_GROUP * (u / XT), x = x0 + u % XT;
    bool inside = u < GRAD_UNITS && x < OW;
    uint at = ((b * O + o) * OH + y) * OW + x;
    [[unroll]] for (uint i = 0; i < GRAD_GROUP; ++i)
      grad_next[set][l][i] = inside && o + i < O ? grad_out[at + i * OH * OW] : 0.0;
  }
  int iy = int(y + kh) - PAD_H;
  bool row_inside = iy >= 0 && iy < H;
  [[unroll]] for (uint l = 0; l < IMAGE_FETCHES; ++l) {
    uint u = t + l * THREADS;
    uint c = c0 + IMAGE_GROUP * (u / XW);
    int ix = int(x0 + u % XW) - PAD_W;
    bool inside = row_inside && u < IMAGE_UNITS && ix >= 0 && ix < W;
    uint at = ((b * C + c) * H + uint(iy)) * W + uint(ix);
    [[unroll]] for (uint i = 0; i < IMAGE_GROUP; ++i)
      image_next[set][l][i] = inside && c + i < C ? image[at + i * H * W] : 0.0;
  }
}

void stash(uint slot, uint t, uint set) {
  [[unroll]] for (uint l = 0; l < GRAD_FETCHES; ++l) {
    uint u = t + l * THREADS, x = u % XT, o = GRAD_GROUP * (u / XT);
    if (u >= GRAD_UNITS) continue;
#if GRAD_GROUP == 4
    grad_tile[slot][x][o / 4] = grad_next[set][l];
#else
    grad_tile[slot][x][o / 4][o % 4] = grad_next[set][l].x;
#endif
  }
  [[unroll]] for (uint l = 0; l < IMAGE_FETCHES; ++l) {
    uint u = t + l * THREADS, x = u % XW, c = IMAGE_GROUP * (u / XW);
    if (u >= IMAGE_UNITS) continue;
#if IMAGE_GROUP == 4
    image_tile[slot][x][c / 4] = image_next[set][l];
#else
    image_tile[slot][x][c / 4][c % 4] = image_next[set][l].x;
#endif
  }
}

void multiply(uint slot, uint o4, uint c4) {
  vec4 grads[XT];
  [[unroll]] for (uint j = 0; j < XW; ++j) {
    if (j < XT) grads[j] = grad_tile[slot][j][o4];
    vec4 pixels = image_tile[slot][j][c4];
    [[unroll]] for (uint kw = 0; kw < KW; ++kw) {
      if (j >= kw && j - kw < XT) {
        [[unroll]] for (uint i = 0; i < 4; ++i)
          accumulators[kw][i] += grads[j - kw][i] * pixels;
      }
    }
  }
}

// One chunk of the loop, with register set `set` holding it (already in shared slot `slot`) and
// the other set the next chunk: the fetch two ahead reuses `set`, so its global latency has two
// chunks of multiply-adds to hide behind (one chunk left much of its latency exposed); the next
// chunk goes to the other slot, which every thread finished reading
// before the previous barrier.
void advance(uint chunk, uint end, uint begin, uint o0, uint c0, uint kh, uint t, uint o4,
             uint c4, uint set) {
  uint slot = (chunk - begin) % 2;
  if (chunk + 2 < end) fetch(chunk + 2, o0, c0, kh, t, set);
  multiply(slot, o4, c4);
  if (chunk + 1 < end) {
    stash(1 - slot, t, 1 - set);
    barrier();
  }
}

void main() {
  uint t = gl_LocalInvocationID.x, warp = t / 32, lane = t % 32;
  // A warp covers 4 x 8 threads of the 16 x 16 grid: 4 distinct grad_out vec4s and 8 image
  // vec4s (128 bytes, one shared-memory wavefront) per read.
  uint o4 = warp % 4 * 4 + lane / 8, c4 = warp / 4 * 8 + lane % 8;
  uint o0 = gl_WorkGroupID.y * TILE_O, c0 = gl_WorkGroupID.x * TILE_C;
  uint kh = gl_WorkGroupID.z % KH, split = gl_WorkGroupID.z / KH;
  uint begin = split * CHUNKS / K_SPLITS, end = (split + 1) * CHUNKS / K_SPLITS;

  [[unroll]] for (uint kw = 0; kw < KW; ++kw)
    [[unroll]] for (uint i = 0; i < 4; ++i) accumulators[kw][i] = vec4(0.0);

  // begin and end are uniform over the workgroup, so every barrier is reached by all threads.
  if (begin < end) {
    fetch(begin, o0, c0, kh, t, 0);
    stash(0, t, 0);
    if (begin + 1 < end) fetch(begin + 1, o0, c0, kh, t, 1);
    barrier();
    // Stepping by two keeps every register set's index a constant.
    for (uint chunk = begin; chunk < end; chunk += 2) {
      advance(chunk, end, begin, o0, c0, kh, t, o4, c4, 0);
      if (chunk + 1 < end) advance(chunk + 1, end, begin, o0, c0, kh, t, o4, c4, 1);
    }
  }

  // The partial gradient of row kh leaves through shared memory a quarter of the output channels
  // at a time: stored there by channel, it is written out by consecutive threads to
  // consecutive (c, kw), runs of KW floats KH * KW apart, where storing each thread's own
  // channels wrote one float per 32-byte sector.
  [[unroll]] for (uint quarter = 0; quarter < 4; ++quarter) {
    barrier();  // the tiles (or the last quarter) are read
    if (o4 / 4 == quarter) {
      [[unroll]] for (uint i = 0; i < 4; ++i)
        [[unroll]] for (uint j = 0; j < 4; ++j)
          [[unroll]] for (uint kw = 0; kw < KW; ++kw)
            staging[((o4 % 4 * 4 + i) * TILE_C + c4 * 4 + j) * KW + kw] = accumulators[kw][i][j];
    }
    barrier();
    [[unroll]] for (uint l = 0; l < STAGED / THREADS; ++l) {
      uint e = t + l * THREADS;
      uint o = o0 + quarter * (TILE_O / 4) + e / (TILE_C * KW), c = c0 + e / KW % TILE_C;
      if (o < O && c < C)
        grad_weight[(((split * O + o) * C + c) * KH + kh) * KW + e % KW] = staging[e];
    }
  }
}
