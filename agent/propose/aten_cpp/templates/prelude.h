// A Python number passed where an op takes a tensor: the wrapped-number tensor Python's op call makes of it.
template <typename T>
static at::Tensor kb_wrapped_as(T value, at::ScalarType type) {
  at::Tensor t(at::detail::empty_cpu(at::IntArrayRef(), type, false, std::nullopt));
  *static_cast<T*>(t.data_ptr()) = value;
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}
static at::Tensor kb_wrapped(double v) { return kb_wrapped_as<double>(v, at::ScalarType::Double); }
static at::Tensor kb_wrapped(int64_t v) { return kb_wrapped_as<int64_t>(v, at::ScalarType::Long); }
static at::Tensor kb_wrapped(bool v) { return kb_wrapped_as<bool>(v, at::ScalarType::Bool); }

static c10::List<::std::optional<at::Tensor>> kb_optional_tensors(
    std::initializer_list<::std::optional<at::Tensor>> items) {
  c10::List<::std::optional<at::Tensor>> list;
  list.reserve(items.size());
  for (const auto& item : items) list.push_back(item);
  return list;
}

// Python's // and % on ints (floor semantics)
static int64_t kb_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static int64_t kb_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}
