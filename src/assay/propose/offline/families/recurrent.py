"""The recurrent family: ``nn.GRU`` and ``nn.LSTM`` (ir.Recurrent), every layer and direction,
as a kernel of its own. Sizes (steps, batch, features, hidden, layers, directions, batch_first)
are read at run time from the tensors and the module; the cell (GRU or LSTM) is the plan's.

One step of one layer computes, for every hidden unit j and batch row b, the gates from the
step's input row and the previous hidden row: ``W_ih x_t + b_ih`` and ``W_hh h_{t-1} + b_hh``,
then PyTorch's cell (GRU: r, z, n with ``n = tanh(i_n + r * h_n)``; LSTM: i, f, g, o with
``c = f c + i g``, ``h = o tanh(c)``). CUDA: one launch per step for both directions, a warp
per hidden unit whose lanes split the dot products over the features, ``bt`` batch rows at a
time; the host entry point loops over layers and steps (every launch on the caller's stream).
C++: the same loops, OpenMP over hidden units. A layer's output sequence is the next layer's
input (two scratch sequences, time-major); the last layer writes the task's output, time-major
too (a batch_first module returns its transposed view, as torch does).
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Entry, Space, standalone_family
from assay.propose.offline.families.shared import (CPP_PREAMBLE, Param, forward_call,
                                                   own_kernel_source, pointer, size_params,
                                                   stream_args)
from assay.propose.offline.ir import Recurrent

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP's default over hidden units, 1 = serial
    ("cpu", "recurrent"): {"threads": (0, 1)},
    # warps: warps (hidden units) per block; bt: batch rows a warp accumulates at once
    ("cuda", "recurrent"): {"warps": (2, 4, 8), "bt": (2, 4, 8)},
}

# The host loop over layers, directions and steps, shared by both targets. ``STEP(...)`` is
# the target's step: a kernel launch (cuda) or a loop nest (cpu).
HOST_LOOP = r"""
  if (T <= 0 || B <= 0) return 0;
  // per (layer, direction): w_ih, w_hh, b_ih, b_hh (biases null without bias)
  const float* const* W = reinterpret_cast<const float* const*>(weights);
  const int64_t seq_b = (int64_t)dirs * H;         // a scratch sequence's batch stride
  const int64_t seq_t = (int64_t)B * dirs * H;     // and its step stride
  for (int64_t l = 0; l < layers; ++l) {
    const float* in = l == 0 ? x : (l % 2 ? buf0 : buf1);
    const int64_t feat = l == 0 ? I : dirs * H;
    const int64_t in_t = l == 0 ? (batch_first ? feat : B * feat) : seq_t;
    const int64_t in_b = l == 0 ? (batch_first ? T * feat : feat) : seq_b;
    const bool last = l == layers - 1;
    // every output sequence is time-major (the task's too: batch_first returns a view of it)
    float* y = last ? out : (l % 2 ? buf1 : buf0);
    const int64_t y_t = seq_t, y_b = seq_b;
    for (int64_t s = 0; s < T; ++s) {
      AssayStep st;
      st.dirs = (int)dirs; st.B = B; st.feat = feat; st.H = H;
      for (int d = 0; d < dirs; ++d) {
        const int64_t k = l * dirs + d;
        const int64_t t = d == 0 ? s : T - 1 - s;
        const int64_t prev = d == 0 ? t - 1 : t + 1;
        AssayDir& a = st.d[d];
        a.wih = W[4 * k]; a.whh = W[4 * k + 1]; a.bih = W[4 * k + 2]; a.bhh = W[4 * k + 3];
        a.x = in + t * in_t; a.x_b = in_b;
        a.h = s == 0 ? h0 + k * B * H : y + prev * y_t + d * H;
        a.h_b = s == 0 ? H : y_b;
        a.y = y + t * y_t + d * H; a.y_b = y_b;
        a.hn = s == T - 1 ? hn + k * B * H : nullptr;
{% if lstm %}
        a.c = s == 0 ? c0 + k * B * H : cbuf + ((s - 1) % 2) * dirs * B * H + d * B * H;
        a.c_out = cbuf + (s % 2) * dirs * B * H + d * B * H;
        a.cn = s == T - 1 ? cn + k * B * H : nullptr;
{% endif %}
      }
      STEP(st);
    }
  }
  return 0;
"""

STRUCTS = r"""
struct AssayDir {
  const float* wih; const float* whh; const float* bih; const float* bhh;
  const float* x; int64_t x_b;   // the step's input rows, batch stride
  const float* h; int64_t h_b;   // the previous hidden rows
  float* y; int64_t y_b;         // this step's hidden rows (the layer's output at step t)
  float* hn;                     // the last step's hidden state, or null
  const float* c; float* c_out; float* cn;  // LSTM cell state: previous, new, last step's
};
struct AssayStep {
  AssayDir d[2];
  int dirs;
  int64_t B, feat, H;
};

// PyTorch's cells, from the gates' input and hidden parts (biases added; assay_sigmoid: HELPERS).
{% if lstm %}
ASSAY_FN void assay_cell(const float* gi, const float* gh, float c_prev, float* h, float* c) {
  const float i = assay_sigmoid(gi[0] + gh[0]);
  const float f = assay_sigmoid(gi[1] + gh[1]);
  const float g = tanhf(gi[2] + gh[2]);
  const float o = assay_sigmoid(gi[3] + gh[3]);
  *c = f * c_prev + i * g;
  *h = o * tanhf(*c);
}
{% else %}
ASSAY_FN float assay_cell(const float* gi, const float* gh, float h_prev) {
  const float r = assay_sigmoid(gi[0] + gh[0]);
  const float z = assay_sigmoid(gi[1] + gh[1]);
  const float n = tanhf(gi[2] + r * gh[2]);
  return (1.0f - z) * n + z * h_prev;
}
{% endif %}
"""

CPP_RECURRENT = CPP_PREAMBLE + STRUCTS + r"""
static void assay_step(const AssayStep& st) {
  const int G = {{ gates }};
  for (int d = 0; d < st.dirs; ++d) {
    const AssayDir& a = st.d[d];
{% if parallel %}
    #pragma omp parallel for schedule(static) if(st.H * st.B > 256)
{% endif %}
    for (int64_t j = 0; j < st.H; ++j) {
      for (int64_t b = 0; b < st.B; ++b) {
        float gi[{{ gates }}], gh[{{ gates }}];
        const float* xr = a.x + b * a.x_b;
        const float* hr = a.h + b * a.h_b;
        for (int g = 0; g < G; ++g) {
          const float* wi = a.wih + (g * st.H + j) * st.feat;
          const float* wh = a.whh + (g * st.H + j) * st.H;
          float si = a.bih ? a.bih[g * st.H + j] : 0.0f;
          float sh = a.bhh ? a.bhh[g * st.H + j] : 0.0f;
          for (int64_t k = 0; k < st.feat; ++k) si += wi[k] * xr[k];
          for (int64_t k = 0; k < st.H; ++k) sh += wh[k] * hr[k];
          gi[g] = si;
          gh[g] = sh;
        }
{% if lstm %}
        float h, c;
        assay_cell(gi, gh, a.c[b * st.H + j], &h, &c);
        a.c_out[b * st.H + j] = c;
        if (a.cn) a.cn[b * st.H + j] = c;
{% else %}
        const float h = assay_cell(gi, gh, hr[j]);
{% endif %}
        a.y[b * a.y_b + j] = h;
        if (a.hn) a.hn[b * st.H + j] = h;
      }
    }
  }
}
#define STEP(st) assay_step(st)

extern "C" int assay_rnn({{ params }}) {""" + HOST_LOOP + "}\n"

CUDA_RECURRENT = STRUCTS + r"""
// acc[g][q] += this lane's share (k = lane, lane + 32, ...) of the dot product of gate g's row
// j of w ([G * H, K]) with batch row b0 + q of ``in`` (rows ``in_b`` apart; past B: zeros).
template <int G, int BT>
__device__ __forceinline__ void assay_gate_dots(const float* __restrict__ w, int64_t H, int64_t j,
                                                int64_t K, const float* __restrict__ in,
                                                int64_t in_b, int64_t b0, int64_t B, int lane,
                                                float (&acc)[G][BT]) {
  for (int64_t k = lane; k < K; k += 32) {
    float v[BT];
    #pragma unroll
    for (int q = 0; q < BT; ++q) v[q] = b0 + q < B ? in[(b0 + q) * in_b + k] : 0.0f;
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      const float wv = w[(g * H + j) * K + k];
      #pragma unroll
      for (int q = 0; q < BT; ++q) acc[g][q] += wv * v[q];
    }
  }
}

// A warp per hidden unit j (blockIdx.y: the direction); its lanes split the dot products over
// the features and the hidden units, BT batch rows at a time, then sum them by shuffles.
template <int BT>
__global__ void __launch_bounds__({{ warps * 32 }})
assay_rnn_step(const AssayStep st) {
  constexpr int G = {{ gates }};
  const AssayDir& a = st.d[blockIdx.y];
  const int lane = threadIdx.x & 31;
  const int64_t j = (int64_t)blockIdx.x * {{ warps }} + (threadIdx.x >> 5);
  if (j >= st.H) return;
  for (int64_t b0 = 0; b0 < st.B; b0 += BT) {
    float gi[G][BT], gh[G][BT];
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      #pragma unroll
      for (int q = 0; q < BT; ++q) { gi[g][q] = 0.0f; gh[g][q] = 0.0f; }
    }
    assay_gate_dots<G, BT>(a.wih, st.H, j, st.feat, a.x, a.x_b, b0, st.B, lane, gi);
    assay_gate_dots<G, BT>(a.whh, st.H, j, st.H, a.h, a.h_b, b0, st.B, lane, gh);
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      #pragma unroll
      for (int q = 0; q < BT; ++q) {
        #pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
          gi[g][q] += __shfl_xor_sync(0xffffffffu, gi[g][q], m);
          gh[g][q] += __shfl_xor_sync(0xffffffffu, gh[g][q], m);
        }
      }
    }
    // lane q finishes batch row b0 + q (its sums picked by an unrolled match, no local memory)
    float si[G], sh[G];
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      si[g] = a.bih ? a.bih[g * st.H + j] : 0.0f;
      sh[g] = a.bhh ? a.bhh[g * st.H + j] : 0.0f;
      #pragma unroll
      for (int q = 0; q < BT; ++q) {
        if (q == lane) { si[g] += gi[g][q]; sh[g] += gh[g][q]; }
      }
    }
    const int64_t b = b0 + lane;
    if (lane < BT && b < st.B) {
{% if lstm %}
      float h, c;
      assay_cell(si, sh, a.c[b * st.H + j], &h, &c);
      a.c_out[b * st.H + j] = c;
      if (a.cn) a.cn[b * st.H + j] = c;
{% else %}
      const float h = assay_cell(si, sh, a.h[b * a.h_b + j]);
{% endif %}
      a.y[b * a.y_b + j] = h;
      if (a.hn) a.hn[b * st.H + j] = h;
    }
  }
}

#define STEP(st) do { \
    assay_rnn_step<{{ bt }}><<<dim3((unsigned)((H + {{ warps }} - 1) / {{ warps }}), (unsigned)dirs), \
                                {{ warps * 32 }}, 0, stream>>>(st); \
    const cudaError_t e = cudaGetLastError(); \
    if (e != cudaSuccess) return (int)e; \
  } while (0)

extern "C" int assay_rnn({{ params }}, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);""" + HOST_LOOP + "}\n"


def _params(plan: Recurrent, target: str) -> list[Param]:
    p = [pointer(target, "x", "x.data_ptr()"), pointer(target, "h0", "h0.data_ptr()"),
         Param("const void*", "weights", "weights", "ctypes.c_void_p"),
         pointer(target, "out", "out.data_ptr()", const=False),
         pointer(target, "hn", "hn.data_ptr()", const=False),
         pointer(target, "buf0", "buf0.data_ptr()", const=False),
         pointer(target, "buf1", "buf1.data_ptr()", const=False)]
    if plan.cell == "lstm":
        p += [pointer(target, "c0", "c0.data_ptr()"),
              pointer(target, "cn", "cn.data_ptr()", const=False),
              pointer(target, "cbuf", "cbuf.data_ptr()", const=False)]
    # (restrict-qualified pointers may not alias: the scratch and output buffers never do)
    return p + size_params("T", "B", "I", "H", "layers", "dirs", "batch_first")


def source(plan: Recurrent, target: str, knobs: dict[str, Any], summary: str,
           label: str = "recurrent") -> str:
    return own_kernel_source(CPP_RECURRENT, CUDA_RECURRENT, target, knobs, summary, label,
                             _params(plan, target), gates=4 if plan.cell == "lstm" else 3,
                             lstm=plan.cell == "lstm")


def forward(plan: Recurrent, target: str, knobs: dict[str, Any]
            ) -> tuple[list[str], list[Entry]]:
    """ModelNew.forward's body: the module's settings and every tensor checked, the weights'
    pointers in an array, the outputs and scratch sequences allocated, one ``assay_rnn``."""
    calls, entries = forward_call(_params(plan, target), stream_args(target, "x"), "assay_rnn")
    mode = "LSTM" if plan.cell == "lstm" else "GRU"
    first = "batch_first"
    lines = [
        f"m = _attr(self, {plan.module!r})",
        f"_expect(m.mode == {mode!r} and not getattr(m, 'proj_size', 0), "
        f"'{plan.module} is not a {mode} without projections')",
        "if m.training and m.dropout:",
        f"    raise RuntimeError('{plan.module}: this kernel computes the eval-mode form "
        f"(no dropout between layers); call .eval() first')",
        f"x = _tensor({plan.x}, {plan.x!r})",
        "_expect(x.dim() == 3, 'x is not a batch of sequences (3 dims)')",
        "layers, dirs, H = m.num_layers, 2 if m.bidirectional else 1, m.hidden_size",
        f"T, B = (x.shape[1], x.shape[0]) if m.{first} else (x.shape[0], x.shape[1])",
        "I = x.shape[2]",
        f"batch_first = int(m.{first})",
        "_expect(I == m.input_size, 'x does not have the module\\'s input_size features')",
        "state = (layers * dirs, B, H)",
    ]
    for name, var in ((plan.h0, "h0"), (plan.c0, "c0")):
        if var == "c0" and plan.cell != "lstm":
            continue
        if name:
            lines += [f"{var} = _tensor({name}, {name!r})",
                      f"_expect(tuple({var}.shape) == state, '{name} is not (layers * "
                      f"directions, batch, hidden)')"]
        else:  # not given: zeros, as the module's default
            lines.append(f"{var} = torch.zeros(state, dtype=DTYPE, device=x.device)")
    lines += [
        "ws = []",
        "for l in range(layers):",
        "    for sfx in ('', '_reverse')[:dirs]:",
        "        for kind in ('weight_ih', 'weight_hh', 'bias_ih', 'bias_hh'):",
        "            w = getattr(m, f'{kind}_l{l}{sfx}', None)",
        "            ws.append(_tensor(w, f'{kind}_l{l}{sfx}') if w is not None else None)",
        "weights = (ctypes.c_void_p * len(ws))(*[w.data_ptr() if w is not None else None "
        "for w in ws])",
        "out = torch.empty((T, B, dirs * H), dtype=DTYPE, device=x.device)",
        "hn = torch.empty(state, dtype=DTYPE, device=x.device)",
        "scratch = (T, B, dirs * H) if layers > 1 else (0,)",
        "buf0 = torch.empty(scratch, dtype=DTYPE, device=x.device)",
        "buf1 = torch.empty(scratch if layers > 2 else (0,), dtype=DTYPE, device=x.device)",
    ]
    if plan.cell == "lstm":
        lines += ["cn = torch.empty(state, dtype=DTYPE, device=x.device)",
                  "cbuf = torch.empty((2, dirs, B, H), dtype=DTYPE, device=x.device)"]
    lines += [*calls,
              # batch_first: torch returns the time-major sequence's transposed view too
              "return out.transpose(0, 1) if batch_first else out" if plan.result == "output"
              else f"return {dict(h_n='hn', c_n='cn')[plan.result]}"]
    return lines, entries


FAMILY = standalone_family(
    "recurrent", Recurrent, KNOB_SPACES,
    # Not yet measured on a GPU: 4 warps a block, 8 batch rows a pass (KernelBench's batch 10
    # is two passes).
    defaults={"cpu": {"threads": 0}, "cuda": {"warps": 4, "bt": 8}},
    safe={"cpu": {"threads": 1}, "cuda": {"warps": 4, "bt": 2}},
    strategy="fusion",  # the gates' products and the cell in one kernel per step
    source=source, forward=forward)
