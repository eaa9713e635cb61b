//! How a scalar is typed: as serde-saphyr types it wherever it accepts it,
//! and an error wherever the two could differ.
//!
//! serde-saphyr resolves an untyped plain scalar by YAML's rules: `80` is a
//! number, `yes` and `True` booleans, `0x10` sixteen, `.inf` refused. A
//! typed field is looser: a `String` takes `80` as text, an `i32` takes
//! `'80'`. This accepts the plainest forms only (decimal integers, `true`,
//! `false`, the null spellings, and text that cannot look like anything
//! else) and returns an error for the rest, which sends the file to the full
//! parser. The error is never shown: the full parser reports whatever it
//! finds.
use serde::de::{Deserializer, Visitor};

use super::{GiveUp, Scalar, give_up};

/// A deserializer of one scalar.
pub(super) struct ScalarDe<'s, 'a>(pub &'s Scalar<'a>);

/// A plain scalar's type, where only one reading is possible.
pub(super) enum Plain {
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Text,
}

/// How YAML (1.1 or 1.2; serde-saphyr takes both) reads a plain scalar, or
/// `None` where the readings differ or the form is rare enough to leave to
/// the full parser: floats, other bases, `_` separators, `+`, leading
/// zeros, the other boolean spellings.
pub(super) fn resolve(text: &str) -> Option<Plain> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Plain::Null),
        "true" => return Some(Plain::Bool(true)),
        "false" => return Some(Plain::Bool(false)),
        _ => {}
    }
    let digits = text.strip_prefix('-').unwrap_or(text);
    let first = text.as_bytes()[0];
    if first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.') {
        let decimal = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if !decimal || text == "-0" {
            // `-foo` is text, but `-.5`, `-0x1` and `-` are not simple.
            return (first == b'-'
                && digits
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic()))
            .then_some(Plain::Text)
            .filter(|_| !is_bool_like(digits));
        }
        return if first == b'-' {
            text.parse().ok().map(Plain::Signed)
        } else {
            text.parse().ok().map(Plain::Unsigned)
        };
    }
    if is_bool_like(text) || text.eq_ignore_ascii_case("null") {
        return None;
    }
    Some(Plain::Text)
}

/// Whether YAML may read `text` as an infinite or NaN float: `.inf`,
/// `-.NaN`, `1e999`, and what only a YAML float parser might take (`_`).
pub(super) fn may_be_non_finite(text: &str) -> bool {
    if resolve(text).is_some() {
        return false;
    }
    text.trim_start_matches(['-', '+']).starts_with('.')
        || text.contains('_')
        || text.parse::<f64>().is_ok_and(|f| !f.is_finite())
}

/// YAML 1.1's booleans, other than `true` and `false` themselves.
fn is_bool_like(text: &str) -> bool {
    ["y", "yes", "n", "no", "on", "off", "true", "false"]
        .iter()
        .any(|b| text.eq_ignore_ascii_case(b))
}

impl<'a> ScalarDe<'_, 'a> {
    /// A plain decimal integer.
    fn integer(&self) -> Result<Plain, GiveUp> {
        let s = self.0;
        match s.plain.then(|| resolve(&s.text)).flatten() {
            Some(p @ (Plain::Signed(_) | Plain::Unsigned(_))) => Ok(p),
            _ => give_up("not a plain decimal integer"),
        }
    }

    fn visit_int<V: Visitor<'a>>(&self, v: V) -> Result<V::Value, GiveUp> {
        match self.integer()? {
            Plain::Signed(i) => v.visit_i64(i),
            Plain::Unsigned(u) => v.visit_u64(u),
            _ => unreachable!("integer() returns integers"),
        }
    }

    fn visit_text<V: Visitor<'a>>(&self, v: V) -> Result<V::Value, GiveUp> {
        match &self.0.text {
            std::borrow::Cow::Borrowed(b) => v.visit_borrowed_str(b),
            std::borrow::Cow::Owned(o) => v.visit_str(o),
        }
    }
}

impl<'a> Deserializer<'a> for ScalarDe<'_, 'a> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        let s = self.0;
        if !s.plain {
            return self.visit_text(v);
        }
        match resolve(&s.text) {
            Some(Plain::Null) => v.visit_unit(),
            Some(Plain::Bool(b)) => v.visit_bool(b),
            Some(Plain::Unsigned(u)) => v.visit_u64(u),
            Some(Plain::Signed(i)) => v.visit_i64(i),
            Some(Plain::Text) => self.visit_text(v),
            None => give_up("a plain scalar YAML may read as another type"),
        }
    }

    fn deserialize_option<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        if self.0.is_null() {
            v.visit_none()
        } else {
            v.visit_some(self)
        }
    }

    fn deserialize_str<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        let s = self.0;
        if s.is_null() || (s.plain && s.text.eq_ignore_ascii_case("null")) {
            return give_up("null where text is expected");
        }
        self.visit_text(v)
    }

    fn deserialize_string<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.deserialize_str(v)
    }

    fn deserialize_identifier<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.deserialize_str(v)
    }

    fn deserialize_bool<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        match (self.0.plain, &*self.0.text) {
            (true, "true") => v.visit_bool(true),
            (true, "false") => v.visit_bool(false),
            _ => give_up("not a plain true or false"),
        }
    }

    fn deserialize_i8<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_i16<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_i32<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_i64<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_u8<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_u16<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_u32<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }
    fn deserialize_u64<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.visit_int(v)
    }

    fn deserialize_unit<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        if self.0.is_null() {
            v.visit_unit()
        } else {
            give_up("not null")
        }
    }

    fn deserialize_unit_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, GiveUp> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, GiveUp> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("not a sequence")
    }

    fn deserialize_tuple<V: Visitor<'a>>(self, _len: usize, v: V) -> Result<V::Value, GiveUp> {
        self.deserialize_seq(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _len: usize,
        v: V,
    ) -> Result<V::Value, GiveUp> {
        self.deserialize_seq(v)
    }

    fn deserialize_map<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("not a mapping")
    }

    fn deserialize_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, GiveUp> {
        self.deserialize_map(v)
    }

    /// Not typed, but checked: serde-saphyr refuses an ignored field's
    /// non-finite float (`.inf`, `1e999`), so this leaves those to it.
    fn deserialize_ignored_any<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        if self.0.plain && may_be_non_finite(&self.0.text) {
            return give_up("a plain scalar YAML may read as a non-finite float");
        }
        v.visit_unit()
    }

    // Nothing the manifests hold is read as these; the full parser decides.
    fn deserialize_f32<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("a float")
    }
    fn deserialize_f64<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("a float")
    }
    fn deserialize_char<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("a char")
    }
    fn deserialize_bytes<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("bytes")
    }
    fn deserialize_byte_buf<V: Visitor<'a>>(self, _v: V) -> Result<V::Value, GiveUp> {
        give_up("bytes")
    }
    fn deserialize_enum<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _v: V,
    ) -> Result<V::Value, GiveUp> {
        give_up("an enum")
    }
}
