// The classic generators (GPipe, 1F1B, interleaved 1F1B) and the dispatch by kind.
#include "pipeline/generators.h"

#include <algorithm>

#include "pipeline/detail/checks.h"
#include "runtime/core/error.h"

namespace strata::pipeline {
namespace {

using Order = std::vector<std::vector<Action>>;

constexpr ScheduleKind kKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                   ScheduleKind::zb_h1, ScheduleKind::zb_h2,       ScheduleKind::zb_auto};

Action fwd(int mb, int chunk = 0) { return {ActionKind::forward, mb, chunk, -1}; }
Action bwd(int mb, int chunk = 0) { return {ActionKind::backward_full, mb, chunk, -1}; }

}  // namespace

const char* schedule_kind_name(ScheduleKind k) noexcept {
  switch (k) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
    case ScheduleKind::zb_h2:
      return "zb-h2";
    case ScheduleKind::zb_auto:
      return "zb-auto";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view text) {
  for (ScheduleKind k : kKinds) {
    if (text == schedule_kind_name(k)) return k;
  }
  STRATA_THROW(Errc::invalid_argument, "schedule kind '", text,
               "' is not one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-auto");
}

Schedule gpipe(int p, int m) {
  detail::check_shape("gpipe", p, m, 1, false);
  Order order(p);
  for (auto& list : order) {
    for (int i = 0; i < m; ++i) list.push_back(fwd(i));
    for (int i = 0; i < m; ++i) list.push_back(bwd(i));
  }
  return add_communication("gpipe", p, m, 1, order);
}

Schedule one_f_one_b(int p, int m) {
  detail::check_shape("1f1b", p, m, 1, false);
  Order order(p);
  for (int s = 0; s < p; ++s) {
    auto& list = order[s];
    const int warmup = std::min(p - s - 1, m);
    for (int i = 0; i < warmup; ++i) list.push_back(fwd(i));
    for (int k = 0; k < m - warmup; ++k) {
      list.push_back(fwd(warmup + k));
      list.push_back(bwd(k));
    }
    for (int k = m - warmup; k < m; ++k) list.push_back(bwd(k));
  }
  return add_communication("1f1b", p, m, 1, order);
}

Schedule interleaved_1f1b(int p, int m, int v) {
  detail::check_shape("interleaved", p, m, v, true);
  STRATA_CHECK(m % p == 0, Errc::invalid_argument, "interleaved 1F1B: micro-batches m=", m,
               " must be a multiple of stages p=", p,
               " (micro-batches go round in groups of p); try m=", (m / p + 1) * p);
  // Megatron's order: forwards go through the chunks in groups of p micro-batches, the
  // k-th forward on a stage being micro-batch (k / (p v)) p + k % p of chunk (k / p) % v;
  // backwards visit the chunks in reverse. Stage r warms up with 2(p-r-1) + (v-1)p forwards.
  const int total = m * v;
  auto micro_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fchunk = [&](int k) { return (k / p) % v; };
  auto bchunk = [&](int k) { return v - 1 - (k / p) % v; };
  Order order(p);
  for (int s = 0; s < p; ++s) {
    auto& list = order[s];
    const int warmup = std::min(2 * (p - s - 1) + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) list.push_back(fwd(micro_of(k), fchunk(k)));
    for (int k = 0; k < total - warmup; ++k) {
      const int f = warmup + k;
      list.push_back(fwd(micro_of(f), fchunk(f)));
      list.push_back(bwd(micro_of(k), bchunk(k)));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(bwd(micro_of(k), bchunk(k)));
  }
  return add_communication("interleaved", p, m, v, order);
}

Schedule generate(const GenerateOptions& o, AutoReport* report) {
  STRATA_CHECK(o.kind == ScheduleKind::interleaved || o.chunks == 1, Errc::invalid_argument, "chunks=", o.chunks,
               " applies only to the interleaved schedule; ", schedule_kind_name(o.kind), " has one chunk per stage");
  // Each (stage, chunk, micro-batch) holds three actions of a few hundred bytes once
  // simulated: a bound keeps a typo from taking the machine's memory.
  const std::uint64_t pairs = static_cast<std::uint64_t>(o.stages) * static_cast<std::uint64_t>(o.micro_batches) *
                              static_cast<std::uint64_t>(std::max(1, o.chunks));
  STRATA_CHECK(pairs <= kMaxScheduleCells, Errc::invalid_argument, "stages ", o.stages, " x micro-batches ",
               o.micro_batches, " x chunks ", std::max(1, o.chunks), " = ", pairs, " cells is above the ",
               kMaxScheduleCells,
               " a schedule may have (about 1 KiB of memory each): use fewer micro-batches (the bubble rate hardly "
               "changes beyond m = 8p)");
  switch (o.kind) {
    case ScheduleKind::gpipe:
      return gpipe(o.stages, o.micro_batches);
    case ScheduleKind::one_f_one_b:
      return one_f_one_b(o.stages, o.micro_batches);
    case ScheduleKind::interleaved:
      return interleaved_1f1b(o.stages, o.micro_batches, o.chunks);
    case ScheduleKind::zb_h1:
      return zb_h1(o.stages, o.micro_batches);
    case ScheduleKind::zb_h2:
      return zb_h2(o.stages, o.micro_batches);
    case ScheduleKind::zb_auto: {
      AutoOptions a;
      a.stages = o.stages;
      a.micro_batches = o.micro_batches;
      a.costs = o.costs;
      a.memory_limit = o.memory_limit;
      return zb_auto(a, report);
    }
  }
  STRATA_THROW(Errc::internal, "generate: unknown schedule kind");
}

}  // namespace strata::pipeline
