/* The map-free statistics' attention pass on a CPU (headatlas.core.cpu_pass builds and loads it).

   One pass over a layer's scores computes, per query row i of every head, what the fused kernels give (the
   model's output A.V and LSE_i) and what the statistics need from every cell: the row entropy, the entropy of
   the row smoothed toward uniform, value columns (A.m)_i and lower columns sum_{j <= i} A_ij m_j: the kernel
   under headatlas.core.mapfree.layer_attention on a CPU (the targets are that function's dot products, on every
   device). With s_ij = scale q_i . k_j + bias_j in log2 units, per block of R rows of one
   head:

     A: S = the block's scores against the keys it may see (register-blocked, vectorised along the keys) and
        each row's max m;
     B: per row, e = 2^(s - m) in place, z = sum_j e, sum_j e (s - m), the columns'
        sums over e (a lower column's up to key i), and the smoothed rows' sum of P ln P;
     C: out = (E V) / z (vectorised along the value width; more than SMALL_COLS value columns ride beside V).

   Then LSE_i = ln 2 (m + log2 z) and H_i = ln 2 (log2 z - sum_j e_j (s_j - m) / z). Grouped query heads share their key head's keys (one copy per
   (sequence, key head)); under a causal mask a block stops at its last row's key, and keys after a sequence's
   last visible key are skipped. Float32 throughout; the vector type is GCC's generic vector extension (clang
   has it too), as wide as the compiler's -march allows (AVX-512, AVX2, else 4 floats: SSE, NEON). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* floats per vector: the widest registers the compiler's target has (16 accumulators of 2 vectors fit in them) */
#if defined(__AVX512F__)
#define W 16
#elif defined(__AVX__)
#define W 8
#else
#define W 4
#endif
#define R 8          /* query rows per block */
#define ROWS 64      /* query rows per unit of work of a thread (one key head's keys serve every unit of it) */
#define SMALL_COLS 4 /* up to this many value columns are summed over e; more ride beside V */

typedef float vf __attribute__((vector_size(4 * W), aligned(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W), aligned(4 * W)));
typedef float vfu __attribute__((vector_size(4 * W), aligned(4)));

static inline vf ld(const float *p) { return *(const vfu *)p; }
static inline void st(float *p, vf x) { *(vfu *)p = x; }
static inline vf bc(float x) { return (vf){} + x; }
static inline vf sel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline vf vmax(vf a, vf b) { return sel(a > b, a, b); }
/* a vector's lanes added (or their max) as a tree: log2(W) dependent steps instead of W - 1 */
static inline float hsum(vf x) {
  float t[W];
  memcpy(t, &x, sizeof t);
  for (int w = W / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) t[l] += t[l + w];
  return t[0];
}
static inline float hmax(vf x) {
  float t[W];
  memcpy(t, &x, sizeof t);
  for (int w = W / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) t[l] = t[l + w] > t[l] ? t[l + w] : t[l];
  return t[0];
}

/* ln x for normal x > 0: x = m 2^e, m in [sqrt(1/2), sqrt(2)), and ln m by Cephes' logf polynomial in
   m - 1 (relative error below 1e-7; no division) */
static inline vf logv(vf x) {
  const vi bits = (vi)x;
  vi e = ((bits >> 23) & 0xff) - 126;
  vf m = (vf)((bits & 0x007fffff) | 0x3f000000); /* [0.5, 1) */
  const vi low = m < bc(0.70710678f);
  e += low; /* -1 where true */
  m = sel(low, m + m, m) - 1.0f;
  const vf z = m * m, ef = __builtin_convertvector(e, vf);
  vf y = bc(7.0376836292e-2f);
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z - 2.12194440e-4f * ef - 0.5f * z;
  return m + y + 0.693359375f * ef; /* ln 2 in two parts */
}

/* 2^x for x <= 0: exactly 0 below -126 (masked cells: e (s - m) stays 0), else a degree-6 minimax polynomial
   of the fraction times 2^round(x) (relative error about 2e-7) */
static inline vf exp2v(vf x) {
  vi dead = x < bc(-126.0f);
  x = vmax(x, bc(-126.0f));
  const vf magic = bc(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
  vf n = (x + magic) - magic;
  vf f = x - n; /* [-0.5, 0.5] */
  vf p = bc(1.535336188319500e-4f);
  p = p * f + bc(1.339887440266574e-3f);
  p = p * f + bc(9.618437357674640e-3f);
  p = p * f + bc(5.550332471162809e-2f);
  p = p * f + bc(2.402264791363012e-1f);
  p = p * f + bc(6.931472028550421e-1f);
  p = p * f + bc(1.0f);
  vi scale = (__builtin_convertvector(n, vi) + 127) << 23;
  return sel(dead, bc(0.0f), p * (vf)scale);
}

typedef struct {
  const float *q, *k, *v;                     /* [B, H, n, d], [B, Hkv, n, d], [B, Hkv, n, dv]: unit stride last */
  int64_t qsb, qsh, qsi, ksb, ksh, ksi, vsb, vsh, vsi; /* their strides (sequence, head, token) in floats */
  const float *keybias;                       /* [B, n] additive, natural-log units (-inf: hidden), or NULL */
  int B, H, Hkv, n, d, dv, causal;
  float scale;
  float *out;                                 /* the model's output A.V, strides osb, osh, osi (unit in dv) */
  int64_t osb, osh, osi;
  float *lse, *ent, *sment;                   /* [B, H, n]; ent, sment may be NULL */
  float smoothing;                            /* sment: the entropy of (1 - smoothing) A + smoothing / k_i on
                                                 the row's k_i visible keys (Clark et al.'s smoothed rows) */
  const float *cols;                          /* [B, n, C] value columns -> vals [B, H, n, C] */
  float *vals;
  const float *lcols;                         /* [B, n, C2] lower columns -> low [B, H, n, C2] */
  float *low;
  int C, C2;
  int threads, thread; /* this call computes the blocks of ROWS rows whose number is thread modulo threads */
} pass_args;

/* the struct's layout as this compiler laid it out: [size, offset of scale, of smoothing, of C2, of thread],
   then the floats per vector W (headatlas.core.cpu_pass compares the layout with its ctypes copy before the
   first call) */
void pass_args_layout(int64_t *out) {
  out[0] = (int64_t)sizeof(pass_args);
  out[1] = (int64_t)offsetof(pass_args, scale);
  out[2] = (int64_t)offsetof(pass_args, smoothing);
  out[3] = (int64_t)offsetof(pass_args, C2);
  out[4] = (int64_t)offsetof(pass_args, thread);
  out[5] = W;
}

static void *grab(size_t floats) {
  void *p = NULL;
  return posix_memalign(&p, 64, (floats ? floats : 1) * sizeof(float)) ? NULL : p;
}

/* returns 0, or -1 when a scratch buffer could not be allocated */
int attention_pass(const pass_args *a) {
  const float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f, HIDDEN = -1e30f;
  const int n = a->n, d = a->d, dv = a->dv, C = a->C, C2 = a->C2, g = a->H / a->Hkv;
  const int wide = C > SMALL_COLS ? C : 0;  /* value columns beside V */
  const int small = wide ? 0 : C;           /* value columns summed over e */
  const int np = (n + 2 * W - 1) / (2 * W) * (2 * W);
  const int dvp = (dv + wide + W - 1) / W * W;
  const int nc = small + C2, nl = C2 < SMALL_COLS ? C2 : SMALL_COLS;
  vf lane;
  for (int l = 0; l < W; l++) lane[l] = (float)l;
  float *kt = grab((size_t)d * np), *vp = grab((size_t)np * dvp), *bias = grab(np);
  float *ct = grab((size_t)nc * np), *sb = grab((size_t)R * np), *qs = grab((size_t)d * R);
  int *seen = (int *)grab(np + 1); /* visible keys before each key */
  int rc = (kt && vp && bias && ct && sb && qs && seen) ? 0 : -1;
  const int units = (n + ROWS - 1) / ROWS; /* per query head */
  for (int p = 0; p < a->B * a->Hkv && rc == 0; p++) {
    const int b = p / a->Hkv, hk = p % a->Hkv;
    /* the pair's g heads' units go round-robin to the threads (under a causal mask later rows cost more) */
    const int u0 = p * g * units, u1 = u0 + g * units;
    const int first = u0 + ((a->thread - u0 % a->threads) % a->threads + a->threads) % a->threads;
    if (first >= u1) continue;
    int kmax = 0; /* keys after the last visible one are skipped */
    seen[0] = 0;
    for (int j = 0; j < np; j++) {
      float x = j >= n ? HIDDEN : (a->keybias ? fmaxf(a->keybias[(size_t)b * n + j] * LOG2E, HIDDEN) : 0.0f);
      bias[j] = x;
      if (x > HIDDEN) kmax = j + 1;
      seen[j + 1] = seen[j] + (x > HIDDEN);
    }
    const float *kb = a->k + b * a->ksb + hk * a->ksh, *vb = a->v + b * a->vsb + hk * a->vsh;
    memset(kt, 0, sizeof(float) * d * np);
    memset(vp, 0, sizeof(float) * np * dvp);
    memset(ct, 0, sizeof(float) * nc * np);
    for (int j = 0; j < n; j++) {
      const float *kj = kb + j * a->ksi;
      for (int c = 0; c < d; c++) kt[(size_t)c * np + j] = kj[c];
      memcpy(vp + (size_t)j * dvp, vb + j * a->vsi, sizeof(float) * dv);
      const float *cj = a->cols ? a->cols + ((size_t)b * n + j) * C : NULL;
      for (int c = 0; c < wide; c++) vp[(size_t)j * dvp + dv + c] = cj[c];
      for (int c = 0; c < small; c++) ct[(size_t)c * np + j] = cj[c];
      for (int c = 0; c < C2; c++) ct[(size_t)(small + c) * np + j] = a->lcols[((size_t)b * n + j) * C2 + c];
    }
    for (int u = first; u < u1; u += a->threads) {
      const int h = hk * g + (u - u0) / units, i1 = ((u - u0) % units) * ROWS;
      const size_t bh = (size_t)b * a->H + h;
      const float *qb = a->q + b * a->qsb + h * a->qsh;
      const int i2 = i1 + ROWS < n ? i1 + ROWS : n;
      for (int i0 = i1; i0 < i2; i0 += R) {
        const int rows = n - i0 < R ? n - i0 : R;
        for (int r = 0; r < R; r++)
          for (int c = 0; c < d; c++) qs[c * R + r] = r < rows ? qb[(i0 + r) * a->qsi + c] * a->scale * LOG2E : 0;
        int nk = a->causal ? i0 + rows : kmax;
        if (a->causal && kmax < nk) nk = kmax;
        nk = (nk + 2 * W - 1) / (2 * W) * (2 * W);
        if (nk == 0) nk = 2 * W; /* no visible key: the row is uniform over hidden ones (as a softmax) */
        /* A: scores and row maxima */
        vf mx[R];
        for (int r = 0; r < R; r++) mx[r] = bc(-3e38f);
        for (int j = 0; j < nk; j += 2 * W) {
          vf s0[R], s1[R];
          const vf b0 = ld(bias + j), b1 = ld(bias + j + W);
          for (int r = 0; r < R; r++) s0[r] = b0, s1[r] = b1;
          for (int c = 0; c < d; c++) {
            const vf k0 = ld(kt + (size_t)c * np + j), k1 = ld(kt + (size_t)c * np + j + W);
            const float *qc = qs + c * R;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
              s0[r] += qc[r] * k0;
              s1[r] += qc[r] * k1;
            }
          }
          if (a->causal && j + 2 * W > i0 + 1) {
            vf j0, j1;
            for (int l = 0; l < W; l++) j0[l] = (float)(j + l), j1[l] = (float)(j + W + l);
            for (int r = 0; r < R; r++) {
              const vf i = bc((float)(i0 + r));
              s0[r] = sel(j0 > i, bc(HIDDEN), s0[r]);
              s1[r] = sel(j1 > i, bc(HIDDEN), s1[r]);
            }
          }
          for (int r = 0; r < R; r++) {
            st(sb + (size_t)r * np + j, s0[r]);
            st(sb + (size_t)r * np + j + W, s1[r]);
            mx[r] = vmax(mx[r], vmax(s0[r], s1[r]));
          }
        }
        /* B: exponentials in place, their sums, the columns */
        float iz[R];
        for (int r = 0; r < rows; r++) {
          const int i = i0 + r;
          const float m = hmax(mx[r]);
          float *s = sb + (size_t)r * np;
          vf z = {}, zs = {}, acc[2 * SMALL_COLS] = {}; /* the value columns, then the first lower ones */
          const vf mm = bc(m), ii = bc((float)i);
          for (int j = 0; j < nk; j += W) {
            const vf x = ld(s + j) - mm;
            const vf e = exp2v(x);
            st(s + j, e);
            z += e;
            zs += e * x;
            for (int c = 0; c < small; c++) acc[c] += e * ld(ct + (size_t)c * np + j);
            if (nl && j <= i) { /* a lower column stops at key i */
              const vf el = j + W <= i + 1 ? e : sel(lane + (float)j <= ii, e, bc(0.0f));
              for (int c = 0; c < nl; c++) acc[SMALL_COLS + c] += el * ld(ct + (size_t)(small + c) * np + j);
            }
          }
          const float zt = hsum(z), lz = log2f(zt);
          iz[r] = 1.0f / zt;
          a->lse[bh * n + i] = (m + lz) * LN2;
          if (a->ent) a->ent[bh * n + i] = (lz - hsum(zs) * iz[r]) * LN2;
          for (int c = 0; c < small; c++) a->vals[(bh * n + i) * C + c] = hsum(acc[c]) * iz[r];
          for (int c = 0; c < C2; c++) {
            vf l = acc[SMALL_COLS + c % SMALL_COLS];
            if (c >= nl) { /* more lower columns than ride in the loop above: each its own sum over e */
              const float *col = ct + (size_t)(small + c) * np;
              l = bc(0.0f);
              for (int j = 0; j <= i && j < nk; j += W) {
                const vf e = ld(s + j);
                l += (j + W <= i + 1 ? e : sel(lane + (float)j <= ii, e, bc(0.0f))) * ld(col + j);
              }
            }
            a->low[(bh * n + i) * C2 + c] = hsum(l) * iz[r];
          }
          if (a->sment) { /* -sum P ln P over the visible keys, P = (1 - eps) e / z + eps / k_i */
            const int stop = a->causal ? i + 1 : nk;
            const float c0 = a->smoothing / (float)seen[a->causal ? i + 1 : n], c1 = (1 - a->smoothing) * iz[r];
            vf plp = {};
            for (int j = 0; j < stop; j += W) {
              const vf p = ld(s + j) * c1 + c0;
              vi vis = ld(bias + j) > bc(HIDDEN);
              if (j + W > stop) vis &= lane + (float)j < bc((float)stop);
              plp += sel(vis, p * logv(vmax(p, bc(1.2e-38f))), bc(0.0f));
            }
            a->sment[bh * n + i] = -hsum(plp);
          }
        }
        /* C: the model's output (and the wide value columns) from E and V */
        for (int u = 0; u < dvp; u += 2 * W) {
          const int two = u + W < dvp;
          vf o0[R], o1[R];
          for (int r = 0; r < R; r++) o0[r] = bc(0), o1[r] = bc(0);
          for (int j = 0; j < nk; j++) {
            const vf v0 = ld(vp + (size_t)j * dvp + u), v1 = two ? ld(vp + (size_t)j * dvp + u + W) : bc(0);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
              const float e = sb[(size_t)r * np + j];
              o0[r] += e * v0;
              o1[r] += e * v1;
            }
          }
          for (int r = 0; r < rows; r++) {
            float *o = a->out + b * a->osb + h * a->osh + (i0 + r) * a->osi;
            float *w = wide ? a->vals + (bh * n + i0 + r) * C : NULL;
            for (int l = 0; l < 2 * W && u + l < dv + wide; l++) {
              const float x = (l < W ? o0[r][l] : o1[r][l - W]) * iz[r];
              if (u + l < dv)
                o[u + l] = x;
              else
                w[u + l - dv] = x;
            }
          }
        }
      }
    }
  }
  free(kt);
  free(vp);
  free(bias);
  free(ct);
  free(sb);
  free(qs);
  free(seen);
  return rc;
}
