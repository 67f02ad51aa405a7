// SLIMKV_HOST_DEVICE marks a small inline function that CUDA kernels call too (compiled for the host
// and the GPU from one definition); to the C++ compiler it is nothing.
#pragma once

#ifdef __CUDACC__
#define SLIMKV_HOST_DEVICE __host__ __device__
#else
#define SLIMKV_HOST_DEVICE
#endif
