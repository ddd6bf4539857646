// tgx's CUDA pattern kernel for the RMSNorm family (tgx/backends/cuda_kernels.py):
//   out = [x +] h * rsqrt(mean(h^2) + eps) * (w + plus)
// covering rms_norm_1p (plus = 1, no x), residual_rms_norm (plus = 0) and
// residual_rms_norm_1p (plus = 1), float32, normalised over the last axis of length d.
// One block per row: each thread sums squares over a strided slice of the row, the block
// reduces with warp shuffles, then every thread writes its slice. The kernel itself is plain
// CUDA C (a test compiles it with nvcc to PTX on machines without a GPU); the torch binding
// below is compiled only as a torch extension (-DTGX_TORCH_EXTENSION).

extern "C" __global__ void tgx_residual_rms_norm_f32(
    const float* __restrict__ x, const float* __restrict__ h, const float* __restrict__ w,
    float* __restrict__ out, int d, float eps, float plus, int has_x) {
  const long row = blockIdx.x;
  const float* hr = h + row * d;
  float acc = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = hr[i];
    acc += v * v;
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
  __shared__ float partial[32];
  __shared__ float inv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    float s = lane < warps ? partial[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) inv = rsqrtf(s / (float)d + eps);
  }
  __syncthreads();
  float* o = out + row * d;
  const float* xr = x + row * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float y = hr[i] * inv * (w[i] + plus);
    o[i] = has_x ? xr[i] + y : y;
  }
}

#ifdef TGX_TORCH_EXTENSION
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>

torch::Tensor residual_rms_norm(torch::Tensor x, torch::Tensor h, torch::Tensor w, double eps,
                                double plus, bool has_x) {
  TORCH_CHECK(h.is_cuda() && h.scalar_type() == torch::kFloat32, "h: a float32 CUDA tensor");
  const c10::cuda::CUDAGuard guard(h.device());  // launch on h's device, not the current one
  auto hc = h.contiguous();
  auto wc = w.contiguous();
  auto xc = has_x ? x.contiguous() : hc;
  auto out = torch::empty_like(hc);
  const int d = hc.size(-1);
  const long rows = d ? hc.numel() / d : 0;
  if (rows == 0) return out;
  const int threads = d >= 1024 ? 1024 : ((d + 31) / 32) * 32;
  tgx_residual_rms_norm_f32<<<rows, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<float>(), hc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(),
      d, (float)eps, (float)plus, has_x ? 1 : 0);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("residual_rms_norm", &residual_rms_norm, "[x +] rms_norm(h, w + plus), float32");
}
#endif
