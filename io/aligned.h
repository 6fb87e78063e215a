// 4 KiB alignment for O_DIRECT (buffer address, file offset and length must be multiples
// of the device's logical block; 4 KiB covers 512-byte and 4Kn drives) and a small RAII
// owner of aligned, zero-filled memory for headers, tables and tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::io {

inline constexpr std::size_t kAlignment = 4096;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a = kAlignment) { return (v + a - 1) / a * a; }
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a = kAlignment) { return v / a * a; }
constexpr bool is_aligned(std::uint64_t v, std::uint64_t a = kAlignment) { return v % a == 0; }
inline bool is_aligned(const void* p, std::uint64_t a = kAlignment) {
  return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}

// Owns bytes() bytes (rounded up to kAlignment) at a kAlignment-aligned address, zero-filled.
// Empty (data() == nullptr) when default-constructed, moved from, or allocation failed.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  template <class T> T* as() const noexcept { return reinterpret_cast<T*>(data_); }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace strata::io
