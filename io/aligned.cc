// AlignedBuffer (see aligned.h).
#include "io/aligned.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace strata::io {

AlignedBuffer::AlignedBuffer(std::size_t bytes) {
  const std::size_t size = align_up(bytes == 0 ? 1 : bytes);
  data_ = static_cast<std::byte*>(std::aligned_alloc(kAlignment, size));
  if (data_ != nullptr) {
    std::memset(data_, 0, size);
    bytes_ = size;
  }
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace strata::io
