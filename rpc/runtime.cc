// What rpc/runtime.h declares out of line, and the one place that turns a
// Runtime into the DeviceRouter the codec sees (CodecContext, rpc/codec.h).
#include "rpc/runtime.h"

namespace baton::rpc {

CodecContext::CodecContext(Runtime* runtime, int peer, std::vector<at::Tensor>* sent_tensors,
                           std::vector<at::Tensor*>* received_tensors)
    : runtime(runtime),
      devices(runtime),
      peer(peer),
      sent_tensors(sent_tensors),
      received_tensors(received_tensors) {}

}  // namespace baton::rpc
