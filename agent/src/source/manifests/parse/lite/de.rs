//! serde straight over the text: each node is opened where the type being
//! read asks for it, its scalars typed by [`super::scalar`], its collections
//! read entry by entry as serde pulls them.
//!
//! The checks are the tree's that came before: every mapping refuses a
//! duplicate key (serde would let a later one win), ignored values are read
//! and checked like the others, and a collection must be read to its end.
use std::{borrow::Cow, collections::HashSet};

use serde::de::{
    DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer as _, MapAccess, SeqAccess, Visitor,
};

use super::{
    GiveUp, Line, Reader, Scalar,
    scalar::{Plain, ScalarDe, resolve},
};

type Result<T> = std::result::Result<T, GiveUp>;

/// Where a node starts, at the reader's position.
#[derive(Clone, Copy)]
pub(super) enum At {
    /// A block node in this column.
    Block(usize),
    /// A mapping's value on its key's line: a scalar or a flow collection,
    /// then the line's end.
    Inline,
    /// Nothing after `key:` or `-`, and nothing nested below: null.
    Null,
    /// An item, key or value in a flow collection.
    Flow,
}

/// Opens the node at `at`: a scalar is read whole, a collection up to its
/// first entry.
pub(super) fn open<'r, 'a>(r: &'r mut Reader<'a>, at: At) -> Result<Opened<'r, 'a>> {
    let depth = r.depth;
    match at {
        At::Null => Ok(Opened::Scalar(Scalar::plain(""))),
        At::Block(col) => {
            r.enter()?;
            if r.peek() == Some(b'-') && r.blank_at(r.pos + 1) {
                let close = Close {
                    depth,
                    end_line: false,
                };
                return Ok(Opened::Seq(Seq::new(r, Kind::Block(col), close)));
            }
            if let Some(key) = r.key()? {
                let close = Close {
                    depth,
                    end_line: false,
                };
                let mut map = Map::new(r, Kind::Block(col), close);
                map.next = Some(key);
                return Ok(Opened::Map(map));
            }
            inline(r, depth)
        }
        At::Inline => inline(r, depth),
        At::Flow => {
            r.skip_spaces();
            let close = Close {
                depth,
                end_line: false,
            };
            flow(r, close)
        }
    }
}

/// A value on the rest of a block line.
fn inline<'r, 'a>(r: &'r mut Reader<'a>, depth: u32) -> Result<Opened<'r, 'a>> {
    if matches!(r.peek(), Some(b'[' | b'{')) {
        let close = Close {
            depth,
            end_line: true,
        };
        return flow(r, close);
    }
    let s = r.inline_scalar()?;
    r.end_line()?;
    r.depth = depth;
    Ok(Opened::Scalar(s))
}

/// A flow node at `pos`.
fn flow<'r, 'a>(r: &'r mut Reader<'a>, close: Close) -> Result<Opened<'r, 'a>> {
    match r.peek() {
        Some(b'[') => {
            r.enter()?;
            r.pos += 1;
            Ok(Opened::Seq(Seq::new(r, Kind::Flow, close)))
        }
        Some(b'{') => {
            r.enter()?;
            r.pos += 1;
            Ok(Opened::Map(Map::new(r, Kind::Flow, close)))
        }
        _ => Ok(Opened::Scalar(r.flow_scalar()?)),
    }
}

/// After `key:` or `-` with nothing more on the line: the block on the next
/// lines that belongs to it, or null. A sequence may sit in the key's own
/// column (`same_col_seq`), as `kubectl` writes them.
fn nested(r: &mut Reader<'_>, col: usize, same_col_seq: bool) -> Result<At> {
    if let Line::Content { indent, at } = r.next_line()? {
        let dash = r.b[at] == b'-' && r.blank_at(at + 1);
        if indent > col || (same_col_seq && indent == col && dash) {
            r.pos = at;
            return Ok(At::Block(indent));
        }
    }
    Ok(At::Null)
}

#[derive(Clone, Copy)]
enum Kind {
    /// In this column.
    Block(usize),
    Flow,
}

/// What closing a collection restores: the nesting depth before it, and
/// the end of its line when it was a flow collection in block context.
#[derive(Clone, Copy)]
struct Close {
    depth: u32,
    end_line: bool,
}

/// A node, opened.
pub(super) enum Opened<'r, 'a> {
    Scalar(Scalar<'a>),
    Seq(Seq<'r, 'a>),
    Map(Map<'r, 'a>),
}

impl<'a> Opened<'_, 'a> {
    fn scalar(self) -> Result<Scalar<'a>> {
        match self {
            Self::Scalar(s) => Ok(s),
            _ => super::give_up("a collection where a scalar is expected"),
        }
    }
}

pub(super) struct Seq<'r, 'a> {
    r: &'r mut Reader<'a>,
    kind: Kind,
    close: Close,
    done: bool,
}

impl<'r, 'a> Seq<'r, 'a> {
    fn new(r: &'r mut Reader<'a>, kind: Kind, close: Close) -> Self {
        Self {
            r,
            kind,
            close,
            done: false,
        }
    }

    fn visit<V: Visitor<'a>>(mut self, v: V) -> Result<V::Value> {
        let value = v.visit_seq(&mut self)?;
        finish(self.r, self.done, self.close)?;
        Ok(value)
    }
}

/// Checks that a collection was read to its end, and leaves it.
fn finish(r: &mut Reader<'_>, done: bool, close: Close) -> Result<()> {
    if !done {
        return super::give_up("a collection not read to its end");
    }
    r.depth = close.depth;
    if close.end_line {
        r.end_line()?;
    }
    Ok(())
}

impl<'a> SeqAccess<'a> for Seq<'_, 'a> {
    type Error = GiveUp;

    fn next_element_seed<T: DeserializeSeed<'a>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.done {
            return Ok(None);
        }
        let r = &mut *self.r;
        match self.kind {
            Kind::Block(col) => {
                // At the `-`.
                r.pos += 1;
                let spaces = r.skip_spaces();
                let at = if matches!(r.peek(), None | Some(b'\n' | b'#')) {
                    r.end_line()?;
                    nested(r, col, false)?
                } else {
                    At::Block(col + 1 + spaces)
                };
                let item = seed.deserialize(open(r, at)?)?;
                match r.next_line()? {
                    Line::Content { indent, at }
                        if indent == col && r.b[at] == b'-' && r.blank_at(at + 1) =>
                    {
                        r.pos = at;
                    }
                    Line::Content { indent, .. } if indent > col => {
                        return Err(r.unsupported("a line indented into a sequence item").into());
                    }
                    _ => self.done = true,
                }
                Ok(Some(item))
            }
            Kind::Flow => {
                if r.flow_close(b']')? {
                    self.done = true;
                    return Ok(None);
                }
                let item = seed.deserialize(open(r, At::Flow)?)?;
                r.skip_spaces();
                if r.peek() == Some(b':') {
                    return Err(r.unsupported("a mapping inside a flow sequence").into());
                }
                r.flow_comma(b']')?;
                Ok(Some(item))
            }
        }
    }
}

/// Up to this many keys a mapping's keys are compared one by one.
const FEW_KEYS: usize = 16;

/// A mapping being read. Small: the node being read is moved by value at
/// every level, so its keys are not kept in it (see [`Reader::keys`]).
pub(super) struct Map<'r, 'a> {
    r: &'r mut Reader<'a>,
    kind: Kind,
    close: Close,
    done: bool,
    /// A block mapping's next key, read while the last value was closed.
    next: Option<Scalar<'a>>,
    /// A key was handed out, and its value is due.
    value_due: bool,
    /// Where this mapping's keys start in the reader's stack of keys.
    keys_from: usize,
    /// Past `FEW_KEYS`: a mapping of thousands of keys must not cost their
    /// square.
    many: Option<HashSet<Cow<'a, str>>>,
}

impl<'r, 'a> Map<'r, 'a> {
    fn new(r: &'r mut Reader<'a>, kind: Kind, close: Close) -> Self {
        let keys_from = r.keys.len();
        Self {
            r,
            kind,
            close,
            done: false,
            next: None,
            value_due: false,
            keys_from,
            many: None,
        }
    }

    fn visit<V: Visitor<'a>>(mut self, v: V) -> Result<V::Value> {
        let value = v.visit_map(&mut self)?;
        self.leave()?;
        Ok(value)
    }

    fn leave(self) -> Result<()> {
        self.r.keys.truncate(self.keys_from);
        finish(self.r, self.done, self.close)
    }

    /// The next key as written, its value due; `None` at the end. The full
    /// parser refuses a mapping with a key twice; so does this, by leaving
    /// it to that parser.
    fn next_raw_key(&mut self) -> Result<Option<Scalar<'a>>> {
        if self.done {
            return Ok(None);
        }
        if self.value_due {
            return super::give_up("a key before the last one's value");
        }
        let key = match self.kind {
            Kind::Block(_) => self
                .next
                .take()
                .expect("an open block mapping has its next key"),
            Kind::Flow => {
                let r = &mut *self.r;
                // `flow_close` has skipped the spaces before the key.
                if r.flow_close(b'}')? {
                    self.done = true;
                    return Ok(None);
                }
                if matches!(r.peek(), Some(b'[' | b'{')) {
                    return Err(r.unsupported("a collection as a key").into());
                }
                let key = r.flow_scalar()?;
                r.skip_spaces();
                if r.peek() != Some(b':') {
                    return Err(r.unsupported("a flow mapping key without a value").into());
                }
                r.pos += 1;
                // `{"a":1}` is JSON and YAML; `{a:1}` is the key `a:1`,
                // which the scalar above has already taken whole. After a
                // plain key the value must be set apart by a space: in
                // `{a :[b]}` YAML 1.2 reads `:` as an empty value and the
                // `[b]` after it as an error (rule 147).
                if key.plain && !r.blank_at(r.pos) {
                    return Err(r
                        .unsupported("a value against the `:` of a plain key")
                        .into());
                }
                r.skip_spaces();
                if matches!(r.peek(), Some(b',' | b'}')) {
                    return Err(r.unsupported("a flow mapping key without a value").into());
                }
                key
            }
        };
        if !self.remember(&key) {
            return Err(self.r.unsupported("a duplicate key").into());
        }
        self.value_due = true;
        Ok(Some(key))
    }

    /// Records a key; false if the mapping had it already.
    fn remember(&mut self, key: &Scalar<'a>) -> bool {
        let key = &key.text;
        if let Some(many) = &mut self.many {
            return many.insert(key.clone());
        }
        let keys = &mut self.r.keys;
        if keys[self.keys_from..].iter().any(|k| k == key) {
            return false;
        }
        keys.push(key.clone());
        if keys.len() - self.keys_from > FEW_KEYS {
            self.many = Some(keys.drain(self.keys_from..).collect());
        }
        true
    }

    /// The value of the key just handed out.
    fn value<T: DeserializeSeed<'a>>(&mut self, seed: T) -> Result<T::Value> {
        if !std::mem::replace(&mut self.value_due, false) {
            return super::give_up("a value before its key");
        }
        let r = &mut *self.r;
        match self.kind {
            Kind::Block(col) => {
                // Past the `:`.
                r.skip_spaces();
                let at = if matches!(r.peek(), None | Some(b'\n' | b'#')) {
                    r.end_line()?;
                    nested(r, col, true)?
                } else {
                    At::Inline
                };
                let value = seed.deserialize(open(r, at)?)?;
                match r.next_line()? {
                    Line::Content { indent, at } if indent == col => {
                        r.pos = at;
                        let key = r
                            .key()?
                            .ok_or_else(|| r.unsupported("a line in a mapping that is no key"))?;
                        self.next = Some(key);
                    }
                    Line::Content { indent, .. } if indent > col => {
                        return Err(r.unsupported("a line indented into a mapping value").into());
                    }
                    _ => self.done = true,
                }
                Ok(value)
            }
            Kind::Flow => {
                let value = seed.deserialize(open(r, At::Flow)?)?;
                r.flow_comma(b'}')?;
                Ok(value)
            }
        }
    }
}

impl<'a> MapAccess<'a> for Map<'_, 'a> {
    type Error = GiveUp;

    fn next_key_seed<K: DeserializeSeed<'a>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        let Some(key) = self.next_raw_key()? else {
            return Ok(None);
        };
        // Keys are text to every type read here; a typed key (`80: x`) is
        // left to the full parser.
        if key.plain && !matches!(resolve(&key.text), Some(Plain::Text)) {
            return super::give_up("a key YAML may read as another type");
        }
        let text: &str = &key.text;
        seed.deserialize(text.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value> {
        self.value(seed)
    }
}

impl<'a> Opened<'_, 'a> {
    fn visit_seq<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        match self {
            Self::Seq(s) => s.visit(v),
            _ => super::give_up("not a sequence"),
        }
    }

    fn visit_map<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        match self {
            Self::Map(m) => m.visit(v),
            _ => super::give_up("not a mapping"),
        }
    }
}

impl<'a> Deserializer<'a> for Opened<'_, 'a> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        match self {
            Self::Scalar(s) => ScalarDe(&s).deserialize_any(v),
            Self::Seq(s) => s.visit(v),
            Self::Map(m) => m.visit(v),
        }
    }

    fn deserialize_option<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        match self {
            Self::Scalar(s) if s.is_null() => v.visit_none(),
            other => v.visit_some(other),
        }
    }

    fn deserialize_str<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_str(v)
    }
    fn deserialize_string<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_string(v)
    }
    fn deserialize_identifier<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_identifier(v)
    }
    fn deserialize_bool<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_bool(v)
    }
    fn deserialize_i8<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_i8(v)
    }
    fn deserialize_i16<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_i16(v)
    }
    fn deserialize_i32<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_i32(v)
    }
    fn deserialize_i64<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_i64(v)
    }
    fn deserialize_u8<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_u8(v)
    }
    fn deserialize_u16<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_u16(v)
    }
    fn deserialize_u32<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_u32(v)
    }
    fn deserialize_u64<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_u64(v)
    }
    fn deserialize_f32<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_f32(v)
    }
    fn deserialize_f64<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_f64(v)
    }
    fn deserialize_char<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_char(v)
    }
    fn deserialize_bytes<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_bytes(v)
    }
    fn deserialize_byte_buf<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_byte_buf(v)
    }
    fn deserialize_unit<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_unit(v)
    }
    fn deserialize_unit_struct<V: Visitor<'a>>(self, name: &'static str, v: V) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_unit_struct(name, v)
    }
    fn deserialize_enum<V: Visitor<'a>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value> {
        ScalarDe(&self.scalar()?).deserialize_enum(name, variants, v)
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        self.visit_seq(v)
    }
    fn deserialize_tuple<V: Visitor<'a>>(self, _len: usize, v: V) -> Result<V::Value> {
        self.visit_seq(v)
    }
    fn deserialize_tuple_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _len: usize,
        v: V,
    ) -> Result<V::Value> {
        self.visit_seq(v)
    }

    fn deserialize_map<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        self.visit_map(v)
    }
    fn deserialize_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value> {
        self.visit_map(v)
    }

    /// Read and checked all the same (see [`ScalarDe`]); keys need not be
    /// text here, as nothing reads them.
    fn deserialize_ignored_any<V: Visitor<'a>>(self, v: V) -> Result<V::Value> {
        match self {
            Self::Scalar(s) => ScalarDe(&s).deserialize_ignored_any(v),
            Self::Seq(mut s) => {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                finish(s.r, s.done, s.close)?;
                v.visit_unit()
            }
            Self::Map(mut m) => {
                while m.next_raw_key()?.is_some() {
                    m.value(std::marker::PhantomData::<IgnoredAny>)?;
                }
                m.leave()?;
                v.visit_unit()
            }
        }
    }
}
