// What differs between the LibTorch releases baton builds against, in one
// place: Debian's 1.13 (the Bazel build) and pip's 2.x up to the newest that
// CMakeLists.txt accepts (BATON_TORCH_NEWEST; docs/build.md has the table).
// Code that meets one of these differences uses the names here, never its
// own version test.
//
// - Autograd's graph nodes are owned by std::shared_ptr<Node> up to torch
//   2.14 and by c10::intrusive_ptr<Node> from 2.15 on. NodePtr<T> is the
//   owning pointer to a node of type T in the torch being compiled against,
//   MakeNode<T>(args...) makes one; both pointers convert to NodePtr<Node>
//   (what torch::autograd::Edge holds) and have get(). torch 2.15's edge.h
//   does not compile on its own (Edge's destructor needs Node complete), so
//   this header includes autograd's function.h: it costs its includers
//   seconds of parsing, keep it out of widely included headers.
// - A leaf's tensor hooks (`register_hook`): from torch 2.0 on, autograd's
//   engine runs them on a gradient it captures at the leaf's accumulator
//   (`execute()` with outputs), as Node::tensor_pre_hooks(); 1.13's engine
//   captures the gradient as it comes. kEngineRunsLeafHooksOnCapture says
//   which, from whether Node has tensor_pre_hooks().
//
// Thread-safety: types and functions only, no state.
#ifndef BATON_BASE_TORCH_COMPAT_H_
#define BATON_BASE_TORCH_COMPAT_H_

#include <memory>
#include <type_traits>
#include <utility>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/function.h>

namespace baton::torch_compat {
namespace internal {

template <typename Owner, typename T>
struct Rebind;
template <typename N, typename T>
struct Rebind<std::shared_ptr<N>, T> {
  using type = std::shared_ptr<T>;
  template <typename... Args>
  static type Make(Args&&... args) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  }
};
template <typename N, typename Null, typename T>
struct Rebind<c10::intrusive_ptr<N, Null>, T> {
  using type = c10::intrusive_ptr<T>;
  template <typename... Args>
  static type Make(Args&&... args) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
};

// The pointer torch's Edge holds: the torch being compiled against decides.
using EdgeFunction = std::remove_cv_t<decltype(std::declval<torch::autograd::Edge>().function)>;

template <typename N, typename = void>
struct HasTensorPreHooks : std::false_type {};
template <typename N>
struct HasTensorPreHooks<N, std::void_t<decltype(std::declval<N&>().tensor_pre_hooks())>>
    : std::true_type {};

}  // namespace internal

template <typename T = torch::autograd::Node>
using NodePtr = typename internal::Rebind<internal::EdgeFunction, T>::type;

template <typename T, typename... Args>
NodePtr<T> MakeNode(Args&&... args) {
  return internal::Rebind<internal::EdgeFunction, T>::Make(std::forward<Args>(args)...);
}

inline constexpr bool kEngineRunsLeafHooksOnCapture =
    internal::HasTensorPreHooks<torch::autograd::Node>::value;

}  // namespace baton::torch_compat

#endif  // BATON_BASE_TORCH_COMPAT_H_
