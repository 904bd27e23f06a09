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

}  // namespace internal

template <typename T = torch::autograd::Node>
using NodePtr = typename internal::Rebind<internal::EdgeFunction, T>::type;

template <typename T, typename... Args>
NodePtr<T> MakeNode(Args&&... args) {
  return internal::Rebind<internal::EdgeFunction, T>::Make(std::forward<Args>(args)...);
}

}  // namespace baton::torch_compat

#endif  // BATON_BASE_TORCH_COMPAT_H_
