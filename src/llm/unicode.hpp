#pragma once
// Unicode helpers for the tokenizer (internal to src/llm): code point categories from a generated table
// (unicode_data.inc, scripts/gen_unicode_data.py), UTF-8 decoding with llama.cpp's rules for invalid input, and
// GPT-2's byte-to-unicode mapping.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rlx::llm::unicode {

// Category flags, the same bits as llama.cpp's unicode_cpt_flags (one category per code point, plus
// kWhitespace). flags() is 0 only for values past U+10FFFF ("no code point", as at the end of a span).
enum Flag : std::uint16_t {
  kUndefined = 0x0001,    // Cn: unassigned
  kNumber = 0x0002,       // \p{N}
  kLetter = 0x0004,       // \p{L}
  kSeparator = 0x0008,    // \p{Z}
  kMark = 0x0010,         // \p{M}
  kPunctuation = 0x0020,  // \p{P}
  kSymbol = 0x0040,       // \p{S}
  kControl = 0x0080,      // \p{C} (Cc, Cf, Co, Cs)
  kWhitespace = 0x0100,   // \s: Unicode's White_Space property
};

std::uint16_t flags(std::uint32_t cpt);
inline bool is_letter(std::uint32_t cpt) { return (flags(cpt) & kLetter) != 0; }
inline bool is_number(std::uint32_t cpt) { return (flags(cpt) & kNumber) != 0; }
inline bool is_whitespace(std::uint32_t cpt) { return (flags(cpt) & kWhitespace) != 0; }

inline constexpr std::uint32_t kReplacement = 0xFFFD;

// The code points of a UTF-8 string. An invalid or truncated sequence gives U+FFFD and skips one byte, as
// llama.cpp's unicode_cpts_from_utf8 does (so both tokenize malformed text alike).
std::vector<std::uint32_t> decode_utf8(std::string_view text);
// Appends the UTF-8 form of a code point (U+FFFD for a value past U+10FFFF).
void append_utf8(std::string& out, std::uint32_t cpt);
// The length of the UTF-8 sequence a lead byte starts (1 for a continuation or invalid byte), as llama.cpp's
// unicode_len_utf8.
std::size_t utf8_sequence_length(unsigned char lead);

// GPT-2's reversible byte-to-unicode mapping: printable bytes map to themselves, the other 68 to U+0100...
// byte_to_unicode(b) is the UTF-8 of b's code point.
const std::string& byte_to_unicode(std::uint8_t byte);
// The byte a code point stands for, or -1 when it is not in the mapping's image.
int unicode_to_byte(std::uint32_t cpt);

}  // namespace rlx::llm::unicode
