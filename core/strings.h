// Small string helpers shared by the parsers and the command line.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom {

std::string_view trim(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);  // keeps empty fields
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool starts_with(std::string_view s, std::string_view prefix);

// Levenshtein distance; used to suggest the closest known name for a typo.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `name`, or "" when none is close enough to be a plausible typo.
std::string closest_match(std::string_view name, const std::vector<std::string>& candidates);

std::string human_bytes(double bytes);  // "1.5 GiB"
std::string human_seconds(double s);    // "2.31 ms"

}  // namespace loom
