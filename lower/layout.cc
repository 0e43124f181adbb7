#include "lower/layout.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/strings.h"

namespace loom::lower {

Layout Layout::replicated(size_t ndim, std::vector<DeviceId> devices) {
  Layout l;
  l.r = static_cast<int64_t>(devices.size());
  l.d.assign(ndim, 1);
  l.devices = std::move(devices);
  return l;
}

Layout Layout::split(size_t ndim, size_t dim, std::vector<DeviceId> devices) {
  Layout l;
  l.d.assign(ndim, 1);
  l.d[dim] = static_cast<int64_t>(devices.size());
  l.devices = std::move(devices);
  return l;
}

Layout Layout::partial(size_t ndim, std::vector<DeviceId> devices) {
  Layout l;
  l.v = static_cast<int64_t>(devices.size());
  l.d.assign(ndim, 1);
  l.devices = std::move(devices);
  return l;
}

std::vector<int64_t> Layout::factors() const {
  std::vector<int64_t> f{r, v};
  f.insert(f.end(), d.begin(), d.end());
  return f;
}

std::vector<int64_t> Layout::coords(int64_t position) const {
  std::vector<int64_t> f = factors();
  std::vector<int64_t> c(f.size());
  for (size_t i = f.size(); i-- > 0;) {
    c[i] = position % f[i];
    position /= f[i];
  }
  return c;
}

int64_t Layout::position_of(const std::vector<int64_t>& c) const {
  std::vector<int64_t> f = factors();
  int64_t p = 0;
  for (size_t i = 0; i < f.size(); ++i) p = p * f[i] + c[i];
  return p;
}

graph::SubTensor Layout::piece(int64_t position, TensorId tensor, const Shape& shape) const {
  std::vector<int64_t> c = coords(position);
  graph::SubTensor s;
  s.tensor = tensor;
  s.value_chunk = c[1];
  s.value_chunks = v;
  for (size_t k = 0; k < d.size(); ++k) {
    int64_t part = shape[k] / d[k];
    s.ranges.push_back({c[k + 2] * part, (c[k + 2] + 1) * part});
  }
  return s;
}

Status Layout::validate(const Shape* shape) const {
  int64_t product = 1;
  for (int64_t f : factors()) {
    if (f < 1) return Error::at("layout", "layout " + to_string() + " has a factor below 1");
    product *= f;
  }
  if (product != size())
    return Error::at("layout", "layout " + to_string() + ": factors multiply to " +
                                   std::to_string(product) + " but it has " +
                                   std::to_string(size()) + " devices");
  std::set<DeviceId> seen(devices.begin(), devices.end());
  if (static_cast<int64_t>(seen.size()) != size())
    return Error::at("layout", "layout " + to_string() + " names a device twice");
  if (shape) {
    if (shape->size() != d.size())
      return Error::at("layout",
                       "layout " + to_string() + " does not fit shape " + loom::to_string(*shape));
    for (size_t k = 0; k < d.size(); ++k)
      if ((*shape)[k] % d[k] != 0)
        return Error::at("layout", "layout " + to_string() + ": dimension " + std::to_string(k) +
                                       " of " + loom::to_string(*shape) + " is not divisible by " +
                                       std::to_string(d[k]));
  }
  return Status::success();
}

std::string Layout::to_string() const {
  std::vector<std::string> ds, devs;
  for (int64_t x : d) ds.push_back(std::to_string(x));
  for (DeviceId x : devices) devs.push_back(x.to_string());
  return "R" + std::to_string(r) + " V" + std::to_string(v) + " D[" + join(ds, ",") + "] @ [" +
         join(devs, ",") + "]";
}

Result<Layout> layout_of(const std::vector<std::pair<DeviceId, graph::SubTensor>>& pieces,
                         const Shape& shape) {
  auto fail = [](const std::string& why) {
    return Error::at("layout", "pieces do not form an RVD layout: " + why);
  };
  if (pieces.empty()) return fail("no pieces");
  Layout l;
  l.v = pieces[0].second.value_chunks;
  l.d.assign(shape.size(), 1);
  for (size_t k = 0; k < shape.size(); ++k) {
    const int64_t part = pieces[0].second.ranges[k].size();
    if (part <= 0 || shape[k] % part != 0)
      return fail("a part does not divide dimension " + std::to_string(k));
    l.d[k] = shape[k] / part;
  }
  int64_t cells = l.v;
  for (int64_t x : l.d) cells *= x;
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (n % cells != 0)
    return fail(std::to_string(n) + " devices cannot hold " + std::to_string(cells) +
                " distinct pieces evenly");
  l.r = n / cells;
  l.devices.assign(static_cast<size_t>(n), DeviceId());
  std::map<std::vector<int64_t>, int64_t> replicas;  // (v, d...) -> replicas seen
  for (const auto& [dev, s] : pieces) {
    if (s.value_chunks != l.v) return fail("mixed value chunk counts");
    std::vector<int64_t> c{0, s.value_chunk};
    for (size_t k = 0; k < shape.size(); ++k) {
      const int64_t part = shape[k] / l.d[k];
      if (s.ranges[k].size() != part || s.ranges[k].start % part != 0)
        return fail("unequal or unaligned parts of dimension " + std::to_string(k));
      c.push_back(s.ranges[k].start / part);
    }
    std::vector<int64_t> key(c.begin() + 1, c.end());
    c[0] = replicas[key]++;
    if (c[0] >= l.r) return fail("a piece is held more often than the others");
    int64_t pos = l.position_of(c);
    if (l.devices[static_cast<size_t>(pos)].valid())
      return fail("a device position is taken twice");
    l.devices[static_cast<size_t>(pos)] = dev;
  }
  LOOM_TRY(l.validate(&shape));
  return l;
}

}  // namespace loom::lower
