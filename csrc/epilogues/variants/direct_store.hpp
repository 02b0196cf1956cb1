// coda/epilogues/variants/direct_store.hpp — the epilogue's tile stores written from registers
// (KernelConfig(tile_stores="direct")).
//
// Why: a TMA tile store stages each subtile in shared memory (registers -> shared memory, a fence, the warp
// group's barrier, one thread's TMA store, and a wait before the stage is written again), beside a mainloop whose
// operand stages need that capacity, and its bulk copies go through the TMA unit that also fetches the
// mainloop's operands. Here each thread writes the elements of its own fragment to global memory (CUTLASS's
// shared-memory-free Sm90AuxStore: 4-byte stores for two adjacent 16-bit columns, 8-byte ones for two adjacent
// 32-bit pairs, every 32-byte sector whole across a warp's row), predicated on the problem's bounds, at the end
// of each subtile. No shared memory, no barrier, no TMA.
//
// A variant header (csrc/epilogues/variants/): included by the emitted source of the kernels that use it only,
// after the kernel templates, so a change here re-keys those kernels alone (coda_ext.jit.cache.variant_digest).
#pragma once

#include "../nodes.hpp"

namespace coda::epi {

// Stores its input as an M x N tile straight from registers and passes it through (TileStore's arguments).
template <class Cfg, class T>
struct TileStoreDirect {
  using Node = fusion::Sm90AuxStore<0, cute::Shape<cute::_1, cute::_1>, T, kRound,
                                    cutlass::detail::TagToStrideC_t<typename Cfg::LayoutD>, void, void,
                                    128 / cutlass::sizeof_bits<T>::value, /*EnableNullptr=*/false>;
  static typename Node::Arguments args(CodaSlot const& s) {
    return {static_cast<T*>(s.ptr), {s.ld, cute::_1{}, int64_t(0)}};
  }
};

}  // namespace coda::epi
