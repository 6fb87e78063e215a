// See calibration.h.
#include "train/calibration.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "runtime/core/error.h"

namespace strata::train {
namespace {

// The file's keys and the fields they fill, in the order the file lists them.
std::vector<std::pair<const char*, double Calibration::*>> rate_keys() {
  return {{"gemm_fp32_flops", &Calibration::gemm_fp32_flops},
          {"gemm_bf16_flops", &Calibration::gemm_bf16_flops},
          {"adam_params_per_s", &Calibration::adam_params_per_s},
          {"grad_path_ns_per_elem", &Calibration::grad_path_ns_per_elem},
          {"h2d_gbps", &Calibration::h2d_gbps},
          {"d2h_gbps", &Calibration::d2h_gbps},
          {"nvme_read_gbps", &Calibration::nvme_read_gbps},
          {"nvme_write_gbps", &Calibration::nvme_write_gbps},
          {"nvme_mixed_gbps", &Calibration::nvme_mixed_gbps},
          {"reduce_scatter_busbw_gbps", &Calibration::reduce_scatter_busbw_gbps},
          {"all_gather_busbw_gbps", &Calibration::all_gather_busbw_gbps},
          {"all_reduce_busbw_gbps", &Calibration::all_reduce_busbw_gbps}};
}

}  // namespace

nlohmann::json calibration_json(const Calibration& c) {
  nlohmann::json j{{"format", "strata-calibration-1"}, {"host", c.host}, {"threads", c.threads}};
  for (const auto& [key, field] : rate_keys()) j[key] = c.*field;
  return j;
}

Calibration load_calibration(const std::string& path) {
  const std::string again = "; measure this machine again with `strata bench calibrate --out " + path + "`";
  std::ifstream in(path);
  STRATA_CHECK(in.good(), Errc::io, "calibration file '", path, "' cannot be read", again);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  STRATA_CHECK(!j.is_discarded() && j.is_object(), Errc::corrupt, "calibration file '", path, "' is not a JSON object",
               again);
  STRATA_CHECK(j.value("format", "") == "strata-calibration-1", Errc::corrupt, "calibration file '", path,
               "': \"format\" is not \"strata-calibration-1\"", again);
  Calibration c;
  c.host = j.value("host", "");
  c.threads = j.value("threads", 0);
  for (const auto& [key, field] : rate_keys()) {
    const auto it = j.find(key);
    STRATA_CHECK(it != j.end() && it->is_number(), Errc::corrupt, "calibration file '", path, "': \"", key,
                 "\" is missing or not a number", again);
    c.*field = it->get<double>();
    const bool cost = std::string(key) == "grad_path_ns_per_elem";  // a time, may be 0; the rest are rates
    STRATA_CHECK(std::isfinite(c.*field) && (cost ? c.*field >= 0 : c.*field > 0), Errc::corrupt, "calibration file '",
                 path, "': \"", key, "\" = ", c.*field, cost ? " is not a time" : " is not a positive rate", again);
  }
  return c;
}

}  // namespace strata::train
