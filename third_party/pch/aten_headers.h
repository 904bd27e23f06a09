// What the precompiled header //third_party/pch:aten holds: ATen's full
// operator API, the one LibTorch header that baton's tensor code parses in
// most of its translation units (7.6 s of parsing each; read from the
// precompiled header in about 1.5 s). torch/torch.h stays out: twice the
// size, and loading it costs more than parsing ATen/ATen.h saves.
#include <ATen/ATen.h>
