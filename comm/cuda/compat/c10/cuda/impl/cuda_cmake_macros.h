// Compile-check shim: Debian's CPU LibTorch ships c10/cuda headers without
// this generated file. A CUDA LibTorch has the real one; this copy is only
// on the include path of the compile-only check (comm/cuda.bazelrc,
// comm/cuda/check_syntax.sh), never of the GPU build.
#pragma once
