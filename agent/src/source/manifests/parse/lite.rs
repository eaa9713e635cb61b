//! A reader for the YAML that tools write, fifteen times faster than the
//! full parser.
//!
//! At 100k Services the manifests mode spent most of its cold start in the
//! YAML parser: serde-saphyr reads about 7 MB/s here, and the bench's
//! 100k files hold 260 MB. `kubectl get -o yaml`, `helm template` and
//! hand-written manifests use a small part of YAML: block mappings and
//! sequences, one-line flow collections, and one-line scalars. This reads
//! exactly that part into a tree of borrowed text, and [`de`] hands the tree
//! to serde.
//!
//! It is a filter, never a second opinion: anything outside that part
//! (anchors, tags, block scalars, multi-line scalars, explicit keys, tabs,
//! non-ASCII text, `\r`, directives, duplicate keys, any plain scalar whose
//! type YAML resolves in more than one way) returns [`Unsupported`], and the
//! caller parses the file with serde-saphyr as before. So the full parser
//! still decides every file this cannot read, with its budgets against
//! alias bombs and its error messages; and where this reads a file, it must
//! read what the full parser reads. The tests and the `manifest_yaml` fuzz
//! target hold it to that.
pub(super) mod de;

use std::borrow::Cow;

/// Nesting beyond this goes to the full parser, which has its own budget;
/// the recursion here stays far from the stack's end.
const MAX_DEPTH: u32 = 64;

#[derive(Debug, PartialEq)]
pub(super) enum Node<'a> {
    Scalar(Scalar<'a>),
    Map(Vec<(Scalar<'a>, Node<'a>)>),
    Seq(Vec<Node<'a>>),
}

#[derive(Debug, PartialEq)]
pub(super) struct Scalar<'a> {
    pub text: Cow<'a, str>,
    /// Unquoted: its type is resolved from its text (`80` is a number).
    pub plain: bool,
}

impl<'a> Scalar<'a> {
    const fn plain(text: &'a str) -> Self {
        Self {
            text: Cow::Borrowed(text),
            plain: true,
        }
    }

    /// What YAML reads as null: an empty value, `~` or `null`.
    pub fn is_null(&self) -> bool {
        self.plain && matches!(&*self.text, "" | "~" | "null" | "Null" | "NULL")
    }
}

/// The text uses YAML this reader leaves to the full parser; `at` is a byte
/// offset, for tests.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unsupported {
    pub what: &'static str,
    pub at: usize,
}

type Result<T> = std::result::Result<T, Unsupported>;

/// The stream's documents, without the empty ones (the full parser skips
/// those too, and numbers the rest from 0).
pub(super) fn documents(text: &str) -> Result<Vec<Node<'_>>> {
    // One pass settles what the rest need not check: printable ASCII and
    // newlines only, so every byte is a char and no tab can hide in an
    // indent.
    if let Some(at) = first_unprintable(text.as_bytes()) {
        return Err(Unsupported {
            what: "a byte other than printable ASCII or a newline",
            at,
        });
    }
    let mut r = Reader {
        s: text,
        b: text.as_bytes(),
        pos: 0,
        depth: 0,
    };
    let mut docs = Vec::new();
    let mut open = false;
    loop {
        match r.next_line()? {
            Line::End => return Ok(docs),
            Line::Start(at) => {
                r.pos = at + 3;
                r.end_line()?;
                open = true;
            }
            Line::Content { indent, at } => {
                if !open && !docs.is_empty() {
                    return Err(r.unsupported("a second node in one document"));
                }
                r.pos = at;
                docs.push(r.block_node(indent)?);
                open = false;
            }
        }
    }
}

enum Line {
    End,
    /// A `---` line at this offset.
    Start(usize),
    /// The next line with content (not blank, not only a comment).
    Content {
        indent: usize,
        at: usize,
    },
}

struct Reader<'a> {
    s: &'a str,
    b: &'a [u8],
    pos: usize,
    depth: u32,
}

/// Where a byte other than printable ASCII or `\n` is. In chunks without
/// an early exit, which the compiler vectorizes: byte by byte this pass
/// was about a seventh of the reader's time.
fn first_unprintable(b: &[u8]) -> Option<usize> {
    let bad = |c: u8| (c < 0x20 && c != b'\n') || c >= 0x7f;
    b.chunks(64).enumerate().find_map(|(k, chunk)| {
        chunk
            .iter()
            .fold(false, |any, &c| any | bad(c))
            .then(|| k * 64 + chunk.iter().position(|&c| bad(c)).unwrap_or(0))
    })
}

/// A table of the bytes in `set`, for scans that skip every other byte.
const fn table(set: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0;
    while i < set.len() {
        t[set[i] as usize] = true;
        i += 1;
    }
    t
}

/// Where a plain scalar in block context may end: a line's end, `: `, ` #`.
static BLOCK_STOP: [bool; 256] = table(b"\n:#");
/// In flow context, also at a flow indicator.
static FLOW_STOP: [bool; 256] = table(b"\n:#,[]{}");

/// Bytes that may not begin a plain scalar (`-`, `?` and `:` may, when a
/// non-space follows).
const INDICATORS: &[u8] = b"[]{},#&*!|>'\"%@`";

impl<'a> Reader<'a> {
    fn unsupported(&self, what: &'static str) -> Unsupported {
        Unsupported { what, at: self.pos }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.b.get(i).copied()
    }

    /// A space, a newline or the end of the text at `i`.
    fn blank_at(&self, i: usize) -> bool {
        matches!(self.at(i), None | Some(b' ' | b'\n'))
    }

    fn skip_spaces(&mut self) -> usize {
        let from = self.pos;
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
        self.pos - from
    }

    /// The first byte at or after `from` in `stop`, or the text's end.
    fn skip_to(&self, from: usize, stop: &[bool; 256]) -> usize {
        self.b[from..]
            .iter()
            .position(|&c| stop[usize::from(c)])
            .map_or(self.b.len(), |i| from + i)
    }

    fn line_end(&self, from: usize) -> usize {
        self.b[from..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(self.b.len(), |i| from + i)
    }

    /// From the start of a line: the next line that is not blank or a
    /// comment, without moving.
    fn next_line(&self) -> Result<Line> {
        let mut i = self.pos;
        while i < self.b.len() {
            let start = i;
            while self.at(i) == Some(b' ') {
                i += 1;
            }
            match self.at(i) {
                None => break,
                Some(b'\n') => {
                    i += 1;
                    continue;
                }
                Some(b'#') => {
                    i = self.line_end(i) + 1;
                    continue;
                }
                _ => {}
            }
            if i == start {
                let rest = &self.b[start..];
                if rest.starts_with(b"---") && self.blank_at(start + 3) {
                    return Ok(Line::Start(start));
                }
                // `...` ends a document, `%` starts a directive; `---x` is
                // a scalar few would mean.
                if rest.starts_with(b"...") || rest.starts_with(b"---") || rest[0] == b'%' {
                    return Err(Unsupported {
                        what: "a document end, directive or scalar starting with ---",
                        at: start,
                    });
                }
            }
            return Ok(Line::Content {
                indent: i - start,
                at: i,
            });
        }
        Ok(Line::End)
    }

    /// The rest of the line holds only spaces and a comment; moves past it.
    fn end_line(&mut self) -> Result<()> {
        let spaced = self.skip_spaces() > 0;
        match self.peek() {
            None => Ok(()),
            Some(b'\n') => {
                self.pos += 1;
                Ok(())
            }
            Some(b'#') if spaced || self.pos == 0 || self.b[self.pos - 1] == b'\n' => {
                self.pos = (self.line_end(self.pos) + 1).min(self.b.len());
                Ok(())
            }
            _ => Err(self.unsupported("more after a complete value")),
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.unsupported("deep nesting"));
        }
        Ok(())
    }

    /// The block node whose first byte is at `pos`, in column `col`.
    fn block_node(&mut self, col: usize) -> Result<Node<'a>> {
        self.enter()?;
        let node = if self.peek() == Some(b'-') && self.blank_at(self.pos + 1) {
            self.block_seq(col)?
        } else if let Some(key) = self.key()? {
            self.block_map(col, key)?
        } else {
            let node = self.inline_value()?;
            self.end_line()?;
            node
        };
        self.depth -= 1;
        Ok(node)
    }

    fn block_seq(&mut self, col: usize) -> Result<Node<'a>> {
        let mut items = Vec::with_capacity(4);
        loop {
            // At the `-`.
            self.pos += 1;
            let spaces = self.skip_spaces();
            let item = if matches!(self.peek(), None | Some(b'\n' | b'#')) {
                self.end_line()?;
                self.nested_or_null(col, false)?
            } else {
                self.block_node(col + 1 + spaces)?
            };
            items.push(item);
            match self.next_line()? {
                Line::Content { indent, at }
                    if indent == col && self.b[at] == b'-' && self.blank_at(at + 1) =>
                {
                    self.pos = at;
                }
                Line::Content { indent, .. } if indent > col => {
                    return Err(self.unsupported("a line indented into a sequence item"));
                }
                _ => return Ok(Node::Seq(items)),
            }
        }
    }

    /// After `key:` or `-` with nothing more on the line: the block on the
    /// next lines that belongs to it, or null. A sequence may sit in the
    /// key's own column (`same_col_seq`), as `kubectl` writes them.
    fn nested_or_null(&mut self, col: usize, same_col_seq: bool) -> Result<Node<'a>> {
        if let Line::Content { indent, at } = self.next_line()? {
            let dash = self.b[at] == b'-' && self.blank_at(at + 1);
            if indent > col || (same_col_seq && indent == col && dash) {
                self.pos = at;
                return self.block_node(indent);
            }
        }
        Ok(Node::Scalar(Scalar::plain("")))
    }

    fn block_map(&mut self, col: usize, first: Scalar<'a>) -> Result<Node<'a>> {
        // Most mappings in manifests have a handful of keys; starting there
        // saves growing from four.
        let mut entries = Vec::with_capacity(6);
        let mut key = first;
        loop {
            // Past the `:`.
            self.skip_spaces();
            let value = if matches!(self.peek(), None | Some(b'\n' | b'#')) {
                self.end_line()?;
                self.nested_or_null(col, true)?
            } else {
                let v = self.inline_value()?;
                self.end_line()?;
                v
            };
            entries.push((key, value));
            match self.next_line()? {
                Line::Content { indent, at } if indent == col => {
                    self.pos = at;
                    key = self
                        .key()?
                        .ok_or_else(|| self.unsupported("a line in a mapping that is no key"))?;
                }
                Line::Content { indent, .. } if indent > col => {
                    return Err(self.unsupported("a line indented into a mapping value"));
                }
                _ => break,
            }
        }
        no_duplicates(&entries).map_err(|()| self.unsupported("a duplicate key"))?;
        Ok(Node::Map(entries))
    }

    /// A block mapping key at `pos`, moving past its `:`; `None` (not
    /// moving) when the line holds no key.
    fn key(&mut self) -> Result<Option<Scalar<'a>>> {
        let start = self.pos;
        let key = match self.peek() {
            Some(q @ (b'"' | b'\'')) => {
                let k = self.quoted(q)?;
                self.skip_spaces();
                k
            }
            Some(c) if starts_plain(c, self.at(self.pos + 1)) => {
                // Up to the first `: ` (or `:` at the line's end), unless a
                // comment begins first.
                let mut i = self.pos;
                loop {
                    i = self.skip_to(i, &BLOCK_STOP);
                    match self.at(i) {
                        None | Some(b'\n') => return Ok(None),
                        Some(b':') if self.blank_at(i + 1) => break,
                        Some(b'#') if self.b[i - 1] == b' ' => return Ok(None),
                        _ => i += 1,
                    }
                }
                let text = self.s[self.pos..i].trim_end_matches(' ');
                self.pos = i;
                Scalar::plain(text)
            }
            _ => return Ok(None),
        };
        if self.peek() == Some(b':') && self.blank_at(self.pos + 1) {
            self.pos += 1;
            Ok(Some(key))
        } else {
            self.pos = start;
            Ok(None)
        }
    }

    /// A value that starts and ends on this line, in block context.
    fn inline_value(&mut self) -> Result<Node<'a>> {
        match self.peek() {
            Some(b'[' | b'{') => self.flow_node(),
            Some(q @ (b'"' | b'\'')) => Ok(Node::Scalar(self.quoted(q)?)),
            Some(c) if starts_plain(c, self.at(self.pos + 1)) => {
                let mut i = self.pos;
                loop {
                    i = self.skip_to(i, &BLOCK_STOP);
                    match self.at(i) {
                        None | Some(b'\n') => break,
                        Some(b'#') if self.b[i - 1] == b' ' => break,
                        Some(b':') if self.blank_at(i + 1) => {
                            return Err(self.unsupported("a mapping inside a value"));
                        }
                        _ => i += 1,
                    }
                }
                let text = self.s[self.pos..i].trim_end_matches(' ');
                self.pos += text.len();
                Ok(Node::Scalar(Scalar::plain(text)))
            }
            _ => Err(self.unsupported("an anchor, alias, tag, block scalar or other indicator")),
        }
    }

    /// `[..]` or `{..}` or a scalar inside them; all on one line.
    fn flow_node(&mut self) -> Result<Node<'a>> {
        self.skip_spaces();
        match self.peek() {
            Some(b'[') => {
                self.enter()?;
                self.pos += 1;
                let mut items = Vec::with_capacity(2);
                while !self.flow_close(b']')? {
                    items.push(self.flow_node()?);
                    self.skip_spaces();
                    if self.peek() == Some(b':') {
                        return Err(self.unsupported("a mapping inside a flow sequence"));
                    }
                    self.flow_comma(b']')?;
                }
                self.depth -= 1;
                Ok(Node::Seq(items))
            }
            Some(b'{') => {
                self.enter()?;
                self.pos += 1;
                let mut entries = Vec::with_capacity(4);
                while !self.flow_close(b'}')? {
                    let key = match self.flow_node()? {
                        Node::Scalar(k) => k,
                        _ => return Err(self.unsupported("a collection as a key")),
                    };
                    self.skip_spaces();
                    if self.peek() != Some(b':') {
                        return Err(self.unsupported("a flow mapping key without a value"));
                    }
                    self.pos += 1;
                    // `{"a":1}` is JSON and YAML; `{a:1}` is the key `a:1`,
                    // which the scalar above has already taken whole. After
                    // a plain key the value must be set apart by a space:
                    // in `{a :[b]}` YAML 1.2 reads `:` as an empty value
                    // and the `[b]` after it as an error (rule 147).
                    if key.plain && !self.blank_at(self.pos) {
                        return Err(self.unsupported("a value against the `:` of a plain key"));
                    }
                    self.skip_spaces();
                    if matches!(self.peek(), Some(b',' | b'}')) {
                        return Err(self.unsupported("a flow mapping key without a value"));
                    }
                    entries.push((key, self.flow_node()?));
                    self.flow_comma(b'}')?;
                }
                self.depth -= 1;
                no_duplicates(&entries).map_err(|()| self.unsupported("a duplicate key"))?;
                Ok(Node::Map(entries))
            }
            Some(q @ (b'"' | b'\'')) => Ok(Node::Scalar(self.quoted(q)?)),
            Some(c) if starts_plain(c, self.at(self.pos + 1)) => {
                let from = self.pos;
                loop {
                    self.pos = self.skip_to(self.pos, &FLOW_STOP);
                    match self.peek() {
                        None | Some(b'\n' | b',' | b'[' | b']' | b'{' | b'}') => break,
                        Some(b':')
                            if self.blank_at(self.pos + 1)
                                || matches!(
                                    self.at(self.pos + 1),
                                    Some(b',' | b'[' | b']' | b'{' | b'}')
                                ) =>
                        {
                            break;
                        }
                        Some(b'#') if self.b[self.pos - 1] == b' ' => break,
                        _ => self.pos += 1,
                    }
                }
                let text = self.s[from..self.pos].trim_end_matches(' ');
                Ok(Node::Scalar(Scalar::plain(text)))
            }
            _ => Err(self.unsupported("an empty or indicated value in a flow collection")),
        }
    }

    /// At the closing bracket (moving past it)? A flow collection must
    /// close on its own line.
    fn flow_close(&mut self, close: u8) -> Result<bool> {
        self.skip_spaces();
        match self.peek() {
            Some(c) if c == close => {
                self.pos += 1;
                Ok(true)
            }
            None | Some(b'\n' | b'#') => {
                Err(self.unsupported("a flow collection over several lines"))
            }
            _ => Ok(false),
        }
    }

    /// After an item: a comma (a trailing one too), or the closing bracket
    /// next.
    fn flow_comma(&mut self, close: u8) -> Result<()> {
        self.skip_spaces();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(())
            }
            Some(c) if c == close => Ok(()),
            _ => Err(self.unsupported("a flow collection item without a comma")),
        }
    }

    /// A quoted scalar that ends on its line.
    fn quoted(&mut self, q: u8) -> Result<Scalar<'a>> {
        self.pos += 1;
        let from = self.pos;
        let mut owned: Option<String> = None;
        loop {
            let Some(c) = self.peek() else {
                return Err(self.unsupported("an unterminated quoted scalar"));
            };
            match c {
                b'\n' => return Err(self.unsupported("a quoted scalar over several lines")),
                c if c == q && q == b'\'' && self.at(self.pos + 1) == Some(b'\'') => {
                    owned
                        .get_or_insert_with(|| self.s[from..self.pos].to_owned())
                        .push('\'');
                    self.pos += 2;
                }
                c if c == q => {
                    let text = match owned {
                        Some(s) => Cow::Owned(s),
                        None => Cow::Borrowed(&self.s[from..self.pos]),
                    };
                    self.pos += 1;
                    return Ok(Scalar { text, plain: false });
                }
                b'\\' if q == b'"' => {
                    let s = owned.get_or_insert_with(|| self.s[from..self.pos].to_owned());
                    let (ch, len) = escape(&self.b[self.pos + 1..]).ok_or(Unsupported {
                        what: "an escape other than \\\\ \\\" \\/ \\n \\t \\r \\xXX \\uXXXX",
                        at: self.pos,
                    })?;
                    s.push(ch);
                    self.pos += 1 + len;
                }
                c => {
                    if let Some(s) = owned.as_mut() {
                        s.push(char::from(c));
                    }
                    self.pos += 1;
                }
            }
        }
    }
}

/// Whether `c` (then `next`) may begin a plain scalar.
fn starts_plain(c: u8, next: Option<u8>) -> bool {
    match c {
        b'-' | b'?' | b':' => !matches!(next, None | Some(b' ' | b'\n')),
        b' ' | b'\n' => false,
        c => !INDICATORS.contains(&c),
    }
}

/// A double-quoted escape after its `\`: the char and the bytes it took.
fn escape(b: &[u8]) -> Option<(char, usize)> {
    let hex = |n: usize| -> Option<char> {
        let digits = std::str::from_utf8(b.get(1..=n)?).ok()?;
        if !digits.bytes().all(|d| d.is_ascii_hexdigit()) {
            return None;
        }
        char::from_u32(u32::from_str_radix(digits, 16).ok()?)
    };
    Some(match *b.first()? {
        b'\\' => ('\\', 1),
        b'"' => ('"', 1),
        b'/' => ('/', 1),
        b'n' => ('\n', 1),
        b't' => ('\t', 1),
        b'r' => ('\r', 1),
        b'x' => (hex(2)?, 3),
        b'u' => (hex(4)?, 5),
        _ => return None,
    })
}

/// The full parser refuses a mapping with a key twice; so does this, by
/// leaving it to that parser.
fn no_duplicates(entries: &[(Scalar<'_>, Node<'_>)]) -> std::result::Result<(), ()> {
    if entries.len() <= 16 {
        for (i, (k, _)) in entries.iter().enumerate() {
            if entries[..i].iter().any(|(j, _)| j.text == k.text) {
                return Err(());
            }
        }
        return Ok(());
    }
    let mut keys: Vec<&str> = entries.iter().map(|(k, _)| &*k.text).collect();
    keys.sort_unstable();
    if keys.windows(2).any(|w| w[0] == w[1]) {
        return Err(());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
