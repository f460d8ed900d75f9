// Scratch: the temporary memory attention calls borrow, owned by the caller (docs/design.md).
//
// An attention object keeps nothing between calls. Everything a call needs only while it runs
// (packed K/V panels, per-thread tiles, partial gradients) lives in a Scratch the caller owns:
// a Context owns one by default, or borrows one the caller shares. A model gives every layer's
// Context the same Scratch, so one arena serves all its layers: it holds, per kind of kernel, the
// largest need seen, never the sum over layers, and it is freed with its owner or by release().
//
// One Scratch serves one call at a time: two threads calling attention at once need two
// (each Context owns its own unless told otherwise, so separate Contexts are always safe).
#pragma once

#include <cstddef>
#include <memory>
#include <typeindex>
#include <utility>
#include <vector>

namespace clattn {

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&&) = default;
  Scratch& operator=(Scratch&&) = default;

  // The workspace of one kernel family (type W, default-constructible, with `size_t bytes()
  // const` reporting what it holds), made on first use and reused by later calls.
  template <class W>
  W& get() {
    const std::type_index key(typeid(W));
    for (auto& s : slots_)
      if (s.first == key) return static_cast<Holder<W>&>(*s.second).w;
    slots_.emplace_back(key, std::make_unique<Holder<W>>());
    return static_cast<Holder<W>&>(*slots_.back().second).w;
  }
  // Bytes held now, summed over every workspace.
  size_t bytes() const {
    size_t n = 0;
    for (const auto& s : slots_) n += s.second->bytes();
    return n;
  }
  // Frees everything; the next call allocates (and first-touches) afresh.
  void release() { slots_.clear(); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual size_t bytes() const = 0;
  };
  template <class W>
  struct Holder final : Base {
    W w;
    size_t bytes() const override { return w.bytes(); }
  };
  std::vector<std::pair<std::type_index, std::unique_ptr<Base>>> slots_;
};

}  // namespace clattn
