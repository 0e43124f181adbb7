#include "lower/region.h"

#include <algorithm>
#include <numeric>

#include "core/strings.h"

namespace loom::lower {

using graph::Range;

Frac Frac::of(int64_t p, int64_t q) {
  LOOM_CHECK(q != 0) << "fraction " << p << "/0";
  if (q < 0) p = -p, q = -q;
  const int64_t g = std::gcd(p < 0 ? -p : p, q);
  return g > 1 ? Frac{p / g, q / g} : Frac{p, q};
}
Frac Frac::operator+(const Frac& o) const {
  const int64_t l = std::lcm(q, o.q);
  return of(p * (l / q) + o.p * (l / o.q), l);
}
Frac Frac::operator*(const Frac& o) const { return of(p * o.p, q * o.q); }
bool Frac::operator<(const Frac& o) const {
  return static_cast<__int128>(p) * o.q < static_cast<__int128>(o.p) * q;
}
std::string Frac::to_string() const {
  return q == 1 ? std::to_string(p) : std::to_string(p) + "/" + std::to_string(q);
}

ValueMix ValueMix::whole() {
  ValueMix m;
  m.segs_.push_back({Frac{0, 1}, Frac{1, 1}, Frac{1, 1}});
  return m;
}
ValueMix ValueMix::zero() {
  ValueMix m;
  m.segs_.push_back({Frac{0, 1}, Frac{1, 1}, Frac{0, 1}});
  return m;
}
ValueMix ValueMix::chunk(int64_t c, int64_t n) {
  if (n == 1) return whole();
  ValueMix m;
  const Frac lo = Frac::of(c, n), hi = Frac::of(c + 1, n);
  if (c > 0) m.segs_.push_back({Frac{0, 1}, lo, Frac{0, 1}});
  m.segs_.push_back({lo, hi, Frac{1, 1}});
  if (c + 1 < n) m.segs_.push_back({hi, Frac{1, 1}, Frac{0, 1}});
  return m;
}

void ValueMix::normalise() {
  std::vector<Seg> out;
  for (const Seg& s : segs_) {
    if (!(s.lo < s.hi)) continue;
    if (!out.empty() && out.back().coef == s.coef)
      out.back().hi = s.hi;
    else
      out.push_back(s);
  }
  segs_ = std::move(out);
}

ValueMix ValueMix::scaled(Frac f) const {
  ValueMix m = *this;
  for (Seg& s : m.segs_) s.coef = s.coef * f;
  m.normalise();
  return m;
}

ValueMix ValueMix::squeezed(int64_t sub, int64_t k) const {
  ValueMix m;
  const Frac lo = Frac::of(sub, k), width = Frac::of(1, k);
  if (sub > 0) m.segs_.push_back({Frac{0, 1}, lo, Frac{0, 1}});
  for (const Seg& s : segs_) m.segs_.push_back({lo + s.lo * width, lo + s.hi * width, s.coef});
  if (sub + 1 < k) m.segs_.push_back({Frac::of(sub + 1, k), Frac{1, 1}, Frac{0, 1}});
  m.normalise();
  return m;
}

ValueMix ValueMix::operator+(const ValueMix& o) const {
  std::vector<Frac> cuts;
  for (const Seg& s : segs_) cuts.push_back(s.lo);
  for (const Seg& s : o.segs_) cuts.push_back(s.lo);
  cuts.push_back(Frac{1, 1});
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  auto coef_at = [](const std::vector<Seg>& segs, const Frac& x) {
    for (const Seg& s : segs)
      if (!(x < s.lo) && x < s.hi) return s.coef;
    return Frac{0, 1};
  };
  ValueMix m;
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    m.segs_.push_back({cuts[i], cuts[i + 1], coef_at(segs_, cuts[i]) + coef_at(o.segs_, cuts[i])});
  m.normalise();
  return m;
}

bool ValueMix::is_whole() const { return segs_.size() == 1 && segs_[0].coef == Frac{1, 1}; }

bool ValueMix::operator==(const ValueMix& o) const {
  if (segs_.size() != o.segs_.size()) return false;
  for (size_t i = 0; i < segs_.size(); ++i)
    if (segs_[i].lo != o.segs_[i].lo || segs_[i].hi != o.segs_[i].hi ||
        segs_[i].coef != o.segs_[i].coef)
      return false;
  return true;
}

std::string ValueMix::to_string() const {
  if (is_whole()) return "whole value";
  if (segs_.size() == 1) return segs_[0].coef.to_string() + " x the whole value";
  // One chunk c of m with coefficient 1: "partial sum c of m".
  std::vector<const Seg*> nonzero;
  for (const Seg& s : segs_)
    if (s.coef.p != 0) nonzero.push_back(&s);
  if (nonzero.size() == 1 && nonzero[0]->coef == Frac{1, 1}) {
    const Frac width = nonzero[0]->hi + Frac{-nonzero[0]->lo.p, nonzero[0]->lo.q};
    if (width.p == 1) {
      const Frac c = nonzero[0]->lo * Frac{width.q, 1};
      return "partial sum " + c.to_string() + " of " + std::to_string(width.q);
    }
  }
  std::vector<std::string> parts;
  for (const Seg& s : segs_)
    parts.push_back("[" + s.lo.to_string() + "," + s.hi.to_string() + ") " + s.coef.to_string() +
                    " time(s)");
  return "the value's chunks counted " + join(parts, ", ");
}

Region Region::of(const graph::SubTensor& s) {
  return Region{s.tensor, s.ranges, ValueMix::chunk(s.value_chunk, s.value_chunks)};
}

std::string ranges_string(const std::vector<Range>& ranges) {
  std::string out = "[";
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranges[i].start) + ":" + std::to_string(ranges[i].end);
  }
  return out + "]";
}

std::string Region::to_string() const { return ranges_string(ranges) + " " + value.to_string(); }

namespace {

std::string members_string(const std::vector<DeviceId>& g) {
  std::vector<std::string> parts;
  for (DeviceId d : g) parts.push_back(std::to_string(d.value()));
  return "[" + join(parts, ",") + "]";
}

Error step_error(const CommStep& st, const std::vector<DeviceId>* group, const std::string& why) {
  std::string where = to_string(st.primitive);
  if (group) where += " over ranks " + members_string(*group);
  return Error::at("region", where + ": " + why);
}

int64_t position(const Layout& l, int64_t device) {
  for (size_t p = 0; p < l.devices.size(); ++p)
    if (l.devices[p].value() == device) return static_cast<int64_t>(p);
  return -1;
}

// Chunk `sub` of `k` along `dim`, or an error when k does not divide the range.
Result<Range> part_of(const Range& r, int64_t sub, int64_t k) {
  if (k < 1 || r.size() % k != 0)
    return Error::at("region", "the range " + std::to_string(r.start) + ":" +
                                   std::to_string(r.end) + " does not split " + std::to_string(k) +
                                   " ways");
  const int64_t w = r.size() / k;
  return Range{r.start + sub * w, r.start + (sub + 1) * w};
}

Status check_dim(const CommStep& st, int factor, size_t ndim) {
  if (factor < 2 || static_cast<size_t>(factor - 2) >= ndim)
    return step_error(st, nullptr,
                      "factor " + std::to_string(factor) + " names no dimension of the tensor");
  return Status::success();
}

Status run_transfer(const CommStep& st, DeviceRegions& s) {
  DeviceRegions next(s.held.size());
  for (const auto& pair : st.groups) {
    if (pair.size() != 2)
      return step_error(st, &pair, "a send/recv pair of " + std::to_string(pair.size()) + " ranks");
    const int64_t src = pair[0].value(), dst = pair[1].value();
    if (!s.has(src))
      return step_error(st, &pair,
                        "rank " + std::to_string(src) + " sends a piece it does not hold");
    if (next.has(dst))
      return step_error(st, &pair, "rank " + std::to_string(dst) + " receives two pieces");
    if (dst < 0 || dst >= static_cast<int64_t>(s.held.size()))
      return step_error(st, &pair, "a receiver outside the world");
    next.set(dst, s.region[static_cast<size_t>(src)]);
  }
  // A device whose piece stays where it is (same position in both layouts) keeps it.
  for (DeviceId d : st.after.devices) {
    const int64_t dv = d.value();
    if (next.has(dv) || !s.has(dv)) continue;
    const int64_t before = position(st.before, dv);
    if (before >= 0 && before == position(st.after, dv))
      next.set(dv, s.region[static_cast<size_t>(dv)]);
  }
  s = std::move(next);
  return Status::success();
}

Status run_local(const CommStep& st, DeviceRegions& s) {
  for (size_t p = 0; p < st.before.devices.size(); ++p) {
    const int64_t d = st.before.devices[p].value();
    if (!s.has(d))
      return step_error(st, nullptr, "rank " + std::to_string(d) + " holds no piece to cut");
    Region& r = s.region[static_cast<size_t>(d)];
    const std::vector<int64_t> coords = st.before.coords(static_cast<int64_t>(p));
    if (st.from_factor < 0 || static_cast<size_t>(st.from_factor) >= coords.size())
      return step_error(st, nullptr, "a factor outside the layout");
    const int64_t sub = coords[static_cast<size_t>(st.from_factor)] % st.k;
    if (st.primitive == Primitive::kValueChunk) {
      r.value = r.value.scaled(Frac::of(1, st.k));
    } else if (st.primitive == Primitive::kChunk) {
      LOOM_TRY(check_dim(st, st.to_factor, r.ranges.size()));
      auto part = part_of(r.ranges[static_cast<size_t>(st.to_factor - 2)], sub, st.k);
      if (!part.ok())
        return step_error(st, nullptr, "rank " + std::to_string(d) + ": " + part.error().message);
      r.ranges[static_cast<size_t>(st.to_factor - 2)] = *part;
    } else {  // pad: the piece among k - 1 slices of zeros
      LOOM_TRY(check_dim(st, st.from_factor, r.ranges.size()));
      Range& rg = r.ranges[static_cast<size_t>(st.from_factor - 2)];
      const int64_t w = rg.size();
      rg = Range{rg.start - sub * w, rg.start + (st.k - sub) * w};
      r.value = r.value.squeezed(sub, st.k);
    }
  }
  return Status::success();
}

Status run_group(const CommStep& st, const std::vector<DeviceId>& g, DeviceRegions& s) {
  const int64_t k = static_cast<int64_t>(g.size());
  if (k != st.k)
    return step_error(
        st, &g,
        "a group of " + std::to_string(k) + " ranks for a step moving " + std::to_string(st.k));
  std::vector<Region> in;
  for (DeviceId d : g) {
    if (!s.has(d.value()))
      return step_error(st, &g, "rank " + std::to_string(d.value()) + " holds no piece");
    in.push_back(s.region[static_cast<size_t>(d.value())]);
  }
  const size_t ndim = in[0].ranges.size();
  auto unlike = [&](size_t j, const std::string& what) {
    return step_error(st, &g,
                      "rank " + std::to_string(g[j].value()) + " holds " + in[j].to_string() +
                          " where rank " + std::to_string(g[0].value()) + " holds " +
                          in[0].to_string() + ": " + what);
  };
  std::vector<Region> out(static_cast<size_t>(k));
  if (st.primitive == Primitive::kAllReduce || st.primitive == Primitive::kReduceScatter) {
    ValueMix sum = in[0].value;
    for (size_t j = 1; j < in.size(); ++j) {
      if (!in[j].same_box(in[0])) return unlike(j, "a sum of unlike boxes");
      sum = sum + in[j].value;
    }
    for (size_t j = 0; j < out.size(); ++j) {
      out[j] = in[0];
      out[j].value = sum;
      if (st.primitive == Primitive::kReduceScatter) {
        LOOM_TRY(check_dim(st, st.to_factor, ndim));
        auto part = part_of(in[0].ranges[static_cast<size_t>(st.to_factor - 2)],
                            static_cast<int64_t>(j), k);
        if (!part.ok()) return step_error(st, &g, part.error().message);
        out[j].ranges[static_cast<size_t>(st.to_factor - 2)] = *part;
      }
    }
  } else if (st.primitive == Primitive::kAllGather || st.primitive == Primitive::kAllToAll) {
    LOOM_TRY(check_dim(st, st.from_factor, ndim));
    const size_t f = static_cast<size_t>(st.from_factor - 2);
    const bool to_all = st.primitive == Primitive::kAllToAll;
    size_t t = ndim;
    if (to_all) {
      LOOM_TRY(check_dim(st, st.to_factor, ndim));
      t = static_cast<size_t>(st.to_factor - 2);
    }
    for (size_t j = 0; j < in.size(); ++j) {
      if (in[j].tensor != in[0].tensor || in[j].value != in[0].value)
        return unlike(j, "pieces of unlike values joined");
      for (size_t d = 0; d < ndim; ++d)
        if (d != f && in[j].ranges[d] != in[0].ranges[d])
          return unlike(j, "pieces joined along dimension " + std::to_string(f) +
                               " differ in dimension " + std::to_string(d));
      if (j > 0 && in[j].ranges[f].start != in[j - 1].ranges[f].end)
        return unlike(j, in[j].ranges[f].start > in[j - 1].ranges[f].end
                             ? "a gap along dimension " + std::to_string(f)
                             : "an overlap along dimension " + std::to_string(f));
    }
    for (size_t j = 0; j < out.size(); ++j) {
      out[j] = in[0];
      out[j].ranges[f] = Range{in.front().ranges[f].start, in.back().ranges[f].end};
      if (to_all) {
        auto part = part_of(in[0].ranges[t], static_cast<int64_t>(j), k);
        if (!part.ok()) return step_error(st, &g, part.error().message);
        out[j].ranges[t] = *part;
      }
    }
  } else {
    return step_error(st, &g, "not a collective");
  }
  for (size_t j = 0; j < g.size(); ++j) s.set(g[j].value(), std::move(out[j]));
  return Status::success();
}

}  // namespace

Status run_step(const CommStep& st, DeviceRegions& state) {
  const PrimitiveRule& rule = rule_of(st.primitive);
  if (rule.kind == PrimitiveKind::kTransfer) return run_transfer(st, state);
  if (st.k < 2) return step_error(st, nullptr, "a step moving a factor of " + std::to_string(st.k));
  if (rule.kind == PrimitiveKind::kLocal) return run_local(st, state);
  for (const auto& g : st.groups)
    if (g.size() > 1 || st.k == 1) LOOM_TRY(run_group(st, g, state));
  return Status::success();
}

bool tiles_exactly(const std::vector<std::vector<Range>>& boxes, const std::vector<Range>& whole,
                   std::string* why, size_t* culprit) {
  if (culprit) *culprit = boxes.size();
  const size_t ndim = whole.size();
  std::vector<std::vector<int64_t>> cuts(ndim);
  for (size_t d = 0; d < ndim; ++d) cuts[d] = {whole[d].start, whole[d].end};
  for (size_t bi = 0; bi < boxes.size(); ++bi) {
    const auto& b = boxes[bi];
    if (culprit) *culprit = bi;
    if (b.size() != ndim) {
      if (why) *why = "a piece of " + std::to_string(b.size()) + " dimensions";
      return false;
    }
    for (size_t d = 0; d < ndim; ++d) {
      if (b[d].start < whole[d].start || b[d].end > whole[d].end || b[d].start >= b[d].end) {
        if (why) *why = "the piece " + ranges_string(b) + " lies outside " + ranges_string(whole);
        return false;
      }
      cuts[d].push_back(b[d].start);
      cuts[d].push_back(b[d].end);
    }
  }
  size_t cells = 1;
  for (auto& c : cuts) {
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    cells *= c.size() - 1;
  }
  LOOM_CHECK(cells < (size_t{1} << 28)) << "a tiling check of " << cells << " cells";
  std::vector<uint8_t> count(cells, 0);
  std::vector<size_t> stride(ndim, 1);
  for (size_t d = ndim; d-- > 1;) stride[d - 1] = stride[d] * (cuts[d].size() - 1);
  for (size_t bi = 0; bi < boxes.size(); ++bi) {
    const auto& b = boxes[bi];
    if (culprit) *culprit = bi;
    std::vector<size_t> lo(ndim), hi(ndim), at(ndim);
    for (size_t d = 0; d < ndim; ++d) {
      lo[d] = static_cast<size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), b[d].start) -
                                  cuts[d].begin());
      hi[d] = static_cast<size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), b[d].end) -
                                  cuts[d].begin());
      at[d] = lo[d];
    }
    while (true) {
      size_t cell = 0;
      for (size_t d = 0; d < ndim; ++d) cell += at[d] * stride[d];
      if (++count[cell] > 1) {
        if (why) *why = "pieces overlap at " + ranges_string(b);
        return false;
      }
      bool done = true;
      for (size_t d = ndim; d-- > 0;) {
        if (++at[d] < hi[d]) {
          done = false;
          break;
        }
        at[d] = lo[d];
      }
      if (done) break;
    }
  }
  if (culprit) *culprit = boxes.size();
  for (size_t c = 0; c < cells; ++c)
    if (count[c] == 0) {
      std::vector<Range> gap(ndim);
      size_t rest = c;
      for (size_t d = 0; d < ndim; ++d) {
        const size_t i = rest / stride[d];
        rest %= stride[d];
        gap[d] = Range{cuts[d][i], cuts[d][i + 1]};
      }
      if (why) *why = "no piece covers " + ranges_string(gap);
      return false;
    }
  return true;
}

}  // namespace loom::lower
