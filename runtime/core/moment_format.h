// How an optimizer's moments (exp_avg, exp_avg_sq) are stored: fp32, bf16 (rounded to nearest
// even) or q8 (8-bit codes with a power-of-two scale per 16 elements, q8_codec.h). One
// definition for every layer that holds, moves or saves moments: the optimizers, the engine's
// tiers, the NVMe swap files and checkpoints.
//
// Protocol. A moment array of n elements takes moment_bytes(format, n) bytes; q8 arrays are
// whole blocks of 16 elements (the last one zero-padded), so an array may be cut only at
// multiples of moment_align(format) elements and element e starts moment_offset(format, e)
// bytes in. Conversions to and from fp32 are exact for fp32, widen bf16 exactly and round to
// bf16 to nearest even, and code q8 blocks as q8_codec.h says (salt 0): coding what a
// decode gave reproduces the same values (a block may come back at the finer of two scales).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

enum class MomentFormat : std::uint8_t { fp32, bf16, q8 };
enum class Moment : std::uint8_t { first, second };  // exp_avg (signed), exp_avg_sq (>= 0)

const char* moment_format_name(MomentFormat f) noexcept;  // "fp32", "bf16", "q8"
// Throws Errc::invalid_argument naming the text and the accepted names.
MomentFormat parse_moment_format(std::string_view text);
// Bytes per element for messages and estimates (q8: 17/16).
double moment_bytes_per_elem(MomentFormat f) noexcept;

std::size_t moment_align(MomentFormat f) noexcept;  // 1, 1, 16
std::size_t moment_bytes(MomentFormat f, std::size_t n) noexcept;
// Throws Errc::invalid_argument when elem is not a multiple of moment_align(f).
std::size_t moment_offset(MomentFormat f, std::size_t elem);

void moments_to_fp32(const void* src, MomentFormat f, Moment which, float* dst, std::size_t n);
// Elements [first, first + count) of the moment array at `array` (any first: q8 decodes the
// blocks that hold them).
void moments_range_to_fp32(const void* array, MomentFormat f, Moment which, std::size_t first, std::size_t count,
                           float* dst);
void moments_from_fp32(const float* src, void* dst, MomentFormat f, Moment which, std::size_t n);

}  // namespace strata
