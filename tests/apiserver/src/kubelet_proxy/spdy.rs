//! SPDY/3.1 as kube-apiserver speaks it to a kubelet when it translates a
//! WebSocket exec or attach (client-go's SPDY executor on moby/spdystream):
//! the frame codec, the zlib-compressed header blocks, and the client end
//! of a session. Only what that use needs: this end opens every stream,
//! never reads the server's header blocks (a SYN_REPLY carries nothing the
//! translation uses, so they are skipped undecompressed), and does no flow
//! control, as spdystream does none (its frame handler drops SETTINGS and
//! WINDOW_UPDATE as "unhandled"). Layouts: the SPDY/3 draft, sections 2.2
//! (frames) and 2.6 (control frames).
use std::io;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, FlushCompress};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The version every control frame carries.
pub const VERSION: u16 = 3;

/// The sender's half of the stream ends: DATA's FLAG_FIN and the control
/// frames' FLAG_FIN are both bit 0.
pub const FLAG_FIN: u8 = 0x01;

/// A frame's length field is 24 bits.
pub const MAX_PAYLOAD: usize = 0x00ff_ffff;

/// Stream ids, ping ids and the like are 31 bits.
const ID_MASK: u32 = 0x7fff_ffff;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// One frame. Header blocks stay compressed, as they are on the wire: a
/// block can only be decompressed in order with every earlier one of its
/// direction (one zlib stream per direction per connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        flags: u8,
        data: Bytes,
    },
    SynStream {
        stream: u32,
        associated: u32,
        /// 0 (highest) to 7.
        priority: u8,
        flags: u8,
        headers: Bytes,
    },
    SynReply {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    /// Kept whole: nothing here acts on settings.
    Settings {
        flags: u8,
        payload: Bytes,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        flags: u8,
        headers: Bytes,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    /// A control frame of another type or version, skipped by a session.
    Other {
        version: u16,
        kind: u16,
        flags: u8,
        payload: Bytes,
    },
}

/// A control frame too short for its type.
#[derive(Debug, thiserror::Error)]
#[error("malformed SPDY control frame of type {kind}: {len}-byte payload")]
pub struct Malformed {
    kind: u16,
    len: usize,
}

fn control_head(out: &mut BytesMut, version: u16, kind: u16, flags: u8, len: usize) {
    debug_assert!(len <= MAX_PAYLOAD, "SPDY payload of {len} bytes");
    out.put_u16(0x8000 | version);
    out.put_u16(kind);
    out.put_u32((u32::from(flags) << 24) | (len as u32 & 0x00ff_ffff));
}

impl Frame {
    /// Appends the frame as it goes on the wire.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Frame::Data {
                stream,
                flags,
                data,
            } => {
                debug_assert!(data.len() <= MAX_PAYLOAD);
                out.put_u32(stream & ID_MASK);
                out.put_u32((u32::from(*flags) << 24) | (data.len() as u32 & 0x00ff_ffff));
                out.put_slice(data);
            }
            Frame::SynStream {
                stream,
                associated,
                priority,
                flags,
                headers,
            } => {
                control_head(out, VERSION, SYN_STREAM, *flags, 10 + headers.len());
                out.put_u32(stream & ID_MASK);
                out.put_u32(associated & ID_MASK);
                out.put_u8(priority << 5);
                // The slot (SPDY/3's credential slot): unused, 0.
                out.put_u8(0);
                out.put_slice(headers);
            }
            Frame::SynReply {
                stream,
                flags,
                headers,
            }
            | Frame::Headers {
                stream,
                flags,
                headers,
            } => {
                let kind = if matches!(self, Frame::SynReply { .. }) {
                    SYN_REPLY
                } else {
                    HEADERS
                };
                control_head(out, VERSION, kind, *flags, 4 + headers.len());
                out.put_u32(stream & ID_MASK);
                out.put_slice(headers);
            }
            Frame::RstStream { stream, status } => {
                control_head(out, VERSION, RST_STREAM, 0, 8);
                out.put_u32(stream & ID_MASK);
                out.put_u32(*status);
            }
            Frame::Settings { flags, payload } => {
                control_head(out, VERSION, SETTINGS, *flags, payload.len());
                out.put_slice(payload);
            }
            Frame::Ping { id } => {
                control_head(out, VERSION, PING, 0, 4);
                out.put_u32(*id);
            }
            Frame::GoAway { last_good, status } => {
                control_head(out, VERSION, GOAWAY, 0, 8);
                out.put_u32(last_good & ID_MASK);
                out.put_u32(*status);
            }
            Frame::WindowUpdate { stream, delta } => {
                control_head(out, VERSION, WINDOW_UPDATE, 0, 8);
                out.put_u32(stream & ID_MASK);
                out.put_u32(delta & ID_MASK);
            }
            Frame::Other {
                version,
                kind,
                flags,
                payload,
            } => {
                control_head(out, *version, *kind, *flags, payload.len());
                out.put_slice(payload);
            }
        }
    }

    /// Takes the first frame off `buf` once it is all there.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, Malformed> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize;
        if buf.len() < 8 + len {
            return Ok(None);
        }
        let mut head = buf.split_to(8);
        let mut p = buf.split_to(len).freeze();
        let first = head.get_u32();
        let flags = head.get_u8();
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream: first & ID_MASK,
                flags,
                data: p,
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        let kind = (first & 0xffff) as u16;
        let least = match kind {
            SYN_STREAM => 10,
            SYN_REPLY | HEADERS | PING => 4,
            RST_STREAM | GOAWAY | WINDOW_UPDATE => 8,
            _ => 0,
        };
        if version == VERSION && len < least {
            return Err(Malformed { kind, len });
        }
        let frame = match (version, kind) {
            (VERSION, SYN_STREAM) => {
                let stream = p.get_u32() & ID_MASK;
                let associated = p.get_u32() & ID_MASK;
                let priority = p.get_u8() >> 5;
                let _slot = p.get_u8();
                Frame::SynStream {
                    stream,
                    associated,
                    priority,
                    flags,
                    headers: p,
                }
            }
            (VERSION, SYN_REPLY) => Frame::SynReply {
                stream: p.get_u32() & ID_MASK,
                flags,
                headers: p,
            },
            (VERSION, HEADERS) => Frame::Headers {
                stream: p.get_u32() & ID_MASK,
                flags,
                headers: p,
            },
            (VERSION, RST_STREAM) => Frame::RstStream {
                stream: p.get_u32() & ID_MASK,
                status: p.get_u32(),
            },
            (VERSION, SETTINGS) => Frame::Settings { flags, payload: p },
            (VERSION, PING) => Frame::Ping { id: p.get_u32() },
            (VERSION, GOAWAY) => Frame::GoAway {
                last_good: p.get_u32() & ID_MASK,
                status: p.get_u32(),
            },
            (VERSION, WINDOW_UPDATE) => Frame::WindowUpdate {
                stream: p.get_u32() & ID_MASK,
                delta: p.get_u32() & ID_MASK,
            },
            _ => Frame::Other {
                version,
                kind,
                flags,
                payload: p,
            },
        };
        Ok(Some(frame))
    }
}

/// A header block before compression (SPDY/3: a 32-bit count, then each
/// name and value with a 32-bit length). Names are lowercase on the wire;
/// spdystream's reader flags others as an error.
pub fn header_block(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut raw = Vec::new();
    raw.put_u32(headers.len() as u32);
    for (name, value) in headers {
        raw.put_u32(name.len() as u32);
        raw.put_slice(name.to_ascii_lowercase().as_bytes());
        raw.put_u32(value.len() as u32);
        raw.put_slice(value.as_bytes());
    }
    raw
}

/// One direction's header compression: a single zlib stream for the whole
/// connection, sync-flushed after each block so the peer can decode the
/// block from that frame's bytes alone. No preset dictionary: SPDY's is an
/// optimisation, and Go's `zlib.NewReaderDict` (spdystream's reader) uses
/// the dictionary only when the stream header's FDICT bit says the writer
/// did, which here it does not.
pub struct HeaderCompressor(Compress);

impl Default for HeaderCompressor {
    fn default() -> Self {
        HeaderCompressor(Compress::new(Compression::default(), true))
    }
}

impl HeaderCompressor {
    /// The compressed block for `headers`.
    pub fn block(&mut self, headers: &[(&str, &str)]) -> io::Result<Bytes> {
        let raw = header_block(headers);
        let start = self.0.total_in();
        let mut out = Vec::with_capacity(raw.len() + 64);
        loop {
            let done = (self.0.total_in() - start) as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(raw.len().max(256));
            }
            self.0
                .compress_vec(&raw[done..], &mut out, FlushCompress::Sync)
                .map_err(io::Error::other)?;
            // The flush is complete once all the input is in and the
            // output did not fill the room it had.
            if (self.0.total_in() - start) as usize == raw.len() && out.len() < out.capacity() {
                return Ok(out.into());
            }
        }
    }
}

/// spdystream answers a PING whose id has the other end's parity and takes
/// one with its own as the answer to its ping. This end is the client (odd
/// ids) and sends no pings, so it echoes the server's, whose ids are even.
pub fn ping_reply(frame: &Frame) -> Option<Frame> {
    match frame {
        Frame::Ping { id } if id % 2 == 0 => Some(Frame::Ping { id: *id }),
        _ => None,
    }
}

/// The sending half of the client end of a session.
pub struct Writer<W> {
    io: W,
    headers: HeaderCompressor,
    next_stream: u32,
    buf: BytesMut,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub fn new(io: W) -> Self {
        Writer {
            io,
            headers: HeaderCompressor::default(),
            // A client's streams are odd, in increasing order.
            next_stream: 1,
            buf: BytesMut::new(),
        }
    }

    /// Opens the next stream with these headers (a SYN_STREAM, priority 0,
    /// not half-closed); its id. The reply is not waited for: spdystream
    /// sends it from the handler of the SYN_STREAM before it takes the
    /// stream's next frame, so data may follow at once.
    pub async fn open(&mut self, headers: &[(&str, &str)]) -> io::Result<u32> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let headers = self.headers.block(headers)?;
        self.send(&Frame::SynStream {
            stream,
            associated: 0,
            priority: 0,
            flags: 0,
            headers,
        })
        .await?;
        Ok(stream)
    }

    /// `data` on `stream`, in as many frames as the length field needs;
    /// `fin` ends this side of the stream (an empty frame when there is no
    /// data, as spdystream's Close sends).
    pub async fn data(&mut self, stream: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut chunks = data.chunks(MAX_PAYLOAD).peekable();
        if chunks.peek().is_none() {
            return self.data_frame(stream, &[], fin).await;
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            self.data_frame(stream, chunk, fin && last).await?;
        }
        Ok(())
    }

    async fn data_frame(&mut self, stream: u32, data: &[u8], fin: bool) -> io::Result<()> {
        self.buf.clear();
        self.buf.put_u32(stream & ID_MASK);
        let flags = if fin { FLAG_FIN } else { 0 };
        self.buf
            .put_u32((u32::from(flags) << 24) | data.len() as u32);
        self.buf.put_slice(data);
        self.flush_buf().await
    }

    /// Any frame. Each goes out in one write: spdystream's header
    /// decompressor must find a whole block in what it reads.
    pub async fn send(&mut self, frame: &Frame) -> io::Result<()> {
        self.buf.clear();
        frame.encode(&mut self.buf);
        self.flush_buf().await
    }

    async fn flush_buf(&mut self) -> io::Result<()> {
        self.io.write_all(&self.buf).await?;
        self.io.flush().await
    }
}

/// The receiving half of a session.
pub struct Reader<R> {
    io: R,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub fn new(io: R) -> Self {
        Reader {
            io,
            buf: BytesMut::new(),
        }
    }

    /// The next frame; None when the connection ends between frames.
    pub async fn next(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if let Some(frame) = Frame::decode(&mut self.buf).map_err(io::Error::other)? {
                return Ok(Some(frame));
            }
            self.buf.reserve(16 * 1024);
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "SPDY connection closed inside a frame",
                    ))
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use flate2::{Decompress, FlushDecompress};

    use super::*;

    fn round_trip(frame: Frame) {
        let mut wire = BytesMut::new();
        frame.encode(&mut wire);
        // Nothing until the last byte is there.
        let mut partial = BytesMut::from(&wire[..wire.len() - 1]);
        assert_eq!(Frame::decode(&mut partial).unwrap(), None);
        wire.extend_from_slice(b"next");
        assert_eq!(Frame::decode(&mut wire).unwrap(), Some(frame));
        assert_eq!(&wire[..], b"next", "the next frame's bytes stay");
    }

    #[test]
    fn frames_round_trip() {
        let block = Bytes::from_static(b"\x78\x9c compressed");
        for frame in [
            Frame::Data {
                stream: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream: 0x7fff_fffd,
                flags: 0,
                data: Bytes::new(),
            },
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 7,
                flags: FLAG_FIN,
                headers: block.clone(),
            },
            Frame::SynReply {
                stream: 1,
                flags: 0,
                headers: block.clone(),
            },
            Frame::Headers {
                stream: 5,
                flags: FLAG_FIN,
                headers: block,
            },
            Frame::RstStream {
                stream: 7,
                status: 5,
            },
            Frame::Settings {
                flags: 1,
                payload: Bytes::from_static(&[0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 100]),
            },
            Frame::Ping { id: 2 },
            Frame::GoAway {
                last_good: 9,
                status: 0,
            },
            Frame::WindowUpdate {
                stream: 1,
                delta: 65536,
            },
            Frame::Other {
                version: 2,
                kind: 1,
                flags: 0,
                payload: Bytes::from_static(b"old"),
            },
            Frame::Other {
                version: 3,
                kind: 10,
                flags: 0,
                payload: Bytes::new(),
            },
        ] {
            round_trip(frame);
        }
    }

    #[test]
    fn the_wire_layout_is_spdy3s() {
        let mut wire = BytesMut::new();
        Frame::RstStream {
            stream: 3,
            status: 5,
        }
        .encode(&mut wire);
        assert_eq!(
            &wire[..],
            [0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 3, 0, 0, 0, 5]
        );
        wire.clear();
        Frame::Data {
            stream: 1,
            flags: FLAG_FIN,
            data: Bytes::from_static(b"ab"),
        }
        .encode(&mut wire);
        assert_eq!(&wire[..], [0, 0, 0, 1, 1, 0, 0, 2, b'a', b'b']);
        // A control frame too short for its type.
        let mut short = BytesMut::from(&[0x80, 3, 0, 6, 0, 0, 0, 2, 0, 1][..]);
        assert!(Frame::decode(&mut short).is_err());
    }

    /// Reads one block back: count, then length-prefixed names and values.
    fn parse_block(mut raw: &[u8]) -> Vec<(String, String)> {
        let n = raw.get_u32();
        let mut out = Vec::new();
        for _ in 0..n {
            let mut take = || {
                let len = raw.get_u32() as usize;
                let s = String::from_utf8(raw[..len].to_vec()).unwrap();
                raw.advance(len);
                s
            };
            let name = take();
            out.push((name, take()));
        }
        assert!(raw.is_empty(), "trailing bytes in the block");
        out
    }

    #[test]
    fn header_blocks_decompress_frame_by_frame_from_one_zlib_stream() {
        let mut c = HeaderCompressor::default();
        let first = c.block(&[("streamType", "error")]).unwrap();
        let second = c.block(&[("streamtype", "stdout")]).unwrap();
        let third = c.block(&[]).unwrap();
        // A zlib header without FDICT: no preset dictionary to agree on.
        assert_eq!(first[0] & 0x0f, 8, "deflate");
        assert_eq!(first[1] & 0x20, 0, "FDICT");
        assert_eq!((u16::from(first[0]) << 8 | u16::from(first[1])) % 31, 0);
        // Sync-flushed: each block ends on the empty stored block.
        assert!(first.ends_with(&[0, 0, 0xff, 0xff]));

        let mut d = Decompress::new(true);
        let mut read = |block: &[u8]| {
            let mut out = Vec::with_capacity(1024);
            let before = d.total_in();
            d.decompress_vec(block, &mut out, FlushDecompress::Sync)
                .unwrap();
            assert_eq!((d.total_in() - before) as usize, block.len());
            parse_block(&out)
        };
        let pair = |n: &str, v: &str| vec![(n.to_string(), v.to_string())];
        assert_eq!(read(&first), pair("streamtype", "error"));
        assert_eq!(read(&second), pair("streamtype", "stdout"));
        assert!(read(&third).is_empty());
    }

    #[test]
    fn a_big_block_compresses_whole() {
        let value = "x".repeat(100_000);
        let mut c = HeaderCompressor::default();
        let block = c.block(&[("big", &value)]).unwrap();
        let mut out = Vec::with_capacity(200_000);
        Decompress::new(true)
            .decompress_vec(&block, &mut out, FlushDecompress::Sync)
            .unwrap();
        assert_eq!(parse_block(&out), vec![("big".to_string(), value)]);
    }

    #[test]
    fn pings_from_the_server_are_echoed_ours_are_not() {
        assert_eq!(
            ping_reply(&Frame::Ping { id: 2 }),
            Some(Frame::Ping { id: 2 })
        );
        assert_eq!(ping_reply(&Frame::Ping { id: 1 }), None);
        assert_eq!(
            ping_reply(&Frame::GoAway {
                last_good: 0,
                status: 0
            }),
            None
        );
    }

    #[tokio::test]
    async fn a_session_opens_odd_streams_and_sends_data_with_fin() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (_, w) = tokio::io::split(client);
        let mut writer = Writer::new(w);
        assert_eq!(writer.open(&[("streamtype", "error")]).await.unwrap(), 1);
        assert_eq!(writer.open(&[("streamtype", "stdin")]).await.unwrap(), 3);
        writer.data(3, b"in", false).await.unwrap();
        writer.data(3, b"", true).await.unwrap();
        writer.send(&Frame::Ping { id: 2 }).await.unwrap();
        drop(writer);

        let (r, _) = tokio::io::split(server);
        let mut reader = Reader::new(r);
        let mut frames = Vec::new();
        while let Some(f) = reader.next().await.unwrap() {
            frames.push(f);
        }
        let ids: Vec<u32> = frames
            .iter()
            .filter_map(|f| match f {
                Frame::SynStream { stream, .. } => Some(*stream),
                _ => None,
            })
            .collect();
        assert_eq!(ids, [1, 3]);
        assert_eq!(
            frames[2..],
            [
                Frame::Data {
                    stream: 3,
                    flags: 0,
                    data: Bytes::from_static(b"in")
                },
                Frame::Data {
                    stream: 3,
                    flags: FLAG_FIN,
                    data: Bytes::new()
                },
                Frame::Ping { id: 2 },
            ]
        );
    }

    #[tokio::test]
    async fn a_frame_cut_short_is_an_error() {
        let (mut client, server) = tokio::io::duplex(64);
        client
            .write_all(&[0, 0, 0, 1, 0, 0, 0, 9, b'x'])
            .await
            .unwrap();
        drop(client);
        let mut reader = Reader::new(server);
        let e = reader.next().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
