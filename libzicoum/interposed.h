// The driver entry points libzicoum defines that cuda.h does not declare in
// a default build (the per-thread-default-stream twins), so that the
// proc-address hooks (driver_entry_points.cpp) can hand them out.
#pragma once

#include <cuda.h>

extern "C" {
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
}
