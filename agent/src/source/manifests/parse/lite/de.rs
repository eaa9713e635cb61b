//! serde over the lite reader's tree, typing scalars as serde-saphyr does
//! wherever it accepts them, and giving up wherever the two could differ.
//!
//! serde-saphyr resolves an untyped plain scalar by YAML's rules: `80` is a
//! number, `yes` and `True` booleans, `0x10` sixteen, `.inf` refused. A
//! typed field is looser: a `String` takes `80` as text, an `i32` takes
//! `'80'`. This accepts the plainest forms only (decimal integers, `true`,
//! `false`, the null spellings, and text that cannot look like anything
//! else) and returns an error for the rest, which sends the file to the full
//! parser. The error is never shown: the full parser reports whatever it
//! finds.
use std::fmt;

use serde::{
    Deserialize as _,
    de::{
        self, DeserializeSeed, Deserializer, IntoDeserializer as _, MapAccess, SeqAccess, Visitor,
    },
};

use super::{Node, Scalar};

#[derive(Debug)]
pub(in super::super) struct GiveUp(pub String);

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GiveUp {}

impl de::Error for GiveUp {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

fn give_up<T>(why: &str) -> Result<T, GiveUp> {
    Err(GiveUp(why.to_owned()))
}

/// A deserializer of one node of the tree.
pub(in super::super) struct De<'n, 'a>(pub &'n Node<'a>);

/// A plain scalar's type, where only one reading is possible.
enum Plain {
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
fn resolve(text: &str) -> Option<Plain> {
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
fn may_be_non_finite(text: &str) -> bool {
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

impl<'n, 'a> De<'n, 'a> {
    fn scalar(&self) -> Result<&'n Scalar<'a>, GiveUp> {
        match self.0 {
            Node::Scalar(s) => Ok(s),
            _ => give_up("a collection where a scalar is expected"),
        }
    }

    /// A plain decimal integer.
    fn integer(&self) -> Result<Plain, GiveUp> {
        let s = self.scalar()?;
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

    fn visit_text<V: Visitor<'a>>(s: &'n Scalar<'a>, v: V) -> Result<V::Value, GiveUp> {
        match &s.text {
            std::borrow::Cow::Borrowed(b) => v.visit_borrowed_str(b),
            std::borrow::Cow::Owned(o) => v.visit_str(o),
        }
    }
}

impl<'n, 'a> Deserializer<'a> for De<'n, 'a> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        match self.0 {
            Node::Map(entries) => v.visit_map(Entries {
                entries: entries.iter(),
                value: None,
            }),
            Node::Seq(items) => v.visit_seq(Items(items.iter())),
            Node::Scalar(s) if !s.plain => Self::visit_text(s, v),
            Node::Scalar(s) => match resolve(&s.text) {
                Some(Plain::Null) => v.visit_unit(),
                Some(Plain::Bool(b)) => v.visit_bool(b),
                Some(Plain::Unsigned(u)) => v.visit_u64(u),
                Some(Plain::Signed(i)) => v.visit_i64(i),
                Some(Plain::Text) => Self::visit_text(s, v),
                None => give_up("a plain scalar YAML may read as another type"),
            },
        }
    }

    fn deserialize_option<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        match self.0 {
            Node::Scalar(s) if s.is_null() => v.visit_none(),
            _ => v.visit_some(self),
        }
    }

    fn deserialize_str<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        let s = self.scalar()?;
        if s.is_null() || (s.plain && s.text.eq_ignore_ascii_case("null")) {
            return give_up("null where text is expected");
        }
        Self::visit_text(s, v)
    }

    fn deserialize_string<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.deserialize_str(v)
    }

    fn deserialize_identifier<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        self.deserialize_str(v)
    }

    fn deserialize_bool<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        let s = self.scalar()?;
        match (s.plain, &*s.text) {
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
        match self.0 {
            Node::Scalar(s) if s.is_null() => v.visit_unit(),
            _ => give_up("not null"),
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

    fn deserialize_seq<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        match self.0 {
            Node::Seq(items) => v.visit_seq(Items(items.iter())),
            _ => give_up("not a sequence"),
        }
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

    fn deserialize_map<V: Visitor<'a>>(self, v: V) -> Result<V::Value, GiveUp> {
        match self.0 {
            Node::Map(entries) => v.visit_map(Entries {
                entries: entries.iter(),
                value: None,
            }),
            _ => give_up("not a mapping"),
        }
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
        match self.0 {
            Node::Scalar(s) if s.plain && may_be_non_finite(&s.text) => {
                give_up("a plain scalar YAML may read as a non-finite float")
            }
            Node::Scalar(_) => v.visit_unit(),
            Node::Seq(items) => {
                for item in items {
                    de::IgnoredAny::deserialize(De(item))?;
                }
                v.visit_unit()
            }
            Node::Map(entries) => {
                for (_, value) in entries {
                    de::IgnoredAny::deserialize(De(value))?;
                }
                v.visit_unit()
            }
        }
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

struct Items<'n, 'a>(std::slice::Iter<'n, Node<'a>>);

impl<'n, 'a> SeqAccess<'a> for Items<'n, 'a> {
    type Error = GiveUp;

    fn next_element_seed<T: DeserializeSeed<'a>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, GiveUp> {
        self.0.next().map(|n| seed.deserialize(De(n))).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'n, 'a> {
    entries: std::slice::Iter<'n, (Scalar<'a>, Node<'a>)>,
    value: Option<&'n Node<'a>>,
}

impl<'n, 'a> MapAccess<'a> for Entries<'n, 'a> {
    type Error = GiveUp;

    fn next_key_seed<K: DeserializeSeed<'a>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, GiveUp> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        // Keys are text to every type read here; a typed key (`80: x`)
        // is left to the full parser.
        if key.plain && !matches!(resolve(&key.text), Some(Plain::Text)) {
            return give_up("a key YAML may read as another type");
        }
        let text: &str = &key.text;
        seed.deserialize(text.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value, GiveUp> {
        let value = self
            .value
            .take()
            .ok_or_else(|| GiveUp("a value before its key".to_owned()))?;
        seed.deserialize(De(value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
