// typeTag<T>(): a unique address per type, for finding objects by type without RTTI.
//
//   const void* t = weft::typeTag<Tensor>();    // the same pointer everywhere in the program
//   if (held.type == weft::typeTag<Tensor>()) ...
//
// Two different types never share a tag; cv-qualifiers and references count as
// different types, so decay first where that matters.
#pragma once

namespace weft {

namespace detail {
template <class T>
inline constexpr char kTypeTag = 0;
}  // namespace detail

template <class T>
constexpr const void* typeTag() {
  return &detail::kTypeTag<T>;
}

}  // namespace weft
