// The one adapter from CUDA runtime, cuBLAS and cuDNN error codes to leash::Status, keeping
// each library's own message. Only the CUDA backend (kernels/cuda) includes it.
// Pure functions; thread-safe.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "leash/common/status.h"

namespace leash::kernels::cuda {

// `what` says what was being done, e.g. "allocating 4096 bytes on cuda:0".
inline Status FromCuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  std::string msg = what + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
  switch (e) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(msg);
    case cudaErrorNoKernelImageForDevice:
      return Unavailable(
          msg + "; rebuild with CMAKE_CUDA_ARCHITECTURES including this GPU's architecture");
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

inline Status FromCublas(cublasStatus_t e, const std::string& what) {
  if (e == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string msg = what + ": cuBLAS: " + cublasGetStatusString(e);
  switch (e) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return ResourceExhausted(msg);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_LICENSE_ERROR:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

inline Status FromCudnn(cudnnStatus_t e, const std::string& what) {
  if (e == CUDNN_STATUS_SUCCESS) return Status::Ok();
  std::string msg = what + ": cuDNN: " + cudnnGetErrorString(e);
  switch (e) {
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return ResourceExhausted(msg);
    case CUDNN_STATUS_NOT_INITIALIZED:
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH:
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED:
    case CUDNN_STATUS_LICENSE_ERROR:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER:
    case CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

// The error of the kernel launch just made (bad configuration, missing kernel image).
inline Status LaunchStatus(const char* kernel) {
  return FromCuda(cudaGetLastError(), std::string("launching ") + kernel);
}

}  // namespace leash::kernels::cuda
