#include "llm/unicode.hpp"

#include <algorithm>
#include <array>
#include <iterator>

namespace rlx::llm::unicode {
namespace {

#include "llm/unicode_data.inc"

constexpr std::uint32_t kMaxCodepoint = 0x10FFFF;

bool white_space(std::uint32_t c) {
  // Unicode's White_Space property (PropList.txt), the set llama.cpp's unicode_set_whitespace holds.
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::uint16_t lookup(std::uint32_t cpt) {
  const auto* end = std::end(kCategoryRanges);
  // The last range starting at or before cpt.
  const auto* it = std::upper_bound(std::begin(kCategoryRanges), end, (cpt << 8) | 0xFFu);
  const auto category = static_cast<std::uint16_t>(*(it - 1) & 0xFFu);
  return white_space(cpt) ? static_cast<std::uint16_t>(category | kWhitespace) : category;
}

const std::array<std::uint16_t, 128>& ascii_flags() {
  static const auto table = [] {
    std::array<std::uint16_t, 128> t{};
    for (std::uint32_t c = 0; c < 128; ++c) t[c] = lookup(c);
    return t;
  }();
  return table;
}

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<std::int16_t, 324> to_byte{};  // indexed by code point; the image lies below U+0144
};

const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.to_byte.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = 0x21; b <= 0x7E; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    std::uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const std::uint32_t cpt = direct[b] ? static_cast<std::uint32_t>(b) : next++;
      append_utf8(m.to_unicode[b], cpt);
      m.to_byte[cpt] = static_cast<std::int16_t>(b);
    }
    return m;
  }();
  return map;
}

}  // namespace

std::uint16_t flags(std::uint32_t cpt) {
  if (cpt < 128) return ascii_flags()[cpt];
  if (cpt > kMaxCodepoint) return 0;
  return lookup(cpt);
}

std::size_t utf8_sequence_length(unsigned char lead) {
  static constexpr std::array<std::size_t, 16> kLength = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLength[lead >> 4];
}

std::vector<std::uint32_t> decode_utf8(std::string_view text) {
  std::vector<std::uint32_t> out;
  out.reserve(text.size());
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto cont = [&](std::size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
    } else if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
      out.push_back(((b & 0x1Fu) << 6) | (byte(i + 1) & 0x3Fu));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      out.push_back(((b & 0x0Fu) << 12) | ((byte(i + 1) & 0x3Fu) << 6) | (byte(i + 2) & 0x3Fu));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const std::uint32_t c =
          ((b & 0x07u) << 18) | ((byte(i + 1) & 0x3Fu) << 12) | ((byte(i + 2) & 0x3Fu) << 6) | (byte(i + 3) & 0x3Fu);
      out.push_back(c <= kMaxCodepoint ? c : kReplacement);
      i += 4;
    } else {
      out.push_back(kReplacement);
      ++i;
    }
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cpt) {
  if (cpt > kMaxCodepoint) cpt = kReplacement;
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

const std::string& byte_to_unicode(std::uint8_t byte) { return byte_map().to_unicode[byte]; }

int unicode_to_byte(std::uint32_t cpt) {
  const auto& m = byte_map();
  return cpt < m.to_byte.size() ? m.to_byte[cpt] : -1;
}

}  // namespace rlx::llm::unicode
