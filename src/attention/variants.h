// Factories of the registered variants; registry.cpp lists them (explicitly, so a static link
// never drops one).
#pragma once

#include <memory>

#include "clattn/attention.h"
#include "clattn/spec.h"

namespace clattn {

std::unique_ptr<Attention> make_full(const Spec& spec);
std::unique_ptr<Attention> make_clustered(const Spec& spec);
std::unique_ptr<Attention> make_improved_clustered(const Spec& spec);
std::unique_ptr<Attention> make_conditional_full(const Spec& spec);
std::unique_ptr<Attention> make_local(const Spec& spec);
std::unique_ptr<Attention> make_linear(const Spec& spec);
std::unique_ptr<Attention> make_topk(const Spec& spec);
std::unique_ptr<Attention> make_smyrf(const Spec& spec);
std::unique_ptr<Attention> make_reformer(const Spec& spec);
std::unique_ptr<Attention> make_routing(const Spec& spec);

}  // namespace clattn
