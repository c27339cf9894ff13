/*
 * plugins/cuda/cuda_optim.cu - the cuda device's optimizer updates: AdamW
 * (decoupled weight decay) and SGD with momentum, one fused element-wise
 * kernel each.  The ABI hands a strategy's whole flat shard (every tensor
 * of a unit or of the rank's shard, one buffer) to one call, so one launch
 * already covers many tensors: the multi-tensor fusion PyTorch's
 * _foreach/fused optimizers do over lists of tensors.  Compiled for sm_80
 * and sm_90; ran on an H200 (test_kernels).
 */
#include "cuda_dtype.cuh"
#include "cuda_launch.h"

/* The cpu's formula (sdk/lib/dt_optim_host.c): the bias corrections are
 * folded into step = lr / bc1 and rbc2 = 1 / sqrt(bc2), computed on the
 * host; one division and one square root an element. */
template <typename G>
__global__ void adamw_k(float *param, const G *grad, float *m, float *v,
                        int64_t n, float b1, float b2, float eps, float gs,
                        float step, float rbc2, float lr_wd)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = ld(grad, i) * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        param[i] = p - (step * mi / (sqrtf(vi) * rbc2 + eps) + lr_wd * p);
    }
}

template <typename G>
__global__ void sgd_k(float *param, const G *grad, float *mom, int64_t n,
                      float lr, float mu, float wd, int nesterov, float gs)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float p = param[i];
        float g = ld(grad, i) * gs + wd * p;
        float step = g;
        if (mom) {
            float mi = mu * mom[i] + g;
            mom[i] = mi;
            step = nesterov ? g + mu * mi : mi;
        }
        param[i] = p - lr * step;
    }
}

extern "C" {

cudaError_t cuda_launch_adamw(cudaStream_t cs, float *param, const void *grad,
                              float *m, float *v, int grad_dtype, int64_t n,
                              float beta1, float beta2, float eps,
                              float grad_scale, float step, float rsqrt_bc2,
                              float lr_wd)
{
    return dt_dispatch(grad_dtype, [&](auto *t) {
        using G = DT_ELEM(t);
        adamw_k<G><<<dt_grid(n), DT_BLOCK, 0, cs>>>(param, (const G *)grad, m, v,
                                                     n, beta1, beta2, eps,
                                                     grad_scale, step, rsqrt_bc2,
                                                     lr_wd);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_sgd(cudaStream_t cs, float *param, const void *grad,
                            float *mom, int grad_dtype, int64_t n, float lr,
                            float momentum, float weight_decay, int nesterov,
                            float grad_scale)
{
    return dt_dispatch(grad_dtype, [&](auto *t) {
        using G = DT_ELEM(t);
        sgd_k<G><<<dt_grid(n), DT_BLOCK, 0, cs>>>(param, (const G *)grad, mom, n,
                                                   lr, momentum, weight_decay,
                                                   nesterov, grad_scale);
        return cudaGetLastError();
    });
}

} /* extern "C" */
