//! A reader for the YAML that tools write, fifteen times faster than the
//! full parser.
//!
//! At 100k Services the manifests mode spent most of its cold start in the
//! YAML parser: serde-saphyr reads about 7 MB/s here, and the bench's
//! 100k files hold 260 MB. `kubectl get -o yaml`, `helm template` and
//! hand-written manifests use a small part of YAML: block mappings and
//! sequences, one-line flow collections, and one-line scalars. This reads
//! exactly that part, straight into the types serde asks for ([`de`]): no
//! tree of the document is built first (at 100k files, building one and
//! walking it again was a third of the parse).
//!
//! It is a filter, never a second opinion: anything outside that part
//! (anchors, tags, block scalars, multi-line scalars, explicit keys, tabs,
//! non-ASCII text, `\r`, directives, duplicate keys, any plain scalar whose
//! type YAML resolves in more than one way) gives up ([`GiveUp`]), and the
//! caller parses the file with serde-saphyr as before. What was read of the
//! file until then is dropped with it. So the full parser
//! still decides every file this cannot read, with its budgets against
//! alias bombs and its error messages; and where this reads a file, it must
//! read what the full parser reads. The tests and the `manifest_yaml` fuzz
//! target hold it to that.
mod de;
mod scalar;

use std::borrow::Cow;

/// Nesting beyond this goes to the full parser, which has its own budget;
/// the recursion here stays far from the stack's end.
const MAX_DEPTH: u32 = 64;

#[derive(Clone, Debug, PartialEq)]
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

/// Why the lite reader left a text to the full parser: YAML it does not
/// read, or a value whose type it does not settle. Never shown: the full
/// parser reports whatever it finds.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum GiveUp {
    Unsupported(Unsupported),
    Type(String),
}

impl From<Unsupported> for GiveUp {
    fn from(u: Unsupported) -> Self {
        Self::Unsupported(u)
    }
}

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsupported(u) => write!(f, "{} at byte {}", u.what, u.at),
            Self::Type(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for GiveUp {}

impl serde::de::Error for GiveUp {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Self::Type(msg.to_string())
    }
}

fn give_up<T>(why: &str) -> std::result::Result<T, GiveUp> {
    Err(GiveUp::Type(why.to_owned()))
}

/// The stream's documents, each read as a `T`, without the empty ones (the
/// full parser skips those too, and numbers the rest from 0).
pub(super) fn documents<'a, T: serde::Deserialize<'a>>(
    text: &'a str,
) -> std::result::Result<Vec<T>, GiveUp> {
    // One pass settles what the rest need not check: printable ASCII and
    // newlines only, so every byte is a char and no tab can hide in an
    // indent.
    if let Some(at) = first_unprintable(text.as_bytes()) {
        return Err(Unsupported {
            what: "a byte other than printable ASCII or a newline",
            at,
        }
        .into());
    }
    let mut r = Reader {
        s: text,
        b: text.as_bytes(),
        pos: 0,
        depth: 0,
        keys: Vec::new(),
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
                    return Err(r.unsupported("a second node in one document").into());
                }
                r.pos = at;
                docs.push(T::deserialize(de::open(&mut r, de::At::Block(indent))?)?);
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
    /// The keys of the mappings open now, outermost first: one buffer for
    /// the file, where each mapping holding its own cost an allocation.
    keys: Vec<Cow<'a, str>>,
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

    /// A scalar that starts and ends on this line, in block context.
    fn inline_scalar(&mut self) -> Result<Scalar<'a>> {
        match self.peek() {
            Some(q @ (b'"' | b'\'')) => self.quoted(q),
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
                Ok(Scalar::plain(text))
            }
            _ => Err(self.unsupported("an anchor, alias, tag, block scalar or other indicator")),
        }
    }

    /// A scalar inside a flow collection, at `pos` (spaces skipped).
    fn flow_scalar(&mut self) -> Result<Scalar<'a>> {
        match self.peek() {
            Some(q @ (b'"' | b'\'')) => self.quoted(q),
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
                Ok(Scalar::plain(text))
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

#[cfg(test)]
mod tests;
